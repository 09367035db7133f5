//! The models crate's Qwen3.5 and Gemma 4 fixture writers and their helpers, shared with the
//! engine's tests (one source for the checkpoints both crates test).

#![allow(dead_code, clippy::all)]

#[path = "../../../models/tests/common/mod.rs"]
pub mod common;
#[path = "../../../models/tests/support/gemma4.rs"]
pub mod gemma4;
#[path = "../../../models/tests/support/qwen35.rs"]
pub mod qwen35;
