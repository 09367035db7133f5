//! The registry: every family by its names, and the entry points that go through it (a
//! config from a GGUF or a `config.json`, [`load_model`], a model's cache layout before
//! loading, the per-block loaders such as [`LlamaModel::load`]). Nothing outside a family's
//! file asks which family a model is.

use std::any::Any;
use std::path::Path;

use tokenmill_gguf::GgufFile;

use super::blocks::{GemmaModel, LlamaModel};
use super::family::{Family, WeightSource};
use super::{gemma3, gemma4, gpt_oss, llama, mistral, phi3, qwen2, qwen3, qwen35};
use crate::config::{gguf_architecture, hf_model_type, Architecture, GgufMetadata, ModelConfig};
use crate::error::{io_error, ModelError, Result};
use crate::kv_cache::LayerKvLayout;
use crate::model::{CausalLm, LoadOptions};
use crate::source::ModelSource;
use crate::state_cache::LayerStateLayout;

/// Every causal-LM family tokenmill runs, in the order error messages list them.
static REGISTRY: &[&dyn Family] = &[
    &llama::Llama,
    &mistral::Mistral,
    &qwen2::Qwen2,
    &qwen3::Qwen3,
    &gemma3::Gemma3,
    &gemma4::Gemma4,
    &qwen3::Qwen3Moe,
    &phi3::Phi3,
    &qwen35::Qwen35,
    &gpt_oss::GptOss,
];

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

/// The family that runs `architecture`.
fn family_of(architecture: Architecture) -> Result<&'static dyn Family> {
    lookup(architecture.name())
}

impl Architecture {
    /// Maps a GGUF `general.architecture` or HF `model_type` string (HF calls Gemma 3's text
    /// model `gemma3_text`) to the architecture of the family that answers to it; an unknown
    /// name is an error listing the known ones.
    pub fn from_name(name: &str) -> Result<Architecture> {
        lookup(name).map(|family| family.architecture())
    }

    /// `llama, mistral, ...`: what an unsupported-architecture error lists.
    pub fn supported_list() -> String {
        supported_list()
    }
}

impl ModelConfig {
    /// Reads the hyper-parameters from a GGUF file's `{arch}.*` metadata, through the family
    /// its `general.architecture` names.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let family = lookup(gguf_architecture(file)?)?;
        let config = family.config_from_gguf(&GgufMetadata::new(file, family.architecture()))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads an HF `config.json`.
    pub fn from_hf_config_file(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(io_error(path))?;
        ModelConfig::from_hf_config_json(&text).map_err(|error| match error {
            ModelError::ConfigJson { source, .. } => ModelError::ConfigJson {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    /// Parses the text of an HF `config.json`, through the family its `model_type` names.
    pub fn from_hf_config_json(text: &str) -> Result<ModelConfig> {
        let family = lookup(&hf_model_type(text)?)?;
        let config = family.config_from_hf(text)?;
        config.validate()?;
        Ok(config)
    }
}

/// Loads the model a [`ModelSource`] names, through the family its architecture names.
///
/// A boxed trait object rather than an enum of families: the engine never names a family, a
/// family file (and its registry line) is all a new architecture adds, and a backend in
/// another crate can implement [`CausalLm`] too. The cost is one virtual call per forward
/// pass, nothing next to the pass itself.
pub fn load_model(source: &ModelSource, options: &LoadOptions) -> Result<Box<dyn CausalLm>> {
    match source {
        ModelSource::Gguf(path) => load_gguf_model(&GgufFile::open(path)?, options),
        ModelSource::HfDirectory(dir) => {
            let config = ModelConfig::from_hf_config_file(&dir.join("config.json"))?;
            let family = family_of(config.architecture)?;
            family.build(WeightSource::HfDirectory(dir), config, options)
        }
    }
}

/// Loads a model from an open GGUF file, so its tokenizer can be read from the same file.
pub fn load_gguf_model(file: &GgufFile, options: &LoadOptions) -> Result<Box<dyn CausalLm>> {
    let config = ModelConfig::from_gguf(file)?;
    let family = family_of(config.architecture)?;
    family.build(WeightSource::Gguf(file), config, options)
}

/// Reads a model's hyper-parameters from its metadata only (no weights), e.g. to size a KV
/// budget before loading.
pub fn read_model_config(source: &ModelSource) -> Result<ModelConfig> {
    match source {
        ModelSource::Gguf(path) => ModelConfig::from_gguf(&GgufFile::open(path)?),
        ModelSource::HfDirectory(dir) => ModelConfig::from_hf_config_file(&dir.join("config.json")),
    }
}

/// The cache layout a model with `config` will report ([`CausalLm::kv_layout`]), without
/// loading it: its family's declaration.
pub fn kv_layout(config: &ModelConfig) -> Result<Vec<LayerKvLayout>> {
    Ok(family_of(config.architecture)?.kv_layout(config))
}

/// The recurrent-state layout a model with `config` will report
/// ([`CausalLm::state_layout`]), without loading it: empty for a pure transformer.
pub fn state_layout(config: &ModelConfig) -> Result<Vec<LayerStateLayout>> {
    Ok(family_of(config.architecture)?.state_layout(config))
}

/// The concrete model behind a loaded one: the per-block loaders load through the registry
/// and check that the family built their block.
fn downcast_model<M: CausalLm>(model: Box<dyn CausalLm>, block: &str) -> Result<M> {
    let architecture = model.config().architecture.name();
    let model: Box<dyn Any> = model;
    model
        .downcast::<M>()
        .map(|model| *model)
        .map_err(|_| ModelError::InvalidMetadata {
            key: "general.architecture".into(),
            message: format!(
                "`{architecture}` does not run on the {block} block (load_model picks its family's)"
            ),
        })
}

impl LlamaModel {
    /// Loads the model a [`ModelSource`] names; an error unless its family builds this block
    /// ([`load_model`] loads any family).
    pub fn load(source: &ModelSource, options: &LoadOptions) -> Result<LlamaModel> {
        downcast_model(load_model(source, options)?, "Llama")
    }

    /// Loads a GGUF file.
    pub fn load_gguf(path: &Path, options: &LoadOptions) -> Result<LlamaModel> {
        LlamaModel::from_gguf(&GgufFile::open(path)?, options)
    }

    /// Loads from an open GGUF file (whose tokenizer the caller may read as well).
    pub fn from_gguf(file: &GgufFile, options: &LoadOptions) -> Result<LlamaModel> {
        downcast_model(load_gguf_model(file, options)?, "Llama")
    }

    /// Loads an HF directory (`config.json` + safetensors).
    pub fn load_hf_directory(dir: &Path, options: &LoadOptions) -> Result<LlamaModel> {
        LlamaModel::load(&ModelSource::HfDirectory(dir.to_path_buf()), options)
    }
}

impl GemmaModel {
    /// Loads from an open GGUF file (whose tokenizer the caller may read as well); an error
    /// unless it is a Gemma 3 or 4 file ([`load_gguf_model`] loads any family).
    pub fn from_gguf(file: &GgufFile, options: &LoadOptions) -> Result<GemmaModel> {
        downcast_model(load_gguf_model(file, options)?, "Gemma")
    }

    /// Loads an HF directory (`config.json` + safetensors of a `Gemma3ForCausalLM` or a
    /// `Gemma4ForCausalLM`).
    pub fn load_hf_directory(dir: &Path, options: &LoadOptions) -> Result<GemmaModel> {
        let source = ModelSource::HfDirectory(dir.to_path_buf());
        downcast_model(load_model(&source, options)?, "Gemma")
    }
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
                 qwen3, gemma3, gemma4, qwen3moe, phi3, qwen35, gpt-oss)"
            )
        );
    }
}
