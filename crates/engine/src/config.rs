//! Engine configuration: what `serve` and `generate` flags turn into.

use std::path::PathBuf;
use std::time::Duration;

use tokenmill_core::SchedulingPolicy;
use tokenmill_models::{CacheDtype, JsonGrammarOptions, KvCacheDType, ModelDtype, ModelSource};

use crate::EngineError;

use crate::spec::SpeculativeConfig;

use crate::kv_events::KvEventsConfig;

use crate::lora::LoraConfig;

/// How much memory the KV cache gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvCacheSizing {
    /// An explicit budget in bytes (`--kv-cache-memory`).
    Bytes(u64),
    /// A fraction of the memory available at start-up (the CPU default).
    FractionOfAvailable(f64),
    /// vLLM's `--gpu-memory-utilization`: this fraction of the memory available before the
    /// model loads holds weights and KV cache; the KV cache gets what the weights leave.
    UtilizationOfAvailable(f64),
}

/// Default KV budget when none is given: a quarter of available RAM, capped at 4 GiB
/// (vLLM's CPU backend defaults to a fixed 4 GiB `VLLM_CPU_KVCACHE_SPACE`).
pub const DEFAULT_KV_FRACTION: f64 = 0.25;
pub const DEFAULT_KV_CAP_BYTES: u64 = 4 << 30;

/// Everything the engine is built from.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The resolved model (see `tokenmill_models::resolve_model`, or
    /// `ModelSource::from_path` for a known local path).
    pub model: ModelSource,
    /// A chat template overriding the model's (file path or inline template).
    pub chat_template: Option<String>,
    /// An HF tokenizer directory or `tokenizer.json` replacing the model's tokenizer
    /// (`--tokenizer`).
    pub tokenizer: Option<PathBuf>,
    /// Seeds requests without a `seed`, in arrival order (`--seed`); `None` = fresh entropy.
    pub seed: Option<u64>,
    /// Compute threads; `None` = all cores.
    pub num_threads: Option<usize>,
    pub kv_cache: KvCacheSizing,
    /// Element type of the KV cache (`--kv-cache-dtype`).
    pub kv_cache_dtype: CacheDtype,
    /// The model dtype (`--dtype`): what `kv_cache_dtype` `auto` stores
    /// ([`ModelDtype::auto_kv_storage`]).
    pub dtype: ModelDtype,
    pub block_size: usize,
    /// `None` = the model's context length, capped by what the KV pool holds.
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    /// Token budget of one step; `None` = 512 with chunked prefill, else vLLM's
    /// `max(max_model_len, 2048)` so that a whole prompt fits.
    pub max_num_batched_tokens: Option<usize>,
    /// `--enable-chunked-prefill` (default) / `--no-enable-chunked-prefill`.
    pub enable_chunked_prefill: bool,
    pub enable_prefix_caching: bool,
    /// vLLM's `--disable-hybrid-kv-cache-manager`: sliding-window layers keep every KV block
    /// as full-attention layers do. Off (the default), a model whose every layer has a sliding
    /// window releases the blocks before the window; hybrid models (Gemma 3's local and global
    /// layers) keep every block either way.
    pub disable_hybrid_kv_cache_manager: bool,
    pub scheduling_policy: SchedulingPolicy,
    /// The `model_name` label of the engine's metrics (the first served name).
    pub served_model_name: String,
    /// Period of the `Engine 000: ...` stats line; `None` turns it off.
    pub log_stats_interval: Option<Duration>,
    /// OTLP/HTTP collector for one span per request (`--otlp-traces-endpoint`); `None` = no
    /// tracing, no export thread.
    pub otlp_traces_endpoint: Option<String>,
    /// How JSON-schema constraints compile (`--structured-outputs-config`'s
    /// `disable_any_whitespace`, `disable_additional_properties`).
    pub json_grammar: JsonGrammarOptions,
    /// `--speculative-config`; `None` = no speculative decoding.
    pub speculative: Option<SpeculativeConfig>,
    /// `--kv-events-config`; `None` (or events not published) records no events at all.
    pub kv_events: Option<KvEventsConfig>,
    /// `--enable-lora` with its limits and start-up adapters; `None`: requests cannot name
    /// adapters.
    pub lora: Option<LoraConfig>,
    /// `--data-parallel-size`: engine cores in this process, each with its own scheduler,
    /// KV cache of the full `kv_cache` budget, and `num_threads / N` threads (see `dp`).
    pub data_parallel_size: usize,
    /// `--cpu-affinity`: one CPU set per engine (empty: no pinning); with no `num_threads`,
    /// an engine runs one thread per CPU of its set.
    pub cpu_affinity: Vec<Vec<usize>>,
}

/// Step token budget with chunked prefill when none is given.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 512;

impl EngineConfig {
    /// CPU-tuned defaults for `model`.
    pub fn new(model: ModelSource) -> EngineConfig {
        EngineConfig {
            model,
            chat_template: None,
            tokenizer: None,
            seed: None,
            num_threads: None,
            kv_cache: KvCacheSizing::FractionOfAvailable(DEFAULT_KV_FRACTION),
            kv_cache_dtype: CacheDtype::Auto,
            dtype: ModelDtype::Auto,
            block_size: 16,
            max_model_len: None,
            max_num_seqs: 64,
            max_num_batched_tokens: None,
            enable_chunked_prefill: true,
            enable_prefix_caching: true,
            disable_hybrid_kv_cache_manager: false,
            scheduling_policy: SchedulingPolicy::Fcfs,
            served_model_name: "tokenmill".into(),
            log_stats_interval: Some(Duration::from_secs(10)),
            otlp_traces_endpoint: None,
            json_grammar: JsonGrammarOptions::default(),
            speculative: None,
            kv_events: None,
            lora: None,
            data_parallel_size: 1,
            cpu_affinity: Vec::new(),
        }
    }

    /// The element type the KV cache is stored in: `kv_cache_dtype`, with `auto` resolved for
    /// `model` under `dtype` (reads an HF directory's `config.json`).
    pub fn kv_storage(&self) -> Result<KvCacheDType, EngineError> {
        Ok(self.kv_cache_dtype.storage_for(self.dtype, &self.model)?)
    }

    /// The KV budget in bytes. `available_before_load` is the memory that was available before
    /// the weights (`weight_bytes`) were loaded; a plain fraction reads available memory now.
    pub fn kv_cache_bytes(&self, available_before_load: Option<u64>, weight_bytes: u64) -> u64 {
        match self.kv_cache {
            KvCacheSizing::Bytes(bytes) => bytes,
            KvCacheSizing::FractionOfAvailable(fraction) => {
                let available = available_memory_bytes().unwrap_or(FALLBACK_AVAILABLE_BYTES);
                ((available as f64 * fraction) as u64).min(DEFAULT_KV_CAP_BYTES)
            }
            KvCacheSizing::UtilizationOfAvailable(fraction) => {
                let available = available_before_load.unwrap_or(FALLBACK_AVAILABLE_BYTES);
                ((available as f64 * fraction) as u64).saturating_sub(weight_bytes)
            }
        }
    }
}

/// Assumed available memory where /proc/meminfo cannot be read.
const FALLBACK_AVAILABLE_BYTES: u64 = 8 << 30;

/// `MemAvailable` from /proc/meminfo, when there is one.
pub(crate) fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_memory_utilization_leaves_the_kv_cache_what_the_weights_do_not_take() {
        let mut config = EngineConfig::new(ModelSource::Gguf("m.gguf".into()));
        config.kv_cache = KvCacheSizing::UtilizationOfAvailable(0.5);
        assert_eq!(config.kv_cache_bytes(Some(10 << 30), 1 << 30), 4 << 30);
        assert_eq!(
            config.kv_cache_bytes(Some(1 << 30), 1 << 30),
            0,
            "weights take it all"
        );
        config.kv_cache = KvCacheSizing::Bytes(123);
        assert_eq!(config.kv_cache_bytes(Some(10 << 30), 1 << 30), 123);
    }
}
