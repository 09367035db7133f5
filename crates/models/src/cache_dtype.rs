//! `--kv-cache-dtype`, the flag's values as vLLM spells them, and the KV element type each
//! one stores.

use tokenmill_kernels::KvCacheDType;

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
