//! Engine configuration: what `serve` and `generate` flags turn into.

use std::path::PathBuf;
use std::time::Duration;

use tokenmill_core::SchedulingPolicy;
use tokenmill_models::KvCacheDType;

/// How much memory the KV cache gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvCacheSizing {
    /// An explicit budget in bytes (`--kv-cache-memory`).
    Bytes(u64),
    /// A fraction of the memory available at start-up (the CPU default).
    FractionOfAvailable(f64),
}

/// Default KV budget when none is given: a quarter of available RAM, capped at 4 GiB
/// (vLLM's CPU backend defaults to a fixed 4 GiB `VLLM_CPU_KVCACHE_SPACE`).
pub const DEFAULT_KV_FRACTION: f64 = 0.25;
pub const DEFAULT_KV_CAP_BYTES: u64 = 4 << 30;

/// `--kv-cache-dtype`: the element type of the paged KV cache, with vLLM's names. fp8 uses a
/// per-tensor scale of 1.0 (vLLM's default without calibrated scales) and saturates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheDtype {
    /// The model's activation type: f32 on this backend.
    #[default]
    Auto,
    /// IEEE half precision; a tokenmill extension (llama.cpp's default KV type), also
    /// accepted as `fp16` and `half`.
    Float16,
    BFloat16,
    /// vLLM's `fp8`: E4M3.
    Fp8,
    Fp8E4m3,
    Fp8E5m2,
}

/// Why a `--kv-cache-dtype` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheDtypeError {
    #[error(
        "kv cache dtype '{0}' is not supported by this backend (tokenmill's CPU attention has \
         no {0} kernels); use one of: {supported}",
        supported = CacheDtype::SUPPORTED
    )]
    Unsupported(String),
    #[error("unknown kv cache dtype '{0}'; use one of: {supported}", supported = CacheDtype::SUPPORTED)]
    Unknown(String),
}

impl CacheDtype {
    /// The accepted values, for messages.
    pub const SUPPORTED: &'static str =
        "auto, float16 (fp16, half), bfloat16, fp8, fp8_e4m3, fp8_e5m2";

    /// The value as vLLM spells it (what `vllm:cache_config_info` reports).
    pub fn as_str(self) -> &'static str {
        match self {
            CacheDtype::Auto => "auto",
            CacheDtype::Float16 => "float16",
            CacheDtype::BFloat16 => "bfloat16",
            CacheDtype::Fp8 => "fp8",
            CacheDtype::Fp8E4m3 => "fp8_e4m3",
            CacheDtype::Fp8E5m2 => "fp8_e5m2",
        }
    }

    /// The element type the cache is stored in.
    pub fn storage(self) -> KvCacheDType {
        match self {
            CacheDtype::Auto => KvCacheDType::F32,
            CacheDtype::Float16 => KvCacheDType::F16,
            CacheDtype::BFloat16 => KvCacheDType::BF16,
            CacheDtype::Fp8 | CacheDtype::Fp8E4m3 => KvCacheDType::Fp8E4m3,
            CacheDtype::Fp8E5m2 => KvCacheDType::Fp8E5m2,
        }
    }
}

impl std::fmt::Display for CacheDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CacheDtype {
    type Err = CacheDtypeError;

    fn from_str(text: &str) -> Result<CacheDtype, CacheDtypeError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(CacheDtype::Auto),
            "float16" | "fp16" | "half" => Ok(CacheDtype::Float16),
            "bfloat16" => Ok(CacheDtype::BFloat16),
            "fp8" => Ok(CacheDtype::Fp8),
            "fp8_e4m3" => Ok(CacheDtype::Fp8E4m3),
            "fp8_e5m2" => Ok(CacheDtype::Fp8E5m2),
            "fp8_inc" | "fp8_ds_mla" => Err(CacheDtypeError::Unsupported(text.trim().into())),
            _ => Err(CacheDtypeError::Unknown(text.trim().into())),
        }
    }
}

/// Everything the engine is built from.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// A resolved model file or directory (see `tokenmill_models::resolve_model`).
    pub model_path: PathBuf,
    /// A chat template overriding the model's (file path or inline template).
    pub chat_template: Option<String>,
    /// Compute threads; `None` = all cores.
    pub num_threads: Option<usize>,
    pub kv_cache: KvCacheSizing,
    /// Element type of the KV cache (`--kv-cache-dtype`).
    pub kv_cache_dtype: CacheDtype,
    pub block_size: usize,
    /// `None` = the model's context length, capped by what the KV pool holds.
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub enable_prefix_caching: bool,
    pub scheduling_policy: SchedulingPolicy,
    /// The `model_name` label of the engine's metrics (the first served name).
    pub served_model_name: String,
    /// Period of the `Engine 000: ...` stats line; `None` turns it off.
    pub log_stats_interval: Option<Duration>,
    /// OTLP/HTTP collector for one span per request (`--otlp-traces-endpoint`); `None` = no
    /// tracing, no export thread.
    pub otlp_traces_endpoint: Option<String>,
}

impl EngineConfig {
    /// CPU-tuned defaults for `model_path`.
    pub fn new(model_path: PathBuf) -> EngineConfig {
        EngineConfig {
            model_path,
            chat_template: None,
            num_threads: None,
            kv_cache: KvCacheSizing::FractionOfAvailable(DEFAULT_KV_FRACTION),
            kv_cache_dtype: CacheDtype::Auto,
            block_size: 16,
            max_model_len: None,
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            enable_prefix_caching: true,
            scheduling_policy: SchedulingPolicy::Fcfs,
            served_model_name: "tokenmill".into(),
            log_stats_interval: Some(Duration::from_secs(10)),
            otlp_traces_endpoint: None,
        }
    }

    /// The KV budget in bytes, reading available memory when sized by fraction.
    pub fn kv_cache_bytes(&self) -> u64 {
        match self.kv_cache {
            KvCacheSizing::Bytes(bytes) => bytes,
            KvCacheSizing::FractionOfAvailable(fraction) => {
                let available = available_memory_bytes().unwrap_or(8 << 30);
                ((available as f64 * fraction) as u64).min(DEFAULT_KV_CAP_BYTES)
            }
        }
    }
}

/// `MemAvailable` from /proc/meminfo, when there is one.
fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dtypes_parse_with_vllm_names() {
        for dtype in [
            CacheDtype::Auto,
            CacheDtype::Float16,
            CacheDtype::BFloat16,
            CacheDtype::Fp8,
            CacheDtype::Fp8E4m3,
            CacheDtype::Fp8E5m2,
        ] {
            assert_eq!(dtype.as_str().parse::<CacheDtype>(), Ok(dtype));
        }
        assert_eq!("fp16".parse::<CacheDtype>(), Ok(CacheDtype::Float16));
        assert_eq!("half".parse::<CacheDtype>(), Ok(CacheDtype::Float16));
        assert_eq!(CacheDtype::Auto.storage(), KvCacheDType::F32);
        assert_eq!(CacheDtype::Fp8.storage(), KvCacheDType::Fp8E4m3);
        assert_eq!(CacheDtype::default(), CacheDtype::Auto);
        let error = "fp8_inc".parse::<CacheDtype>().unwrap_err().to_string();
        assert!(error.contains("not supported by this backend"), "{error}");
        assert!(matches!(
            "fp8_ds_mla".parse::<CacheDtype>(),
            Err(CacheDtypeError::Unsupported(_))
        ));
        let error = "int4".parse::<CacheDtype>().unwrap_err().to_string();
        assert!(error.contains("unknown kv cache dtype 'int4'"), "{error}");
    }
}
