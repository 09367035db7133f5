//! One file per model family: its per-layer weight struct, how it loads, and its forward pass
//! composed from [`crate::layers`]. A family is reached through [`crate::load_model`], which
//! dispatches on the architecture, and used through [`crate::CausalLm`].

mod gemma3;
mod llama;

pub use gemma3::Gemma3Model;
pub(crate) use llama::kv_layout as llama_kv_layout;
pub use llama::LlamaModel;
