//! The model registry: one `Family` (`family.rs`) per architecture, each owning what is particular to it.
//!
//! A family recognises its names (GGUF `general.architecture`, HF `model_type`), parses its
//! config in both formats into a [`ModelConfig`] (its `config.json` fields in a struct of the
//! file's shape; its GGUF quirks), names its tensors where HF names them differently, builds
//! its model and declares its per-layer cache layout. `registry::REGISTRY` lists them;
//! [`crate::load_model`], [`ModelConfig::from_gguf`] and [`ModelConfig::from_hf_config_json`]
//! look a name up there, so nothing outside a family's file asks which family a model is.
//!
//! The decoder blocks live beside them: [`LlamaModel`] (the pre-norm block every Llama-shaped
//! family builds: Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Phi-3), [`GemmaModel`]. Encoders
//! (`bert.rs`) go through [`crate::PoolingModel`] and [`crate::load_pooling_model`].
//!
//! To add a family: a file here with its `Family` implementation, and one line in
//! `REGISTRY`. The test `every_registered_family_round_trips_a_tiny_model`
//! (`tests/registry.rs`) fails until the new family has a tiny fixture there.
//!
//! Files: `family.rs` (the trait), `registry.rs` (the list and the entry points),
//! `blocks/` (the decoder blocks families build), one file per family.

mod bert;
mod blocks;
mod family;
mod gemma3;
mod gemma4;
mod gpt_oss;
mod llama;
mod mistral;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen35;
mod registry;

pub use bert::{BertModel, EncoderPrecision};
pub use blocks::{GemmaModel, LlamaModel, Qwen35Model};

pub use registry::{
    kv_layout, load_gguf_model, load_model, read_model_config, registered_architectures,
    registered_names, state_layout,
};
