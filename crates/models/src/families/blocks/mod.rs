//! The decoder blocks families build: [`LlamaModel`] (pre-norm, one RoPE table; every
//! Llama-shaped family, the default of `Family::build`) and [`Gemma3Model`] (four norms,
//! local and global layers).

mod gemma3;
mod llama;
mod qwen35;

pub use gemma3::Gemma3Model;
pub use llama::LlamaModel;
pub use qwen35::Qwen35Model;
