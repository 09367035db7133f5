//! Normalization layers. RMSNorm with a plain weight is what every family computes; Gemma's
//! `(1 + w)` form is folded into the weight at load (`WeightReader::with_norm_shift`, for HF
//! checkpoints; GGUF converters have added the 1 already). [`LayerNorm`] (mean-centred, with a
//! bias) is what encoders (BERT) use.

use tokenmill_kernels::{
    add_layer_norm, add_rms_norm_rows, layer_norm, rms_norm, rms_norm_rows, ThreadPool,
};

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

    /// Values per row.
    pub fn width(&self) -> usize {
        self.weight.len()
    }

    /// [`RmsNorm::forward`] with the rows split over `pool` (the same result).
    pub fn forward_rows(&self, pool: &ThreadPool, x: &[f32], out: &mut [f32]) -> Result<()> {
        rms_norm_rows(pool, x, &self.weight, self.eps, out)?;
        Ok(())
    }

    /// `hidden += residual`, then `out` = the norm of `hidden`, in one pass over each row,
    /// rows split over `pool` (the same result as the add, then [`RmsNorm::forward`]).
    pub fn add_forward_rows(
        &self,
        pool: &ThreadPool,
        hidden: &mut [f32],
        residual: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        add_rms_norm_rows(pool, hidden, residual, &self.weight, self.eps, out)?;
        Ok(())
    }

    /// Norms `x` in place, through `scratch` (at least as long as `x`; its contents are
    /// left undefined).
    pub fn forward_in_place(&self, x: &mut [f32], scratch: &mut [f32]) -> Result<()> {
        let Some(scratch) = scratch.get_mut(..x.len()) else {
            return Err(crate::error::ModelError::InvalidBatch(
                "norm scratch shorter than its input".into(),
            ));
        };
        rms_norm(x, &self.weight, self.eps, scratch)?;
        x.copy_from_slice(scratch);
        Ok(())
    }
}

/// `out = (x - mean) / sqrt(var + eps) * weight + bias`, row by row over the weight's width.
#[derive(Debug)]
pub(crate) struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    pub fn new(weight: Vec<f32>, bias: Vec<f32>, eps: f32) -> LayerNorm {
        LayerNorm { weight, bias, eps }
    }

    pub fn storage_bytes(&self) -> usize {
        (self.weight.len() + self.bias.len()) * std::mem::size_of::<f32>()
    }

    pub fn forward(&self, pool: &ThreadPool, x: &[f32], out: &mut [f32]) -> Result<()> {
        layer_norm(pool, x, &self.weight, &self.bias, self.eps, out)?;
        Ok(())
    }

    /// The norm of `x + residual` (a post-norm residual connection), the sum not stored.
    pub fn forward_sum(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        residual: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        add_layer_norm(pool, x, residual, &self.weight, &self.bias, self.eps, out)?;
        Ok(())
    }
}
