//! vLLM's runtime LoRA routes: `POST /v1/load_lora_adapter` and
//! `POST /v1/unload_lora_adapter` (enabled by `VLLM_ALLOW_RUNTIME_LORA_UPDATING=true`).

use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;

/// `POST /v1/load_lora_adapter`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadLoraAdapterRequest {
    #[serde(default)]
    pub lora_name: Option<String>,
    #[serde(default)]
    pub lora_path: Option<String>,
}

impl LoadLoraAdapterRequest {
    /// `(name, path)`, both present and non-empty (vLLM's message otherwise).
    pub fn validate(&self) -> Result<(&str, &str), ProtocolError> {
        match (self.lora_name.as_deref(), self.lora_path.as_deref()) {
            (Some(name), Some(path)) if !name.is_empty() && !path.is_empty() => Ok((name, path)),
            (name, _) => Err(ProtocolError::invalid(
                if name.is_none_or(str::is_empty) {
                    "lora_name"
                } else {
                    "lora_path"
                },
                "Both 'lora_name' and 'lora_path' must be provided.",
            )),
        }
    }
}

/// `POST /v1/unload_lora_adapter`. vLLM also reads `lora_int_id`; here ids are the
/// server's own, so naming one is refused rather than ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnloadLoraAdapterRequest {
    #[serde(default)]
    pub lora_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_int_id: Option<i64>,
}

impl UnloadLoraAdapterRequest {
    pub fn validate(&self) -> Result<&str, ProtocolError> {
        if self.lora_int_id.is_some() {
            return Err(ProtocolError::unsupported(
                "lora_int_id",
                "lora_int_id is not supported: adapters are unloaded by lora_name.",
            ));
        }
        match self.lora_name.as_deref() {
            Some(name) if !name.is_empty() => Ok(name),
            _ => Err(ProtocolError::invalid(
                "lora_name",
                "'lora_name' needs to be provided to unload a LoRA adapter.",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_load_fields_are_required() {
        let ok = LoadLoraAdapterRequest {
            lora_name: Some("a".into()),
            lora_path: Some("/p".into()),
        };
        assert_eq!(ok.validate().unwrap(), ("a", "/p"));
        let no_path = LoadLoraAdapterRequest {
            lora_name: Some("a".into()),
            lora_path: None,
        };
        assert_eq!(no_path.validate().unwrap_err().param(), Some("lora_path"));
        let no_name = LoadLoraAdapterRequest::default();
        assert_eq!(no_name.validate().unwrap_err().param(), Some("lora_name"));
    }

    #[test]
    fn unload_needs_a_name_and_refuses_an_id() {
        let with_id = UnloadLoraAdapterRequest {
            lora_name: Some("a".into()),
            lora_int_id: Some(3),
        };
        assert_eq!(with_id.validate().unwrap_err().param(), Some("lora_int_id"));
        assert!(UnloadLoraAdapterRequest::default().validate().is_err());
    }
}
