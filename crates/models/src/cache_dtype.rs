//! `--kv-cache-dtype`, the flag's values as vLLM spells them, and the KV element type each
//! one stores; `--dtype`, the model type `auto` follows.
//!
//! vLLM's `auto` KV type is the model's dtype, and its `--dtype auto` is "FP16 precision for
//! FP32 and FP16 models, and BF16 precision for BF16 models". tokenmill computes in f32 and
//! keeps weights in their file types whatever `--dtype` says, so `--dtype` decides only what
//! `--kv-cache-dtype auto` stores ([`ModelDtype::auto_kv_storage`]):
//!
//! - `--dtype auto` (the default): bf16 for an HF checkpoint whose `config.json` declares
//!   `torch_dtype` (or `dtype`) `bfloat16`, f16 for every other HF checkpoint and for every
//!   GGUF file (llama.cpp's own default K/V type, whatever the weights' type);
//! - `--dtype half`/`float16`: f16; `--dtype bfloat16`: bf16; `--dtype float32`/`float`: f32.
//!
//! An explicit `--kv-cache-dtype` (`float32` included, a tokenmill extension) overrides it.

use std::path::Path;

use tokenmill_kernels::KvCacheDType;

use crate::error::io_error;
use crate::{ModelError, ModelSource, Result};

/// `--kv-cache-dtype`: the element type of the paged KV cache, with vLLM's names. fp8 uses a
/// per-tensor scale of 1.0 (vLLM's default without calibrated scales) and saturates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheDtype {
    /// The model's dtype ([`ModelDtype::auto_kv_storage`]): 16-bit unless `--dtype float32`.
    #[default]
    Auto,
    /// IEEE single precision, the activations' own type; a tokenmill extension, also
    /// accepted as `fp32` and `float`.
    Float32,
    /// IEEE half precision; a tokenmill extension (llama.cpp's default KV type), also
    /// accepted as `fp16` and `half`.
    Float16,
    BFloat16,
    /// vLLM's `fp8`: E4M3.
    Fp8,
    Fp8E4m3,
    Fp8E5m2,
}

/// Why a `--kv-cache-dtype` or `--dtype` value was refused.
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
    #[error("--dtype {0} is not supported: use one of: {supported}", supported = ModelDtype::SUPPORTED)]
    UnknownModelDtype(String),
}

impl CacheDtype {
    /// The accepted values, for messages.
    pub const SUPPORTED: &'static str =
        "auto, float32 (fp32, float), float16 (fp16, half), bfloat16, fp8, fp8_e4m3, fp8_e5m2";

    /// Every value, in the order of [`CacheDtype::SUPPORTED`].
    pub const ALL: [CacheDtype; 7] = [
        CacheDtype::Auto,
        CacheDtype::Float32,
        CacheDtype::Float16,
        CacheDtype::BFloat16,
        CacheDtype::Fp8,
        CacheDtype::Fp8E4m3,
        CacheDtype::Fp8E5m2,
    ];

    /// The value as vLLM spells it (what `vllm:cache_config_info` reports).
    pub fn as_str(self) -> &'static str {
        match self {
            CacheDtype::Auto => "auto",
            CacheDtype::Float32 => "float32",
            CacheDtype::Float16 => "float16",
            CacheDtype::BFloat16 => "bfloat16",
            CacheDtype::Fp8 => "fp8",
            CacheDtype::Fp8E4m3 => "fp8_e4m3",
            CacheDtype::Fp8E5m2 => "fp8_e5m2",
        }
    }

    /// The element type the cache is stored in; `auto` stores `auto` (what
    /// [`ModelDtype::auto_kv_storage`] resolved for the model).
    pub fn storage(self, auto: KvCacheDType) -> KvCacheDType {
        match self {
            CacheDtype::Auto => auto,
            CacheDtype::Float32 => KvCacheDType::F32,
            CacheDtype::Float16 => KvCacheDType::F16,
            CacheDtype::BFloat16 => KvCacheDType::BF16,
            CacheDtype::Fp8 | CacheDtype::Fp8E4m3 => KvCacheDType::Fp8E4m3,
            CacheDtype::Fp8E5m2 => KvCacheDType::Fp8E5m2,
        }
    }

    /// The element type the cache of the model at `source`, loaded with `--dtype
    /// model_dtype`, is stored in.
    pub fn storage_for(
        self,
        model_dtype: ModelDtype,
        source: &ModelSource,
    ) -> Result<KvCacheDType> {
        Ok(match self {
            CacheDtype::Auto => model_dtype.auto_kv_storage(source)?,
            explicit => explicit.storage(KvCacheDType::F32),
        })
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
            "float32" | "fp32" | "float" => Ok(CacheDtype::Float32),
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

/// `--dtype`, vLLM's model dtype. Activations are f32 and weights keep their file types
/// whatever it says; it decides what `--kv-cache-dtype auto` stores (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelDtype {
    /// The checkpoint's own 16-bit type (bf16 where `config.json` says bfloat16, else f16).
    #[default]
    Auto,
    /// `half`, `float16`.
    Float16,
    BFloat16,
    /// `float32`, `float`.
    Float32,
}

impl ModelDtype {
    /// The accepted values, for messages.
    pub const SUPPORTED: &'static str = "auto, half, float16, bfloat16, float, float32";

    /// The value as vLLM spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelDtype::Auto => "auto",
            ModelDtype::Float16 => "float16",
            ModelDtype::BFloat16 => "bfloat16",
            ModelDtype::Float32 => "float32",
        }
    }

    /// What `--kv-cache-dtype auto` stores for the model at `source` under this `--dtype`.
    /// Reads only an HF directory's `config.json` (a GGUF file is not opened).
    pub fn auto_kv_storage(self, source: &ModelSource) -> Result<KvCacheDType> {
        Ok(match self {
            ModelDtype::Float16 => KvCacheDType::F16,
            ModelDtype::BFloat16 => KvCacheDType::BF16,
            ModelDtype::Float32 => KvCacheDType::F32,
            ModelDtype::Auto => match source {
                ModelSource::Gguf(_) => KvCacheDType::F16,
                ModelSource::HfDirectory(dir) => {
                    match declared_torch_dtype(&dir.join("config.json"))?.as_deref() {
                        Some("bfloat16") => KvCacheDType::BF16,
                        _ => KvCacheDType::F16,
                    }
                }
            },
        })
    }
}

impl std::fmt::Display for ModelDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ModelDtype {
    type Err = CacheDtypeError;

    fn from_str(text: &str) -> Result<ModelDtype, CacheDtypeError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(ModelDtype::Auto),
            "half" | "float16" => Ok(ModelDtype::Float16),
            "bfloat16" => Ok(ModelDtype::BFloat16),
            "float" | "float32" => Ok(ModelDtype::Float32),
            _ => Err(CacheDtypeError::UnknownModelDtype(text.trim().into())),
        }
    }
}

/// The element type `config.json` at `path` declares, if any: `dtype` (what newer
/// transformers write) or `torch_dtype`.
fn declared_torch_dtype(path: &Path) -> Result<Option<String>> {
    let text = std::fs::read_to_string(path).map_err(io_error(path))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| ModelError::ConfigJson {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(["dtype", "torch_dtype"]
        .iter()
        .find_map(|key| config.get(key).and_then(serde_json::Value::as_str))
        .map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dtypes_parse_with_vllm_names() {
        for dtype in CacheDtype::ALL {
            assert_eq!(dtype.as_str().parse::<CacheDtype>(), Ok(dtype));
        }
        assert_eq!("fp16".parse::<CacheDtype>(), Ok(CacheDtype::Float16));
        assert_eq!("half".parse::<CacheDtype>(), Ok(CacheDtype::Float16));
        assert_eq!("fp32".parse::<CacheDtype>(), Ok(CacheDtype::Float32));
        assert_eq!("float".parse::<CacheDtype>(), Ok(CacheDtype::Float32));
        assert_eq!(
            CacheDtype::Fp8.storage(KvCacheDType::F16),
            KvCacheDType::Fp8E4m3
        );
        assert_eq!(
            CacheDtype::Float32.storage(KvCacheDType::F16),
            KvCacheDType::F32
        );
        assert_eq!(
            CacheDtype::Auto.storage(KvCacheDType::BF16),
            KvCacheDType::BF16
        );
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

    #[test]
    fn model_dtypes_parse_with_vllm_names() {
        for (text, dtype) in [
            ("auto", ModelDtype::Auto),
            ("half", ModelDtype::Float16),
            ("float16", ModelDtype::Float16),
            ("bfloat16", ModelDtype::BFloat16),
            ("float", ModelDtype::Float32),
            ("float32", ModelDtype::Float32),
        ] {
            assert_eq!(text.parse::<ModelDtype>(), Ok(dtype));
            assert_eq!(dtype.as_str().parse::<ModelDtype>(), Ok(dtype));
        }
        let error = "float64".parse::<ModelDtype>().unwrap_err().to_string();
        assert!(
            error.contains("--dtype float64 is not supported"),
            "{error}"
        );
    }

    /// vLLM's rule: auto KV = the model dtype, FP16 for FP32 and FP16 checkpoints, BF16 for
    /// BF16 ones; GGUF files f16 as llama.cpp; `--dtype` overrides the checkpoint.
    #[test]
    fn auto_follows_the_model_dtype() {
        let gguf = ModelSource::Gguf("/nonexistent/model.gguf".into());
        assert_eq!(
            CacheDtype::Auto
                .storage_for(ModelDtype::Auto, &gguf)
                .unwrap(),
            KvCacheDType::F16
        );
        assert_eq!(
            CacheDtype::Auto
                .storage_for(ModelDtype::Float32, &gguf)
                .unwrap(),
            KvCacheDType::F32
        );
        assert_eq!(
            CacheDtype::Auto
                .storage_for(ModelDtype::BFloat16, &gguf)
                .unwrap(),
            KvCacheDType::BF16
        );
        assert_eq!(
            CacheDtype::Float32
                .storage_for(ModelDtype::Auto, &gguf)
                .unwrap(),
            KvCacheDType::F32
        );
        let dir = tempfile::tempdir().unwrap();
        let source = ModelSource::HfDirectory(dir.path().to_path_buf());
        for (config, expected) in [
            (r#"{"torch_dtype": "bfloat16"}"#, KvCacheDType::BF16),
            (
                r#"{"dtype": "bfloat16", "torch_dtype": "float32"}"#,
                KvCacheDType::BF16,
            ),
            (r#"{"torch_dtype": "float32"}"#, KvCacheDType::F16),
            (r#"{"torch_dtype": "float16"}"#, KvCacheDType::F16),
            (r#"{"model_type": "llama"}"#, KvCacheDType::F16),
        ] {
            std::fs::write(dir.path().join("config.json"), config).unwrap();
            assert_eq!(
                ModelDtype::Auto.auto_kv_storage(&source).unwrap(),
                expected,
                "{config}"
            );
            assert_eq!(
                ModelDtype::Float32.auto_kv_storage(&source).unwrap(),
                KvCacheDType::F32
            );
        }
        std::fs::remove_file(dir.path().join("config.json")).unwrap();
        assert!(matches!(
            ModelDtype::Auto.auto_kv_storage(&source),
            Err(ModelError::Io { .. })
        ));
    }
}
