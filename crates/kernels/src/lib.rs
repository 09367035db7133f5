//! tokenmill-kernels: the CPU compute layer of the engine.
//!
//! Everything numeric a transformer forward pass needs lives here, so the model code above it
//! stays safe, readable Rust and this crate alone carries `unsafe` (SIMD intrinsics and the
//! thread pool's job hand-off), each block with a `// SAFETY:` note and each SIMD kernel tested
//! against a scalar reference. Kernels pick AVX2+FMA at runtime when the CPU has them and fall
//! back to portable scalar code otherwise.
//!
//! # Key types and functions
//!
//! - [`DType`]: GGML element types (`F32`, `F16`, `BF16`, `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`,
//!   `Q5_1`, `IQ4_NL`, `Q4_K`, `Q5_K`, `Q6_K`, `IQ4_XS`, `MXFP4`) with
//!   `ggml_id`/`from_ggml_id`/`name`/`block_size`/`block_bytes`/`row_bytes`.
//! - [`dequantize`]`(dtype, bytes, &mut [f32])`: scalar reference decoder, bit-exact with GGML.
//!   [`quantize_row_q8_0`], [`quantize_row_q4_0`], [`quantize_row_q4_1`],
//!   [`quantize_row_q5_0`], [`quantize_row_q5_1`], [`quantize_row_mxfp4`] (GGML's reference
//!   quantizers), [`pack_mxfp4_block`] (MXFP4 bytes from chosen codes) and
//!   [`encode_float_row`] build test data; [`KVALUES_IQ4NL`] and [`KVALUES_MXFP4`] are GGML's
//!   IQ4 and MXFP4 level tables, [`e8m0_to_f32_half`] MXFP4's scale decoding.
//! - [`ThreadPool`]: persistent workers (spin ~300 µs, then park); `parallel_for(n_tasks,
//!   &|task| ...)` runs on the caller and the workers and returns when all tasks are done. A
//!   task panic is caught and re-raised on the caller after all tasks stop; nested calls run
//!   serially.
//! - [`QMatrix`]: a linear layer weight `[out_features, in_features]`
//!   (`from_bytes(dtype, out, in, &bytes)`, `from_f32`), with
//!   `matmul(&pool, x, n, out, &mut MatmulScratch)` computing `out[n, out] = x[n, in] · Wᵀ` and
//!   `row_to_f32(row, dst)` for embedding lookups; `QMatrix::matmul_segments(&pool,`
//!   [`Segments`]`, x, out, &mut MatmulScratch)` runs several matrices of one shape over their
//!   own runs of rows (a mixture-of-experts layer's experts) in one parallel region, bitwise
//!   equal to one `matmul` per segment. [`reference_matmul`] is the f64 reference.
//!   Quantized layers quantize activations per 32 values to int8 and use exact integer block
//!   dots (AVX2 `maddubs`/`madd`), four activation rows per weight-row pass, split over the pool
//!   by output rows; from 8 activation rows (more for some types: `matmul/amx.rs` `min_rows`) the quantized group layouts run on AMX int8 tiles
//!   where the process may use them ([`amx_enabled`]: AMX present, the Linux tile-data
//!   permission granted — requested once, by [`ThreadPool::new`] — and [`AMX_ENV`] not `0`),
//!   bitwise equal to the AVX2 and scalar paths. F16/BF16 weights stay 16-bit and are widened in
//!   registers. Repacked weights live in huge-page-backed buffers where Linux allows it
//!   ([`HUGE_PAGES_ENV`]`=0` switches that off).
//! - Elementwise: [`rms_norm`] (and, rows over the pool, [`rms_norm_rows`],
//!   [`add_rms_norm_rows`], [`add_rows`]), [`silu_mul`], [`gelu_tanh_mul`], [`add_inplace`],
//!   [`softmax_inplace`].
//! - Encoders (BERT): [`layer_norm`] (with bias), [`gelu_erf_inplace`] (exact GELU) and
//!   [`bidirectional_attention`] over whole sequences ([`EncoderSeq`]) straight from the fused
//!   QKV projection, no KV cache.
//! - RoPE: [`RopeCache`] (`new(rotary_dim, theta, max_positions, RopeScaling)`, angles in f64
//!   stored as f32; positions past the table are computed on the fly identically) and
//!   [`apply_rope`]`(x, n_tokens, n_heads, head_dim, positions, &cache, RopeStyle)`, rotating
//!   the first `rotary_dim` dims of each head.
//! - Paged attention: [`write_kv`] scatters new K/V rows into the cache by slot
//!   (`slot = block_id * block_size + offset`, [`PADDING_SLOT`] skips a token), encoding them
//!   into the cache's [`KvCacheDType`] (f32, f16, bf16, fp8 E4M3 or E5M2; owned as a
//!   [`KvCacheBuffer`], borrowed as [`KvCacheSlice`]/[`KvCacheSliceMut`]);
//!   [`paged_attention`] runs causal GQA attention over a flattened batch of sequences
//!   ([`AttentionSeq`]) described by [`AttentionParams`] (optionally within a sliding
//!   window); [`reference_attention`] is the naive
//!   materialized-softmax reference. Rows of `out` not covered by any sequence are left as
//!   they were.
//! - [`CpuFeatures`]: the CPU's features, detected once per process; every kernel family
//!   derives its path from it (matmul: [`KernelPath`] AVX-512 VNNI, AVX-VNNI, AVX2 or scalar;
//!   `TOKENMILL_KERNELS` may force a slower one), and [`CpuFeatures::summary`] names them in
//!   one line for logs and bench reports.
//! - Machine peaks for benchmark reports: [`fma_peak_gflops`] (register-resident AVX2 FMA loop)
//!   and [`read_bandwidth_gbs`] (multi-threaded streaming read).
//!
//! Shape and index mistakes return [`KernelError`]; kernels never panic on bad input. Hot paths
//! allocate nothing per call once [`MatmulScratch`] has grown (attention allocates only two
//! small per-call index vectors; its tasks work on the stack, plus a per-thread tile scratch,
//! grown once, when the KV cache is not f32).
//!
//! # Usage loop (one forward step)
//!
//! ```
//! use tokenmill_kernels::{QMatrix, MatmulScratch, ThreadPool, rms_norm};
//!
//! let pool = ThreadPool::new(2);
//! let weight = QMatrix::from_f32(2, 3, &[1.0, 0.0, 0.0, 0.0, 1.0, 1.0]).unwrap();
//! let mut scratch = MatmulScratch::new();
//! let x = [1.0f32, 2.0, 3.0];
//! let mut normed = [0.0f32; 3];
//! rms_norm(&x, &[1.0, 1.0, 1.0], 1e-6, &mut normed).unwrap();
//! let mut out = [0.0f32; 2];
//! weight.matmul(&pool, &x, 1, &mut out, &mut scratch).unwrap();
//! assert_eq!(out, [1.0, 5.0]);
//! ```
//!
//! # Determinism
//!
//! Every result is a pure function of its inputs: a row's matmul output does not depend on the
//! batch size, the other rows, or the thread count, and one sequence's attention output does
//! not depend on the other sequences in the batch. This is what lets the engine promise that a
//! request's output does not depend on what it was batched with.

// The workspace denies `unsafe_code`; this crate is where SIMD intrinsics and the pool's job
// hand-off live, each block with its `// SAFETY:` note (ARCHITECTURE.md invariant 6).
#![allow(unsafe_code)]

mod aligned;
mod attention;
mod cpu;
mod dtype;
mod elementwise;
mod encoder;
mod gated_delta;
mod kv_dtype;
mod matmul;
mod peak;
mod pool;
mod quant;
mod rope;
mod simd;
#[cfg(test)]
mod test_util;
mod weight_buf;

pub use attention::{
    paged_attention, paged_attention_with_sinks, reference_attention,
    reference_attention_with_sinks, write_kv, AttentionParams, AttentionSeq, PADDING_SLOT,
};
pub use cpu::{
    amx_enabled, runtime_summary, CpuFeatures, KernelPath, KernelsOverride, AMX_ENV, KERNELS_ENV,
};
pub use dtype::{bf16_to_f32, e8m0_to_f32_half, f16_to_f32, f32_to_bf16, f32_to_f16, DType};
pub use elementwise::{
    add_inplace, add_rms_norm_rows, add_rows, gated_rows, gelu_tanh_mul, rms_norm, rms_norm_rows,
    silu_mul, softmax_inplace, swiglu_oai_mul, GateActivation,
};
pub use encoder::{
    add_layer_norm, bidirectional_attention, gelu_erf_inplace, layer_norm, Bf16PanelMatrix,
    EncoderAttentionShape, EncoderSeq, Int8PairMatrix, PanelMatrix, VDPBF16PS_ENV,
};
pub use gated_delta::{
    causal_conv1d_silu, gated_delta_rule, gated_delta_rule_on, l2_normalize_rows, sigmoid, silu,
    softplus, DeltaRuleInputs, DeltaRulePath, DeltaRuleSeq, DeltaRuleShape, KeyHeadOrder,
    MAX_HEAD_V_DIM,
};
pub use kv_dtype::{
    f32_to_bf16_saturating, f32_to_f16_saturating, f32_to_fp8_e4m3, f32_to_fp8_e5m2,
    fp8_e4m3_to_f32, fp8_e5m2_to_f32, KvCacheBuffer, KvCacheDType, KvCacheSlice, KvCacheSliceMut,
};
pub use matmul::{reference_matmul, MatmulScratch, QMatrix, Segments};
pub use peak::{fma_peak_gflops, read_bandwidth_gbs};
pub use pool::ThreadPool;
pub use quant::{
    dequantize, encode_float_row, pack_mxfp4_block, quantize_row_mxfp4, quantize_row_q4_0,
    quantize_row_q4_1, quantize_row_q5_0, quantize_row_q5_1, quantize_row_q8_0, KVALUES_IQ4NL,
    KVALUES_MXFP4, QK, QK_K,
};
pub use rope::{apply_rope, RopeCache, RopeScaling, RopeStyle};
pub use weight_buf::HUGE_PAGES_ENV;

/// Errors from kernel entry points: always a caller's shape or type mistake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A row length is not a whole number of quantization blocks.
    #[error("{dtype} rows need a multiple of {block_size} elements, got {n_elements}")]
    NotBlockAligned {
        /// The element type.
        dtype: DType,
        /// The offending element count.
        n_elements: usize,
        /// Elements per block of `dtype`.
        block_size: usize,
    },
    /// A buffer has the wrong length for the shape given.
    #[error("{what}: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// Length implied by the shape.
        expected: usize,
        /// Length passed.
        actual: usize,
    },
    /// An index (row, block id, slot, position) is outside its range.
    #[error("{what} {index} out of range (len {len})")]
    IndexOutOfRange {
        /// What was indexed.
        what: &'static str,
        /// The index.
        index: usize,
        /// The valid length.
        len: usize,
    },
    /// A kernel path this process may not run: the CPU lacks its features, or
    /// `TOKENMILL_KERNELS` narrowed them away.
    #[error("the {0} kernel path is not available in this process (CPU lacks it or TOKENMILL_KERNELS excludes it)")]
    UnsupportedKernelPath(KernelPath),
    /// Parameters that cannot describe a valid computation.
    #[error("invalid shape: {0}")]
    InvalidShape(&'static str),
    /// The operation does not support this element type.
    #[error("{operation} does not support {dtype}")]
    UnsupportedDType {
        /// The element type.
        dtype: DType,
        /// The operation.
        operation: &'static str,
    },
}
