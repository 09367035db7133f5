//! The model registry: one [`Family`] per architecture, each owning what is particular to it.
//!
//! A family recognises its names (GGUF `general.architecture`, HF `model_type`), parses its
//! config in both formats into a [`ModelConfig`] (its `config.json` fields in a struct of the
//! file's shape; its GGUF quirks), names its tensors where HF names them differently, builds
//! its model and declares its per-layer cache layout. [`REGISTRY`] lists them;
//! [`crate::load_model`], [`ModelConfig::from_gguf`] and [`ModelConfig::from_hf_config_json`]
//! look a name up there, so nothing outside a family's file asks which family a model is.
//!
//! The decoder blocks live beside them: [`LlamaModel`] (the pre-norm block every Llama-shaped
//! family builds: Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Phi-3), [`Gemma3Model`]. Encoders
//! (`bert.rs`) go through [`crate::PoolingModel`] and [`crate::load_pooling_model`].
//!
//! To add a family: a file here with its `Family` implementation, and one line in
//! [`REGISTRY`]. The test `every_registered_family_round_trips_a_tiny_model`
//! (`tests/registry.rs`) fails until the new family has a tiny fixture there.

mod bert;
mod gemma3;
mod llama;
mod mistral;
mod phi3;
mod qwen2;
mod qwen3;

use std::path::Path;

use tokenmill_gguf::GgufFile;

pub use bert::{BertModel, EncoderPrecision};
pub use gemma3::Gemma3Model;
pub use llama::LlamaModel;

use crate::config::{Architecture, GgufMetadata, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kv_cache::LayerKvLayout;
use crate::layers::AttentionShape;
use crate::model::{CausalLm, LoadOptions};

/// Every causal-LM family tokenmill runs, in the order error messages list them.
static REGISTRY: &[&dyn Family] = &[
    &llama::Llama,
    &mistral::Mistral,
    &qwen2::Qwen2,
    &qwen3::Qwen3,
    &gemma3::Gemma3,
    &qwen3::Qwen3Moe,
    &phi3::Phi3,
];

/// Where a model's weights are: an open GGUF file or an HF directory of safetensors.
#[derive(Clone, Copy)]
pub(crate) enum WeightSource<'a> {
    Gguf(&'a GgufFile),
    HfDirectory(&'a Path),
}

/// What a model family owns: its names, its config parsing, its loading and its cache layout.
pub(crate) trait Family: Send + Sync {
    /// Its GGUF `general.architecture`, which is also its metadata key prefix.
    fn architecture(&self) -> Architecture;

    /// Other names it answers to: HF `model_type`s that differ from the GGUF name.
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

    /// Its hyper-parameters from a GGUF's metadata (the caller validates them).
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig>;

    /// Its hyper-parameters from the text of an HF `config.json` (the caller validates them).
    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig>;

    /// Builds the model from the weights whose config this family read. By default on the
    /// Llama block ([`LlamaModel`]: pre-norm, one RoPE table, the config's variants), which
    /// every Llama-shaped family runs on; a family with its own block overrides this.
    fn build(
        &self,
        weights: WeightSource<'_>,
        config: ModelConfig,
        options: &LoadOptions,
    ) -> Result<Box<dyn CausalLm>> {
        let kv_layout = self.kv_layout(&config);
        Ok(Box::new(LlamaModel::build(
            weights, config, kv_layout, options,
        )?))
    }

    /// What each layer keeps in the cache, known before loading (to size a KV budget): by
    /// default every layer keeps paged K/V of the config's attention shape, with the
    /// config's window for that layer.
    fn kv_layout(&self, config: &ModelConfig) -> Vec<LayerKvLayout> {
        let shape = AttentionShape::of(config);
        (0..config.num_layers)
            .map(|layer| shape.kv_layout(config.layer_sliding_window(layer)))
            .collect()
    }
}

/// The family that answers to `name` (a GGUF architecture or an HF `model_type`).
pub(crate) fn lookup(name: &str) -> Result<&'static dyn Family> {
    REGISTRY
        .iter()
        .copied()
        .find(|family| family.architecture() == name || family.aliases().contains(&name))
        .ok_or_else(|| ModelError::UnsupportedArchitecture {
            name: name.to_string(),
            supported: supported_list(),
        })
}

/// `llama, mistral, ...`: the registered architectures, as errors list them.
pub(crate) fn supported_list() -> String {
    registered_architectures()
        .map(Architecture::name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every registered family's architecture, in registry order.
pub fn registered_architectures() -> impl Iterator<Item = Architecture> {
    REGISTRY.iter().map(|family| family.architecture())
}

/// Every registered family's names: its architecture and its aliases.
pub fn registered_names() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().flat_map(|family| {
        std::iter::once(family.architecture().name()).chain(family.aliases().iter().copied())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_across_families() {
        let mut names: Vec<&str> = registered_names().collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a name answers to two families");
    }

    #[test]
    fn every_name_finds_its_family() {
        for family in REGISTRY {
            let architecture = family.architecture();
            assert_eq!(
                lookup(architecture.name()).map(|f| f.architecture()).ok(),
                Some(architecture)
            );
            for alias in family.aliases() {
                assert_eq!(
                    lookup(alias).map(|f| f.architecture()).ok(),
                    Some(architecture)
                );
            }
        }
        let error = lookup("falcon").err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some(
                "unsupported model architecture `falcon` (supported: llama, mistral, qwen2, \
                 qwen3, gemma3, qwen3moe, phi3)"
            )
        );
    }
}
