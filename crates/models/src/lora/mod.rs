//! LoRA adapters: low-rank updates `x · Aᵀ · Bᵀ · scale` added to a base model's linear
//! layers, many adapters over one base, chosen per sequence.
//!
//! An adapter is read once ([`LoraAdapter::load`]: a PEFT directory or a llama.cpp GGUF LoRA
//! file), checked against the base model's shapes, and kept per layer as one [`LoraStack`] per
//! [`LoraGroup`] (the targets that read the same input share one stacked `A`) in 16-bit
//! floats. A step names its adapters in [`BatchInput::lora`](crate::BatchInput) and tags each
//! token with a slot; the linear layers add each adapter's update to its own rows after the
//! base matmul (`layers/lora.rs`).

mod load;
mod random;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use tokenmill_kernels::QMatrix;

use crate::config::ModelConfig;

pub use random::{write_random_peft_adapter, RandomLoraSpec};

/// The linear layers an adapter may target, in HF's and GGUF's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// PEFT's module name (`q_proj`).
    pub fn hf_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
        }
    }

    /// GGUF's tensor short name (`attn_q`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "attn_q",
            LoraTarget::K => "attn_k",
            LoraTarget::V => "attn_v",
            LoraTarget::O => "attn_output",
            LoraTarget::Gate => "ffn_gate",
            LoraTarget::Up => "ffn_up",
            LoraTarget::Down => "ffn_down",
        }
    }

    pub fn from_hf_name(name: &str) -> Option<LoraTarget> {
        LoraTarget::ALL.into_iter().find(|t| t.hf_name() == name)
    }

    pub fn from_gguf_name(name: &str) -> Option<LoraTarget> {
        LoraTarget::ALL.into_iter().find(|t| t.gguf_name() == name)
    }

    /// `(in_features, out_features)` of the base layer this target adapts.
    pub fn dims(self, config: &ModelConfig) -> (usize, usize) {
        let (hidden, q, kv) = (config.hidden_size, config.q_dim(), config.kv_dim());
        match self {
            LoraTarget::Q => (hidden, q),
            LoraTarget::K | LoraTarget::V => (hidden, kv),
            LoraTarget::O => (q, hidden),
            LoraTarget::Gate | LoraTarget::Up => (hidden, config.intermediate_size),
            LoraTarget::Down => (config.intermediate_size, hidden),
        }
    }
}

/// Why an adapter could not be loaded. Each names what the user passed, so the load route
/// and the start-up error can show it as is.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error("{0}")]
    UnsupportedBase(String),
    #[error("LoRA adapter path {0} does not exist")]
    MissingPath(PathBuf),
    #[error("{path} is not a LoRA adapter: {message}")]
    NotAnAdapter { path: PathBuf, message: String },
    #[error("invalid adapter_config.json in {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("LoRA rank {rank} is greater than --max-lora-rank {max_rank}")]
    RankTooLarge { rank: usize, max_rank: usize },
    #[error("LoRA target module `{module}` is not supported by the base model (supported: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")]
    UnsupportedTarget { module: String },
    #[error("LoRA target module `{module}` is a mixture-of-experts MLP in this base model, and adapters of expert layers are not supported (supported here: q_proj, k_proj, v_proj, o_proj)")]
    ExpertTarget { module: String },
    #[error("LoRA tensor `{tensor}` has shape {actual:?}, the base model needs {expected:?}")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("LoRA tensor `{tensor}` names layer {layer}, the base model has {num_layers}")]
    LayerOutOfRange {
        tensor: String,
        layer: usize,
        num_layers: usize,
    },
    #[error("LoRA tensor `{0}` has no partner (every lora_A needs its lora_B)")]
    Unpaired(String),
    #[error("corrupt LoRA weights in {path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("LoRA adapter for architecture `{adapter}` does not fit base model `{base}`")]
    ArchitectureMismatch { adapter: String, base: String },
}

impl LoraError {
    /// The path holds no readable adapter (missing, not a regular file, not an adapter,
    /// corrupt bytes), as opposed to an adapter this server cannot serve (rank, targets,
    /// shapes). A runtime load answers the first kind with one message, so its text, which
    /// names paths and file bytes, goes to the log only.
    pub fn is_unreadable(&self) -> bool {
        matches!(
            self,
            LoraError::MissingPath(_) | LoraError::NotAnAdapter { .. } | LoraError::Corrupt { .. }
        )
    }
}

/// Targets whose base layers read the same input (`[q | k | v]` and `[gate | up]` are one
/// fused matmul each), so one `x · Aᵀ` with their `A`s stacked serves all of them: one pass
/// over `x` and one kernel call instead of three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoraGroup {
    Qkv,
    O,
    GateUp,
    Down,
}

impl LoraGroup {
    pub const ALL: [LoraGroup; 4] = [
        LoraGroup::Qkv,
        LoraGroup::O,
        LoraGroup::GateUp,
        LoraGroup::Down,
    ];

    /// Its targets, in the order their outputs sit side by side in the fused output row.
    pub fn targets(self) -> &'static [LoraTarget] {
        match self {
            LoraGroup::Qkv => &[LoraTarget::Q, LoraTarget::K, LoraTarget::V],
            LoraGroup::O => &[LoraTarget::O],
            LoraGroup::GateUp => &[LoraTarget::Gate, LoraTarget::Up],
            LoraGroup::Down => &[LoraTarget::Down],
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One target's half of the update: its rows of the stacked `A` and its `B`.
#[derive(Debug)]
pub(crate) struct LoraPart {
    pub target: LoraTarget,
    /// Its rows of [`LoraStack::a`], i.e. its columns of the low-rank intermediate.
    pub ranks: Range<usize>,
    /// `Bᵀ`, `[rank, out_features]`: a row's product is then `rank` axpys over the outputs
    /// (`QMatrix::add_untransposed`) rather than `out_features` dots of length `rank`.
    pub b: QMatrix,
    /// Where its output starts in the group's fused output row.
    pub column: usize,
}

/// The adapted targets of one [`LoraGroup`] in one layer:
/// `delta[column..] = scale · (x · Aᵀ)[ranks] · Bᵀ` per part.
///
/// `A` and `B` are held in F16 (BF16 for a matrix with a value beyond F16's range), read by
/// the kernels' 16-bit float path: decode is memory-bound and rank 16 on all seven targets in
/// f32 adds a third of a Q4 base model's bytes per step. vLLM likewise runs adapters in the
/// model's dtype. A BF16 file converts exactly (F16 has three more mantissa bits) unless a
/// value leaves F16's range; F32 files round once, to nearest. The scale is applied to the
/// f32 intermediate rather than folded into `B`, so `B` is not rounded twice.
#[derive(Debug)]
pub(crate) struct LoraStack {
    /// `[Σ rank, in_features]`: the parts' `A`s, stacked in part order.
    pub a: QMatrix,
    pub parts: Vec<LoraPart>,
}

impl LoraStack {
    fn storage_bytes(&self) -> usize {
        self.a.storage_bytes()
            + self
                .parts
                .iter()
                .map(|p| p.b.storage_bytes())
                .sum::<usize>()
    }
}

/// A loaded adapter: per layer, one optional `LoraStack` per `LoraGroup`.
#[derive(Debug)]
pub struct LoraAdapter {
    path: PathBuf,
    rank: usize,
    scale: f32,
    layers: Vec<[Option<LoraStack>; 4]>,
}

impl LoraAdapter {
    /// The path it was read from.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The largest rank among its layers.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// `alpha / rank` (or `alpha / sqrt(rank)` with rsLoRA), applied to every `x · Aᵀ`.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The targets adapted in at least one layer, in [`LoraTarget::ALL`] order.
    pub fn targets(&self) -> Vec<LoraTarget> {
        LoraTarget::ALL
            .into_iter()
            .filter(|&t| {
                self.layers
                    .iter()
                    .flatten()
                    .flatten()
                    .any(|stack| stack.parts.iter().any(|part| part.target == t))
            })
            .collect()
    }

    /// Bytes held by its matrices.
    pub fn storage_bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .flatten()
            .map(LoraStack::storage_bytes)
            .sum()
    }

    pub(crate) fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub(crate) fn stack(&self, layer: usize, group: LoraGroup) -> Option<&LoraStack> {
        self.layers.get(layer)?[group.index()].as_ref()
    }
}

/// The adapters of one step and each token's slot among them: slot 0 is the base model,
/// slot `i + 1` is `adapters[i]`. An empty `slots` means every token is base.
#[derive(Debug, Clone, Default)]
pub struct LoraBatch {
    pub adapters: Vec<Arc<LoraAdapter>>,
    pub slots: Vec<u16>,
}

impl LoraBatch {
    pub fn clear(&mut self) {
        self.adapters.clear();
        self.slots.clear();
    }

    /// Whether any token of the step uses an adapter.
    pub fn is_active(&self) -> bool {
        !self.adapters.is_empty() && self.slots.iter().any(|&slot| slot != 0)
    }

    /// The slot of `adapter`, added to the step if new (compared by identity); `None` when
    /// the step already holds `u16::MAX` adapters.
    pub fn slot_of(&mut self, adapter: &Arc<LoraAdapter>) -> Option<u16> {
        if let Some(index) = self.adapters.iter().position(|a| Arc::ptr_eq(a, adapter)) {
            return u16::try_from(index + 1).ok();
        }
        let slot = u16::try_from(self.adapters.len() + 1).ok()?;
        self.adapters.push(Arc::clone(adapter));
        Some(slot)
    }
}

impl PartialEq for LoraBatch {
    /// Same adapters (by identity) and the same slots.
    fn eq(&self, other: &LoraBatch) -> bool {
        self.slots == other.slots
            && self.adapters.len() == other.adapters.len()
            && self
                .adapters
                .iter()
                .zip(&other.adapters)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}
