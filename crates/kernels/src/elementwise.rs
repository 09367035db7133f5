//! Row-wise elementwise kernels: RMSNorm, SiLU and GELU gating, residual add, softmax.
//!
//! These are memory-bound and tiny next to the matmuls; the compiler vectorizes the simple
//! loops. Reductions (RMSNorm's sum of squares, softmax's sum) use a fixed 8-lane order so
//! the result depends only on the row's values.

use crate::KernelError;

/// Sums `values` in 8 interleaved lanes then folds the lanes: a fixed order that the compiler
/// can keep in vector registers.
fn lane_sum(values: impl Iterator<Item = f32>) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (i, v) in values.enumerate() {
        lanes[i % 8] += v;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

fn sum_of_squares(row: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane += v * v;
        }
    }
    let tail = chunks.remainder().iter().map(|v| v * v);
    let folded = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    folded + lane_sum(tail)
}

/// `out = x / sqrt(mean(x²) + eps) * weight`, for each row of `weight.len()` values.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<(), KernelError> {
    let dim = weight.len();
    if dim == 0 || !x.len().is_multiple_of(dim) {
        return Err(KernelError::InvalidShape(
            "rms_norm input is not a whole number of rows of weight.len()",
        ));
    }
    if out.len() != x.len() {
        return Err(KernelError::LengthMismatch {
            what: "rms_norm output",
            expected: x.len(),
            actual: out.len(),
        });
    }
    for (row, out_row) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean = sum_of_squares(row) / dim as f32;
        let inverse = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(weight) {
            *o = v * inverse * w;
        }
    }
    Ok(())
}

/// Rows per pool task of [`rms_norm_rows`], [`add_rms_norm_rows`] and [`add_rows`]; a batch of
/// at most this many rows runs on the calling thread.
const NORM_ROWS: usize = 32;

/// [`rms_norm`] with the rows split over `pool`: each row's result depends on that row alone,
/// so it equals [`rms_norm`] bit for bit.
pub fn rms_norm_rows(
    pool: &crate::ThreadPool,
    x: &[f32],
    weight: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let dim = weight.len();
    // Shape errors as `rms_norm` reports them.
    if dim == 0 || !x.len().is_multiple_of(dim) || out.len() != x.len() {
        return rms_norm(x, weight, eps, out);
    }
    pool.for_row_chunks(
        x.len() / dim,
        NORM_ROWS,
        [out],
        [dim],
        &|first, rows, [out]| {
            // Shapes were checked above: whole rows of `dim`.
            let _ = rms_norm(&x[first * dim..(first + rows) * dim], weight, eps, out);
        },
    );
    Ok(())
}

/// The pre-norm residual step: `hidden += residual`, then `out = rms_norm(hidden)`, in one pass
/// over each row, rows split over `pool`. Equals [`add_inplace`] followed by [`rms_norm`] bit
/// for bit.
pub fn add_rms_norm_rows(
    pool: &crate::ThreadPool,
    hidden: &mut [f32],
    residual: &[f32],
    weight: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if residual.len() != hidden.len() {
        return Err(KernelError::LengthMismatch {
            what: "add_rms_norm residual",
            expected: hidden.len(),
            actual: residual.len(),
        });
    }
    let dim = weight.len();
    if dim == 0 || !hidden.len().is_multiple_of(dim) || out.len() != hidden.len() {
        return rms_norm(hidden, weight, eps, out);
    }
    let rows = hidden.len() / dim;
    pool.for_row_chunks(
        rows,
        NORM_ROWS,
        [hidden, out],
        [dim, dim],
        &|first, rows, [hidden, out]| {
            let residual = &residual[first * dim..(first + rows) * dim];
            for ((h, o), r) in hidden
                .chunks_exact_mut(dim)
                .zip(out.chunks_exact_mut(dim))
                .zip(residual.chunks_exact(dim))
            {
                // Shapes were checked above: whole rows of `dim`.
                let _ = add_inplace(h, r);
                let _ = rms_norm(h, weight, eps, o);
            }
        },
    );
    Ok(())
}

/// [`add_inplace`] with the rows (of `dim` values) split over `pool`.
pub fn add_rows(
    pool: &crate::ThreadPool,
    x: &mut [f32],
    y: &[f32],
    dim: usize,
) -> Result<(), KernelError> {
    if dim == 0 || x.len() != y.len() || !x.len().is_multiple_of(dim) {
        return add_inplace(x, y);
    }
    pool.for_row_chunks(y.len() / dim, NORM_ROWS, [x], [dim], &|first, rows, [x]| {
        let _ = add_inplace(x, &y[first * dim..(first + rows) * dim]);
    });
    Ok(())
}

/// `gate = silu(gate) * up`, with `silu(g) = g / (1 + e^-g)`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) -> Result<(), KernelError> {
    if gate.len() != up.len() {
        return Err(KernelError::LengthMismatch {
            what: "silu_mul up",
            expected: gate.len(),
            actual: up.len(),
        });
    }
    crate::simd::VectorOps::detect().silu_mul(gate, up);
    Ok(())
}

/// `gate = gelu_tanh(gate) * up`, with GELU's tanh approximation
/// `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g³)))` (Gemma's `gelu_pytorch_tanh`), evaluated
/// in f32 per element. llama.cpp instead looks the GELU up in an f16 table (input and result
/// rounded to f16), so the two differ by up to ~1e-3 relative per element.
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) -> Result<(), KernelError> {
    if gate.len() != up.len() {
        return Err(KernelError::LengthMismatch {
            what: "gelu_tanh_mul up",
            expected: gate.len(),
            actual: up.len(),
        });
    }
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEFFICIENT: f32 = 0.044_715;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + COEFFICIENT * x * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
    Ok(())
}

/// `gate = min(g, limit) · σ(alpha · min(g, limit)) · (clamp(up, ±limit) + 1)`: gpt-oss's
/// clamped SwiGLU (HF `GptOssExperts._apply_gate`, llama.cpp `swiglu_oai`), per element in
/// f32 with the C library's `exp` (scalar only: no SIMD twin to keep equal).
pub fn swiglu_oai_mul(
    gate: &mut [f32],
    up: &[f32],
    alpha: f32,
    limit: f32,
) -> Result<(), KernelError> {
    if gate.len() != up.len() {
        return Err(KernelError::LengthMismatch {
            what: "swiglu_oai_mul up",
            expected: gate.len(),
            actual: up.len(),
        });
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let y = u.clamp(-limit, limit);
        *g = x / (1.0 + (-alpha * x).exp()) * (y + 1.0);
    }
    Ok(())
}

/// The gate activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GateActivation {
    /// [`silu_mul`].
    Silu,
    /// [`gelu_tanh_mul`] (GELU's tanh approximation, Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// [`swiglu_oai_mul`] (gpt-oss: `alpha` 1.702, `limit` 7).
    SwigluOai {
        /// The sigmoid's slope.
        alpha: f32,
        /// Gate values are clamped above at `limit`, up values to `±limit`.
        limit: f32,
    },
}

/// Rows below which [`gated_rows`] stays on the calling thread (a decode step's one row is
/// microseconds of work, less than waking the pool).
const GATED_PARALLEL_MIN_ROWS: usize = 4;

/// For every row of `gate_up` (`[rows][2 * intermediate]`, the gate half then the up half):
/// the gate half becomes `act(gate) * up` ([`silu_mul`] or [`gelu_tanh_mul`] on that row alone)
/// and is copied to the row of `activated` (`[rows][intermediate]`). Rows are split over the
/// pool; a row's values never depend on the split.
pub fn gated_rows(
    pool: &crate::ThreadPool,
    activation: GateActivation,
    gate_up: &mut [f32],
    activated: &mut [f32],
    intermediate: usize,
) -> Result<(), KernelError> {
    if intermediate == 0 {
        return Ok(());
    }
    let rows = activated.len() / intermediate;
    if activated.len() != rows * intermediate || gate_up.len() != 2 * activated.len() {
        return Err(KernelError::LengthMismatch {
            what: "gated_rows gate_up",
            expected: 2 * activated.len(),
            actual: gate_up.len(),
        });
    }
    let run = |gate_up: &mut [f32], activated: &mut [f32]| -> Result<(), KernelError> {
        for (row, out) in gate_up
            .chunks_exact_mut(2 * intermediate)
            .zip(activated.chunks_exact_mut(intermediate))
        {
            let (gate, up) = row.split_at_mut(intermediate);
            match activation {
                GateActivation::Silu => silu_mul(gate, up)?,
                GateActivation::GeluTanh => gelu_tanh_mul(gate, up)?,
                GateActivation::SwigluOai { alpha, limit } => {
                    swiglu_oai_mul(gate, up, alpha, limit)?
                }
            }
            out.copy_from_slice(gate);
        }
        Ok(())
    };
    let threads = pool.num_threads();
    if rows < GATED_PARALLEL_MIN_ROWS || threads == 1 {
        return run(gate_up, activated);
    }
    let rows_per_task = rows.div_ceil(2 * threads);
    let n_tasks = rows.div_ceil(rows_per_task);
    let gate_up = crate::pool::SharedMut::new(gate_up);
    let outputs = crate::pool::SharedMut::new(activated);
    pool.parallel_for(n_tasks, &|task| {
        let first = task * rows_per_task;
        let count = rows_per_task.min(rows - first);
        // SAFETY: task `task` alone owns rows first..first + count of both buffers, whose
        // lengths (rows rows each) were checked above, and both outlive the parallel_for.
        let (gate_up, activated) = unsafe {
            (
                gate_up.slice_mut(first * 2 * intermediate, count * 2 * intermediate),
                outputs.slice_mut(first * intermediate, count * intermediate),
            )
        };
        // The lengths match by construction, so the only error (a length mismatch) cannot
        // occur here.
        let _ = run(gate_up, activated);
    });
    Ok(())
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) -> Result<(), KernelError> {
    if x.len() != y.len() {
        return Err(KernelError::LengthMismatch {
            what: "add_inplace y",
            expected: x.len(),
            actual: y.len(),
        });
    }
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
    Ok(())
}

/// Numerically stable softmax of one row, in place. `-inf` entries get probability 0; a row
/// that is entirely `-inf` (or empty) is left as zeros.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |acc, &v| acc.max(v));
    if max == f32::NEG_INFINITY {
        x.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    for v in x.iter_mut() {
        *v = (*v - max).exp();
    }
    let sum = lane_sum(x.iter().copied());
    let inverse = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inverse;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pooled row ops give exactly the serial ones, for batches of one chunk and of
    /// several (with a partial last chunk), on one thread and on two.
    #[test]
    fn pooled_row_ops_equal_the_serial_ones() {
        let dim = 72;
        let weight: Vec<f32> = (0..dim).map(|i| 0.5 + (i as f32 * 0.37).sin()).collect();
        for threads in [1, 2] {
            let pool = crate::ThreadPool::new(threads);
            for rows in [1, 5, NORM_ROWS, 3 * NORM_ROWS + 7] {
                let x: Vec<f32> = (0..rows * dim)
                    .map(|i| (i as f32 * 0.113).cos() * 3.0)
                    .collect();
                let y: Vec<f32> = (0..rows * dim).map(|i| (i as f32 * 0.071).sin()).collect();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();

                let mut want = vec![0.0f32; x.len()];
                rms_norm(&x, &weight, 1e-5, &mut want).unwrap();
                let mut got = vec![0.0f32; x.len()];
                rms_norm_rows(&pool, &x, &weight, 1e-5, &mut got).unwrap();
                assert_eq!(bits(&got), bits(&want), "rms_norm_rows, {rows} rows");

                let mut want_sum = x.clone();
                add_inplace(&mut want_sum, &y).unwrap();
                let mut got_sum = x.clone();
                add_rows(&pool, &mut got_sum, &y, dim).unwrap();
                assert_eq!(bits(&got_sum), bits(&want_sum), "add_rows, {rows} rows");

                rms_norm(&want_sum, &weight, 1e-5, &mut want).unwrap();
                let mut hidden = x.clone();
                add_rms_norm_rows(&pool, &mut hidden, &y, &weight, 1e-5, &mut got).unwrap();
                assert_eq!(
                    bits(&hidden),
                    bits(&want_sum),
                    "add_rms_norm_rows sum, {rows} rows"
                );
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "add_rms_norm_rows norm, {rows} rows"
                );
            }
        }
    }

    #[test]
    fn rms_norm_known_values() {
        // Row [3, 4]: mean square 12.5.
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0.0f32; 4];
        rms_norm(&x, &[1.0, 2.0], 1e-6, &mut out).unwrap();
        let inv = 1.0 / 12.5f32.sqrt();
        assert!((out[0] - 3.0 * inv).abs() < 1e-6);
        assert!((out[1] - 8.0 * inv).abs() < 1e-6);
        assert_eq!(&out[2..], &[0.0, 0.0]);
        assert!(rms_norm(&x, &[1.0, 1.0, 1.0], 0.0, &mut out).is_err());
    }

    #[test]
    fn rms_norm_matches_f64_on_odd_rows() {
        let dim = 37;
        let x: Vec<f32> = (0..dim * 3)
            .map(|i| ((i * 7919) % 23) as f32 / 7.0 - 1.5)
            .collect();
        let weight: Vec<f32> = (0..dim).map(|i| 0.5 + i as f32 / 50.0).collect();
        let mut out = vec![0.0; x.len()];
        rms_norm(&x, &weight, 1e-5, &mut out).unwrap();
        for (r, row) in x.chunks(dim).enumerate() {
            let ms: f64 = row
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / dim as f64;
            let inv = 1.0 / (ms + 1e-5).sqrt();
            for c in 0..dim {
                let expected = f64::from(row[c]) * inv * f64::from(weight[c]);
                assert!((f64::from(out[r * dim + c]) - expected).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn gated_rows_split_over_the_pool_equal_each_row_alone() {
        let mut rng = crate::test_util::Rng::new(41);
        let pool = crate::ThreadPool::new(2);
        let oai = GateActivation::SwigluOai {
            alpha: 1.702,
            limit: 7.0,
        };
        for activation in [GateActivation::Silu, GateActivation::GeluTanh, oai] {
            for (rows, intermediate) in [(1usize, 8usize), (3, 19), (4, 16), (17, 40), (64, 33)] {
                let gate_up = rng.vec(rows * 2 * intermediate, -6.0, 6.0);
                let mut pooled = gate_up.clone();
                let mut activated = vec![0.0f32; rows * intermediate];
                gated_rows(&pool, activation, &mut pooled, &mut activated, intermediate).unwrap();
                for row in 0..rows {
                    let start = row * 2 * intermediate;
                    let mut gate = gate_up[start..start + intermediate].to_vec();
                    let up = &gate_up[start + intermediate..start + 2 * intermediate];
                    match activation {
                        GateActivation::Silu => silu_mul(&mut gate, up).unwrap(),
                        GateActivation::GeluTanh => gelu_tanh_mul(&mut gate, up).unwrap(),
                        GateActivation::SwigluOai { alpha, limit } => {
                            swiglu_oai_mul(&mut gate, up, alpha, limit).unwrap()
                        }
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let what = format!("{activation:?} rows={rows} intermediate={intermediate}");
                    let out = &activated[row * intermediate..(row + 1) * intermediate];
                    assert_eq!(bits(out), bits(&gate), "{what} row {row}");
                    let in_place = &pooled[start..start + intermediate];
                    assert_eq!(bits(in_place), bits(&gate), "{what} row {row}");
                }
            }
        }
        let (mut gate_up, mut activated) = (vec![0.0f32; 10], vec![0.0f32; 4]);
        let err = gated_rows(&pool, GateActivation::Silu, &mut gate_up, &mut activated, 4);
        assert!(
            matches!(err, Err(KernelError::LengthMismatch { .. })),
            "{err:?}"
        );
    }

    /// gpt-oss's clamp: the gate is capped above only, `up` on both sides, then shifted by 1.
    #[test]
    fn swiglu_oai_clamps_and_shifts() {
        let (alpha, limit) = (1.702f32, 7.0f32);
        let gate = [-9.0f32, -1.0, 0.0, 0.5, 6.9, 7.0, 20.0];
        let up = [0.0f32, 10.0, -10.0, 1.5, -0.5, 7.5, -8.0];
        let mut out = gate;
        swiglu_oai_mul(&mut out, &up, alpha, limit).unwrap();
        for ((&g, &u), &o) in gate.iter().zip(&up).zip(&out) {
            let x = f64::from(g.min(limit));
            let y = f64::from(u.clamp(-limit, limit));
            let want = x / (1.0 + (-f64::from(alpha) * x).exp()) * (y + 1.0);
            assert!(
                (f64::from(o) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{g} {u}: {o} vs {want}"
            );
        }
        // A gate past the limit acts as the limit; `up` past it as ±limit.
        assert_eq!(out[6], {
            let mut capped = [7.0f32];
            swiglu_oai_mul(&mut capped, &[-7.0], alpha, limit).unwrap();
            capped[0]
        });
        assert!(swiglu_oai_mul(&mut [0.0; 2], &[0.0; 3], alpha, limit).is_err());
    }

    #[test]
    fn silu_mul_matches_scalar_formula() {
        let gate: Vec<f32> = (0..203).map(|i| (i as f32 - 101.0) * 0.37).collect();
        let up: Vec<f32> = (0..203).map(|i| 1.0 + i as f32 * 0.01).collect();
        let mut fast = gate.clone();
        silu_mul(&mut fast, &up).unwrap();
        for ((&g, &u), &f) in gate.iter().zip(&up).zip(&fast) {
            let want = f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u);
            assert!(
                (f64::from(f) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{g}: {f} vs {want}"
            );
        }
        let mut extremes = [
            200.0f32, -200.0, 0.0, -0.0, 88.0, -88.0, 1e-30, -1e-30, 50.0,
        ];
        silu_mul(&mut extremes, &[1.0; 9]).unwrap();
        assert_eq!(extremes[0], 200.0);
        assert!(extremes[1].abs() < 1e-30 && extremes[2] == 0.0);
        assert!(extremes.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn gelu_tanh_mul_matches_f64_formula() {
        let gate: Vec<f32> = (0..301).map(|i| (i as f32 - 150.0) * 0.11).collect();
        let up: Vec<f32> = (0..301).map(|i| 0.5 + i as f32 * 0.01).collect();
        let mut got = gate.clone();
        gelu_tanh_mul(&mut got, &up).unwrap();
        for ((&g, &u), &f) in gate.iter().zip(&up).zip(&got) {
            let x = f64::from(g);
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            let want = 0.5 * x * (1.0 + inner.tanh()) * f64::from(u);
            assert!(
                (f64::from(f) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{g}: {f} vs {want}"
            );
        }
        // Known points: gelu(0) = 0, gelu(1) ≈ 0.841192, large inputs pass or vanish.
        let mut points = [0.0f32, 1.0, 20.0, -20.0, 1e30, -1e30];
        gelu_tanh_mul(&mut points, &[1.0; 6]).unwrap();
        assert_eq!(points[0], 0.0);
        assert!((points[1] - 0.841_192).abs() < 1e-6, "{}", points[1]);
        assert_eq!(points[2], 20.0);
        assert_eq!(points[3], 0.0);
        assert!(gelu_tanh_mul(&mut [0.0; 2], &[1.0]).is_err());
    }

    #[test]
    fn silu_mul_known_values() {
        let mut gate = [0.0f32, 1.0, -2.0];
        silu_mul(&mut gate, &[5.0, 2.0, 1.0]).unwrap();
        assert_eq!(gate[0], 0.0);
        assert!((gate[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        assert!((gate[2] - (-2.0 / (1.0 + 2.0f32.exp()))).abs() < 1e-6);
    }

    #[test]
    fn add_and_softmax() {
        let mut x = [1.0f32, 2.0];
        add_inplace(&mut x, &[0.5, -2.0]).unwrap();
        assert_eq!(x, [1.5, 0.0]);
        let mut row = [0.0f32, (2.0f32).ln(), f32::NEG_INFINITY];
        softmax_inplace(&mut row);
        assert!((row[0] - 1.0 / 3.0).abs() < 1e-6);
        assert!((row[1] - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(row[2], 0.0);
        let mut dead = [f32::NEG_INFINITY; 3];
        softmax_inplace(&mut dead);
        assert_eq!(dead, [0.0; 3]);
    }
}
