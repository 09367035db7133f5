//! The OpenAI-compatible HTTP server (`tokenmill serve`).
//!
//! The only crate that knows HTTP (architecture invariant 2): it maps routes onto the wire
//! types of `tokenmill-protocol`, tokenizes and templates with `tokenmill-text`, and talks to
//! the engine thread through an `EngineClient`. It never touches the model or the scheduler.
//!
//! Key types: [`ServerConfig`] (flags), [`AppState`] (what handlers share), [`router`] (the axum
//! app, testable in-process with `tower::ServiceExt::oneshot`), [`serve`] (bind, TLS, signals,
//! graceful drain).
//!
//! Request path: body bytes (size-limited) → `parse_json` → `validate` (400 with `param`) →
//! chat template + tokenize → one engine request per (prompt, choice) → JSON or SSE.
//! A dropped SSE body drops the engine streams, which aborts the requests in the engine.

mod admission;
mod anthropic_output;
pub mod chat_output;
mod config;
mod cors;
mod error;
mod first_byte;
mod generation;
mod lifecycle;
mod parse_errors;
mod pooling;
mod responses_output;
mod responses_runs;
mod routes;
mod sse;
mod state;

pub use config::{ServerConfig, TlsConfig};
pub use cors::CorsConfig;
pub use error::ApiError;
pub use generation::structured_output;
pub use lifecycle::{bind, serve, serve_on, serve_pooling_on, ServeError};
pub use pooling::{pooling_router, PoolingState};
pub use responses_runs::INTERRUPTED_RUN_MESSAGE;
pub use routes::router;
pub use state::AppState;
