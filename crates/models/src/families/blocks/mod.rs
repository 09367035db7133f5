//! The decoder blocks families build: [`LlamaModel`] (pre-norm, one RoPE table; every
//! Llama-shaped family, the default of `Family::build`), [`GemmaModel`] (four norms, local
//! and global layers; Gemma 3 and 4) and [`Qwen35Model`] (attention and Gated DeltaNet).

mod gemma;
mod llama;
mod qwen35;

pub use gemma::GemmaModel;
pub use llama::LlamaModel;
pub use qwen35::Qwen35Model;
