//! One file per model family: its per-layer weight struct, how it loads, and its forward pass
//! composed from [`crate::layers`]. A family is reached through [`crate::load_model`], which
//! dispatches on the architecture, and used through [`crate::CausalLm`].

mod llama;

pub(crate) use llama::kv_layout as llama_kv_layout;
pub use llama::LlamaModel;
