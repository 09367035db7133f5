//! One file per model family: its per-layer weight struct, how it loads, and its forward pass
//! composed from [`crate::layers`]. A family is reached through [`crate::load_model`], which
//! dispatches on the architecture, and used through [`crate::CausalLm`]; encoders (`bert.rs`)
//! through [`crate::PoolingModel`] and [`crate::load_pooling_model`].

mod bert;
mod gemma3;
mod llama;

pub use bert::{BertModel, EncoderPrecision};
pub use gemma3::Gemma3Model;
pub(crate) use llama::kv_layout as llama_kv_layout;
pub use llama::LlamaModel;
