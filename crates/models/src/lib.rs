//! tokenmill-models: turns weight files into a runnable causal LM, and logits into tokens.
//!
//! The engine's executor needs three things from a model: a way to find and load it from
//! whatever the user passed as `--model`, a forward pass over a flattened batch of many
//! sequences that reads and writes a **paged** KV cache, and a sampler. This crate provides
//! them on top of the compute layer (`tokenmill-kernels`); it owns no scheduling policy and no
//! KV block allocation (that is `tokenmill-core`).
//!
//! # Key types
//!
//! - [`resolve_model`] → [`ModelSource`]: a GGUF file, an HF directory, an HF repo id (local HF
//!   cache, downloaded when online), or the default model (fetched once into
//!   `~/.cache/tokenmill/models`).
//! - [`ModelConfig`]: typed hyper-parameters from GGUF metadata or `config.json`, parsed by
//!   the model's family.
//! - The model registry (`families/`): one `Family` per architecture owns its names, its
//!   config parsing in both formats, its tensor names, its model building and its cache
//!   layout; [`registered_architectures`] lists them. To add a family is to add one file and
//!   one registry line.
//! - [`CausalLm`]: the model seam (config, per-layer [`LayerKvLayout`], forward over a batch
//!   on the caller's [`ThreadPool`]); [`load_model`] builds it through the family the
//!   architecture names. The decoder blocks ([`LlamaModel`] for every Llama-shaped family,
//!   [`GemmaModel`]) are composed from the shared blocks in `layers/` (linear, norms, RoPE,
//!   attention, gated MLP); quantized and float checkpoints differ only in the dtype of their
//!   matrices.
//! - [`PoolingModel`]: the seam for encoders ([`BertModel`]: embeddings with mean / CLS /
//!   last pooling from sentence-transformers' modules, and `BertForSequenceClassification`
//!   cross-encoders); [`load_pooling_model`] loads one, [`is_pooling_model`] tells the CLI
//!   which runner a checkpoint needs. Whole sequences in an [`EncoderBatch`], no KV cache.
//! - [`BatchInput`], [`KvCacheStorage`], [`Workspace`]: the inputs and memory of a step. The
//!   cache is sized from the model's [`CausalLm::kv_layout`] and stores K/V as a
//!   [`KvCacheDType`] (f32, f16, bf16, fp8), chosen by the `--kv-cache-dtype` value
//!   [`CacheDtype`].
//! - [`LoraAdapter`]: a PEFT or GGUF LoRA adapter checked against the base model;
//!   [`BatchInput::set_last_sequence_adapter`] runs a sequence through it, so one step mixes
//!   base rows and rows of several adapters.
//! - [`Sampler`] with [`SamplingParams`] → [`SampledToken`]: per-request sampling with vLLM's
//!   semantics, a per-request seeded RNG and a [`LogitsChain`] of [`LogitsProcessor`]s.
//!
//! # Usage loop
//!
//! ```no_run
//! use tokenmill_models::*;
//! # fn main() -> Result<()> {
//! let model = load_model(&resolve_model(None)?, &LoadOptions::default())?;
//! let pool = ThreadPool::default();
//! let block_size = 16;
//! let mut kv = KvCacheStorage::new(model.kv_layout(), 64, block_size);
//! let mut workspace = Workspace::new();
//! let (prompt, block_table) = (vec![504u32, 3575, 282, 4649, 314], vec![0u32, 1, 2, 3]);
//! let mut sampler = Sampler::new(SamplingParams::greedy(), &prompt);
//! let mut generated = Vec::new();
//! let (mut batch, mut logits) = (BatchInput::default(), Vec::new());
//! batch.add_sequence(&prompt, 0, &block_table, block_size, true)?;
//! for _ in 0..16 {
//!     model.forward(&pool, &batch, &mut kv, &mut workspace, &mut logits)?;
//!     let history = History { prompt: &prompt, output: &generated };
//!     let next = sampler.sample(&logits, &history)?.token_id;
//!     generated.push(next);
//!     batch.clear();
//!     batch.add_sequence(&[next], prompt.len() + generated.len() - 1, &block_table,
//!                        block_size, true)?;
//! }
//! # Ok(()) }
//! ```

mod batch;
mod cache_dtype;
mod config;
mod error;
mod families;
mod kv_cache;
mod layers;
mod loader;
mod lora;
mod model;
mod pooling;
mod sampling;
mod source;
mod state_cache;

pub use batch::{BatchInput, GroupTables};
pub use cache_dtype::{CacheDtype, CacheDtypeError, ModelDtype};
pub use config::{
    Architecture, ClampedSwiglu, FullAttentionGeometry, LinearAttentionConfig, ModelConfig,
    MoeConfig, RopeScaling, RopeStyle,
};
pub use error::{ModelError, Result};
pub use families::{
    kv_layout, load_gguf_model, load_model, read_model_config, registered_architectures,
    registered_names, state_layout, BertModel, EncoderPrecision, GemmaModel, LlamaModel,
    Qwen35Model,
};
pub use kv_cache::{KvCacheGrouping, KvCacheStorage, LayerKvLayout};
pub use layers::Workspace;
pub use loader::safetensors_shards_from_index;
pub use lora::{
    write_random_peft_adapter, LoraAdapter, LoraBatch, LoraError, LoraTarget, RandomLoraSpec,
};
pub use model::{CausalLm, LoadOptions};
pub use pooling::{
    is_pooling_model, l2_normalize, load_pooling_model, load_pooling_model_with, ConvertOption,
    DecoderEmbedder, EncoderBatch, EncoderWorkspace, PoolerConfig, PoolingMethod, PoolingModel,
    PoolingModelInfo, PoolingOptions, PoolingTask,
};
pub use sampling::{
    argmax, log_sum_exp, token_logprobs, GrammarCompiler, GrammarMatcher, GrammarVocabulary,
    History, JsonGrammarOptions, LogitsChain, LogitsProcessor, SampledToken, Sampler,
    SamplingParams, StructuredOutput, ThinkingBudget, Unsatisfiable,
};
pub use source::{
    default_model_path, ensure_default_model, ensure_default_model_in, extract_wheel_entry,
    find_cached_repo, hf_hub_cache_dir, model_cache_dir, resolve_model, resolve_model_with,
    ModelSource, ResolveOptions, DEFAULT_MODEL_FILE, DEFAULT_MODEL_WHEEL,
};
pub use state_cache::{LayerStateLayout, StateCacheStorage};
pub use tokenmill_kernels::AttentionSeq;
pub use tokenmill_kernels::EncoderSeq;
pub use tokenmill_kernels::KvCacheDType;
pub use tokenmill_kernels::ThreadPool;
