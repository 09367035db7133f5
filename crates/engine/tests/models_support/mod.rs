//! The models crate's Qwen3.5 fixture writer and its helpers, shared with the engine's tests
//! (one source for the checkpoint both crates test).

#![allow(dead_code, clippy::all)]

#[path = "../../../models/tests/common/mod.rs"]
pub mod common;
#[path = "../../../models/tests/support/qwen35.rs"]
pub mod qwen35;
