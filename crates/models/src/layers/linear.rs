//! Linear layers over the compute layer's [`QMatrix`]: the one place a weight multiplies
//! activations, so a LoRA adapter hooks in here (an extra low-rank product added to `out`)
//! rather than in every family.

use tokenmill_kernels::{MatmulScratch, QMatrix, Segments, ThreadPool};

use super::lora::LoraScratch;
use crate::error::Result;

/// Scratch shared by every linear layer of a step: the kernel's quantized-activation buffer
/// and the per-part output of a [`StackedLinear`] whose parts stay separate.
#[derive(Debug, Default)]
pub(crate) struct LinearScratch {
    matmul: MatmulScratch,
    part: Vec<f32>,
    /// The LoRA updates' gathered rows and intermediates.
    pub lora: LoraScratch,
}

/// `y = x · Wᵀ` with `W` of shape `[out_features, in_features]` in any [`DType`]
/// (`tokenmill_kernels::DType`); quantized or float weights are a choice of matrix, not of
/// model.
#[derive(Debug)]
pub(crate) struct Linear {
    weight: QMatrix,
}

impl Linear {
    pub fn new(weight: QMatrix) -> Linear {
        Linear { weight }
    }

    pub fn storage_bytes(&self) -> usize {
        self.weight.storage_bytes()
    }

    /// `out[n][out_features] = x[n][in_features] · Wᵀ` on `pool`.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut LinearScratch,
    ) -> Result<()> {
        self.weight.matmul(pool, x, n, out, &mut scratch.matmul)?;
        Ok(())
    }
}

/// `out = x · W(s)ᵀ` over the row segments of `segments` (a mixture-of-experts layer's experts,
/// each over its routed rows) in one call: see [`QMatrix::matmul_segments`].
pub(crate) fn matmul_segments(
    pool: &ThreadPool,
    segments: Segments<'_, '_>,
    x: &[f32],
    out: &mut [f32],
    scratch: &mut LinearScratch,
) -> Result<()> {
    QMatrix::matmul_segments(pool, segments, x, out, &mut scratch.matmul)?;
    Ok(())
}

/// Reads one row of an embedding table per token into `out[n][width]`. The table is a
/// [`Linear`] because a tied output head multiplies by the same matrix.
pub(crate) fn embed(table: &Linear, tokens: &[u32], out: &mut [f32], width: usize) -> Result<()> {
    for (row, &token) in out.chunks_exact_mut(width).zip(tokens) {
        table.weight.row_to_f32(token as usize, row)?;
    }
    Ok(())
}

/// A table read one row at a time and never multiplied (Gemma 4's per-layer embeddings, too
/// big to repack or dequantize whole): the file's bytes in its own type (left in a GGUF's
/// memory map), each row turned to f32 when a token asks for it.
#[derive(Debug)]
pub(crate) struct RowTable {
    dtype: tokenmill_kernels::DType,
    bytes: RowBytes,
    rows: usize,
    columns: usize,
}

/// Where a [`RowTable`]'s bytes are.
#[derive(Debug)]
pub(crate) enum RowBytes {
    /// In the GGUF file's memory map (read from disk as rows are touched).
    Mapped(tokenmill_gguf::TensorBytes),
    /// Read into memory (safetensors).
    Owned(Vec<u8>),
}

impl RowBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            RowBytes::Mapped(bytes) => bytes.as_slice(),
            RowBytes::Owned(bytes) => bytes,
        }
    }
}

impl RowTable {
    /// `bytes` holds `rows` rows of `columns` values of `dtype`, each a whole number of
    /// the type's blocks.
    pub fn new(
        dtype: tokenmill_kernels::DType,
        bytes: RowBytes,
        rows: usize,
        columns: usize,
    ) -> crate::error::Result<RowTable> {
        let len = bytes.as_slice().len();
        if rows == 0 || !len.is_multiple_of(rows) {
            return Err(crate::error::ModelError::InvalidBatch(format!(
                "a {rows}-row table of {len} bytes"
            )));
        }
        Ok(RowTable {
            dtype,
            bytes,
            rows,
            columns,
        })
    }

    /// Bytes of the table (in the file's memory map for a GGUF: resident only as touched).
    pub fn storage_bytes(&self) -> usize {
        self.bytes.as_slice().len()
    }

    /// Row `row` as f32 into `out` (`columns` long).
    pub fn row_to_f32(&self, row: usize, out: &mut [f32]) -> Result<()> {
        if row >= self.rows || out.len() != self.columns {
            return Err(crate::error::ModelError::InvalidBatch(format!(
                "row {row} of a {}-row table into {} values (rows are {})",
                self.rows,
                out.len(),
                self.columns
            )));
        }
        let bytes = self.bytes.as_slice();
        let row_bytes = bytes.len() / self.rows;
        tokenmill_kernels::dequantize(
            self.dtype,
            &bytes[row * row_bytes..(row + 1) * row_bytes],
            out,
        )?;
        Ok(())
    }
}

/// Several linear layers over the same input whose outputs are read side by side
/// (`[q | k | v]`, `[gate | up]`). Parts of one type are fused into one matrix at load, so
/// usually this is a single matmul.
#[derive(Debug)]
pub(crate) struct StackedLinear {
    parts: Vec<QMatrix>,
    width: usize,
}

impl StackedLinear {
    pub fn new(parts: Vec<QMatrix>) -> StackedLinear {
        let width = parts.iter().map(QMatrix::out_features).sum();
        StackedLinear { parts, width }
    }

    pub fn storage_bytes(&self) -> usize {
        self.parts.iter().map(QMatrix::storage_bytes).sum()
    }

    /// Whether the stack is one matrix (its parts fused at load).
    pub fn is_single(&self) -> bool {
        self.parts.len() == 1
    }

    /// The one matrix this stack is when its parts were fused at load (parts of one type);
    /// the stack itself back otherwise.
    pub fn into_single(mut self) -> std::result::Result<QMatrix, StackedLinear> {
        if self.is_single() {
            if let Some(single) = self.parts.pop() {
                return Ok(single);
            }
        }
        Err(self)
    }

    /// `out[n][width]`: each part's output in its columns, in order.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut LinearScratch,
    ) -> Result<()> {
        if let [single] = self.parts.as_slice() {
            single.matmul(pool, x, n, out, &mut scratch.matmul)?;
            return Ok(());
        }
        let part = &mut scratch.part;
        let mut column = 0;
        for matrix in &self.parts {
            let width = matrix.out_features();
            part.clear();
            part.resize(n * width, 0.0);
            matrix.matmul(pool, x, n, part, &mut scratch.matmul)?;
            for (out_row, part_row) in out
                .chunks_exact_mut(self.width)
                .zip(part.chunks_exact(width))
            {
                out_row[column..column + width].copy_from_slice(part_row);
            }
            column += width;
        }
        Ok(())
    }
}
