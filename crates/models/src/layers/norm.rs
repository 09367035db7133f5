//! Normalization layers. RMSNorm with a plain weight is what the Llama family uses; Gemma's
//! `(1 + w)` form becomes a constructor that folds the 1 into the weight at load, LayerNorm
//! a sibling type with a bias.

use tokenmill_kernels::rms_norm;

use crate::error::Result;

/// `out = x / rms(x) * weight`, row by row over the weight's width.
#[derive(Debug)]
pub(crate) struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Vec<f32>, eps: f32) -> RmsNorm {
        RmsNorm { weight, eps }
    }

    pub fn forward(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        rms_norm(x, &self.weight, self.eps, out)?;
        Ok(())
    }
}
