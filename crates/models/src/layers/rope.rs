//! Rotary position embeddings: one precomputed table and the pair layout it rotates. A family
//! with two tables (Gemma 3's local and global layers) holds two of these and picks per layer.

use tokenmill_kernels::{apply_rope, RopeCache};

use crate::config::{ModelConfig, RopeScaling, RopeStyle};
use crate::error::{ModelError, Result};

/// The table covers the trained context (capped); positions beyond it are computed on the fly.
const MAX_TABLE_POSITIONS: usize = 1 << 17;

#[derive(Debug)]
pub(crate) struct Rope {
    table: RopeCache,
    style: tokenmill_kernels::RopeStyle,
}

impl Rope {
    /// The table `config`'s rotary dims, base, scaling and context length describe.
    pub fn from_config(config: &ModelConfig) -> Result<Rope> {
        Rope::new(config, config.rope_theta, config.rope_scaling)
    }

    /// The table of `config`'s sliding-window layers: base `rope_local_theta` without scaling
    /// (Gemma 3's local layers, as llama.cpp and HF compute them), or `None` when they share
    /// the global table.
    pub fn local_from_config(config: &ModelConfig) -> Result<Option<Rope>> {
        config
            .rope_local_theta
            .map(|theta| Rope::new(config, theta, RopeScaling::None))
            .transpose()
    }

    /// A table of `rotary_dim` dims at base `theta` whose pair `i` turns `factors[i]` times
    /// slower (Gemma 4's proportional RoPE: 1 for the rotated pairs, infinite or huge for
    /// the others), without scaling.
    pub fn with_factors(
        config: &ModelConfig,
        rotary_dim: usize,
        theta: f32,
        factors: &[f32],
    ) -> Result<Rope> {
        let max_positions = config.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let table =
            RopeCache::with_frequency_factors(rotary_dim, theta, max_positions, factors, 1.0)?;
        Ok(Rope {
            table,
            style: kernel_style(config.rope_style),
        })
    }

    fn new(config: &ModelConfig, theta: f32, scaling: RopeScaling) -> Result<Rope> {
        let max_positions = config.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let style = kernel_style(config.rope_style);
        if let RopeScaling::LongRope { attn_factor, .. } = scaling {
            let factors = config
                .rope_freq_factors
                .as_deref()
                .ok_or_else(|| ModelError::MissingMetadata("LongRoPE frequency factors".into()))?;
            let table = RopeCache::with_frequency_factors(
                config.rotary_dim,
                theta,
                max_positions,
                factors,
                attn_factor,
            )?;
            return Ok(Rope { table, style });
        }
        let scaling = match scaling {
            RopeScaling::None => tokenmill_kernels::RopeScaling::None,
            RopeScaling::Linear { factor } => tokenmill_kernels::RopeScaling::Linear { factor },
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => tokenmill_kernels::RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            },
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => tokenmill_kernels::RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            },
            RopeScaling::LongRope { .. } => tokenmill_kernels::RopeScaling::None,
        };
        let table = RopeCache::new(config.rotary_dim, theta, max_positions, scaling)?;
        Ok(Rope { table, style })
    }

    /// Rotates every head of `x[n][heads][head_dim]` by its token's position.
    pub fn apply(
        &self,
        x: &mut [f32],
        heads: usize,
        head_dim: usize,
        positions: &[u32],
    ) -> Result<()> {
        apply_rope(
            x,
            positions.len(),
            heads,
            head_dim,
            positions,
            &self.table,
            self.style,
        )?;
        Ok(())
    }
}

fn kernel_style(style: RopeStyle) -> tokenmill_kernels::RopeStyle {
    match style {
        RopeStyle::Normal => tokenmill_kernels::RopeStyle::Normal,
        RopeStyle::Neox => tokenmill_kernels::RopeStyle::Neox,
    }
}
