//! KV-cache events for prefix-aware routers (vLLM's `--kv-events-config`): the scheduler's
//! [`KvCacheEvent`]s of one step become one batch, handed without blocking to a publisher
//! thread that sends it on a ZeroMQ PUB socket and keeps the last `buffer_steps` batches for
//! a ROUTER replay socket.
//!
//! - [`KvEventsConfig`]: the flag's JSON, vLLM's keys and defaults.
//! - `wire`: vLLM's msgpack encoding of a batch.
//! - `publisher`: the thread and its sockets.

mod config;
mod publisher;
mod wire;

pub use config::{KvEventsConfig, ZmqEndpoint};
pub(crate) use publisher::KvEventPublisher;
pub use wire::{encode_batch, MEDIUM};

pub use tokenmill_core::KvCacheEvent;
