//! The [`Family`] trait: what a model family owns (its names, its config parsing in both
//! formats, its model building, its cache layout), and where its weights come from.

use std::path::Path;

use tokenmill_gguf::GgufFile;

use super::blocks::LlamaModel;
use crate::config::{Architecture, GgufMetadata, ModelConfig};
use crate::error::Result;
use crate::kv_cache::LayerKvLayout;
use crate::layers::AttentionShape;
use crate::model::{CausalLm, LoadOptions};
use crate::state_cache::LayerStateLayout;

/// Where a model's weights are: an open GGUF file or an HF directory of safetensors.
#[derive(Clone, Copy)]
pub(crate) enum WeightSource<'a> {
    Gguf(&'a GgufFile),
    HfDirectory(&'a Path),
}

/// What a model family owns: its names, its config parsing, its loading and its cache layout.
pub(crate) trait Family: Sync {
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
    /// default every layer but the KV-shared ones (`ModelConfig::kv_shared_layers`, which
    /// come last) keeps paged K/V of its attention shape, with the config's window for it.
    fn kv_layout(&self, config: &ModelConfig) -> Vec<LayerKvLayout> {
        (0..config.num_kv_cache_layers())
            .map(|layer| {
                AttentionShape::of_layer(config, layer)
                    .kv_layout(config.layer_sliding_window(layer))
            })
            .collect()
    }

    /// What each recurrent layer keeps per sequence ([`CausalLm::state_layout`]), known
    /// before loading: none by default.
    fn state_layout(&self, _config: &ModelConfig) -> Vec<LayerStateLayout> {
        Vec::new()
    }
}
