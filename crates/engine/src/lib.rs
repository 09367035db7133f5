//! The engine: one thread that owns the scheduler and the model runner and loops
//! schedule → execute → update while there is work, plus the handle the rest of the program
//! talks to it through.
//!
//! Key types:
//! - [`EngineConfig`] — everything the engine is built from (model, KV budget, scheduler caps).
//! - [`Engine`] / [`EngineClient`] — start the engine thread; add a [`GenerateRequest`] and
//!   receive its [`RequestStream`] of [`RequestOutput`] deltas; abort; read [`EngineStats`].
//!   Dropping a stream aborts its request and frees its KV blocks.
//! - [`Executor`] — what the loop calls to run one step; [`ModelRunner`] is the real one
//!   (flattened batch over the paged KV cache, then per-request sampling).
//! - [`OutputProcessor`] — per request: incremental detokenization and stop strings.
//! - [`dp`] — data parallelism: `data_parallel_size` engine loops behind one
//!   [`EngineClient`], which balances requests by load and prefix locality.
//! - [`generate_batch`] — offline batch generation (vLLM's `LLM.generate`) over the same engine.
//! - [`PoolingEngine`] / [`PoolingClient`] — the pooling runner (`--runner pooling`): its own
//!   loop thread over a `PoolingModel`, prefill-only [`PoolingInput`]s packed per step under
//!   the token budget, no KV cache, one row (embedding or class logits) back per input.
//!
//! Usage loop:
//! ```text
//! let engine = Engine::start(config)?;          // loads the model, sizes the KV pool
//! let client = engine.client();
//! let mut stream = client.add_request(request)?;
//! while let Some(event) = stream.recv().await { ... }   // text deltas, then a finish reason
//! ```
//!
//! The engine thread is the only place that touches the model and the scheduler; clients only
//! exchange plain messages with it over channels, so the HTTP server never blocks a step.

mod capacity_plan;
mod client;
mod config;
mod core_loop;
pub mod dp;
mod error;
mod executor;
pub mod kv_events;
mod kv_groups;
mod lora;
mod model_runner;
mod observer;
mod offline;
mod output;
mod pooling;
mod request;
pub mod spec;
mod startup;
#[cfg(test)]
mod state_slot_tests;
mod stats;
#[cfg(test)]
mod test_support;

pub use client::{Engine, EngineClient, RequestStream};
pub use config::{EngineConfig, KvCacheSizing, DEFAULT_MAX_NUM_BATCHED_TOKENS};
pub use error::EngineError;
pub use executor::{Executor, NewSequence, StepOutput};
pub use lora::{LoraConfig, LoraListing, LoraModule, LoraRegistry, LoraRequest};
pub use model_runner::{grammar_vocabulary, LoadedModel, ModelRunner};
pub use offline::{generate_batch, BatchItem, BatchResult};
pub use output::OutputProcessor;
pub use pooling::{
    LoadedPoolingModel, PoolingClient, PoolingEngine, PoolingEngineConfig, PoolingInput,
};
pub use request::{
    FinishReason, GenerateRequest, RequestEvent, RequestFailure, RequestOutput, StopOptions,
    StopReason, TokenLogprob,
};
pub use stats::{CapacityReport, EngineStats};
pub use tokenmill_core::{RequestId, SchedulingPolicy};
pub use tokenmill_models::{CacheDtype, CacheDtypeError, ModelDtype, SamplingParams};
