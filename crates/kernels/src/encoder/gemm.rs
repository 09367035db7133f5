//! The encoder's f32 GEMM: `out[n][out] = x[n][in] · Wᵀ (+ bias)` for many rows at once.
//!
//! The decoder's float matmul ([`crate::QMatrix`]) is a dot-product kernel built for one to
//! four activation rows; an encoder step multiplies thousands of rows by small matrices, where
//! a register-blocked outer-product kernel does about three times the work per cycle. The
//! weights are packed once at load into panels of [`NR`] output columns (`[panel][in][NR]`,
//! the last panel zero-padded), and a micro-kernel keeps a tile of up to [`MR`] rows × [`NR`]
//! columns in registers, broadcasting one input value per row against one panel row per step.
//!
//! Every output is one fused multiply-add chain over the inputs in index order, started from
//! its bias (or zero): `acc = fma(x[k], w[k], acc)`. No output's arithmetic depends on which
//! tile, task or batch it landed in, so a row's result does not depend on the other rows, and
//! the AVX2 and AVX-512 kernels are bitwise equal to their scalar twin (`f32::mul_add` is the
//! same correctly rounded fused operation as `vfmadd`).

use crate::pool::{SharedMut, ThreadPool};
use crate::simd::VectorOps;
use crate::KernelError;

/// Output columns per packed panel (two AVX2 vectors, one AVX-512 vector).
pub(super) const NR: usize = 16;
/// Most rows one micro-kernel call keeps in registers: 6 on AVX2 (12 accumulators of 16
/// registers), 12 on AVX-512 (12 accumulators of 32, enough independent chains to keep both
/// FMA ports busy).
pub(super) const MAX_MR: usize = 12;
/// Rows per task: four to eight micro-tiles share each panel while it is in cache.
const ROW_BLOCK: usize = 48;

/// The micro-kernel a [`PanelMatrix`] product runs, picked at run time from [`KernelPath`]
/// (so `TOKENMILL_KERNELS` narrows it as it does the quantized kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemmKernel {
    Scalar,
    /// AVX2 + FMA: 6 rows × two 8-wide vectors.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 F: 12 rows × one 16-wide vector.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl GemmKernel {
    /// The fastest kernel this process may run.
    pub(crate) fn detect() -> GemmKernel {
        #[cfg(target_arch = "x86_64")]
        {
            if super::vector::avx512_usable() {
                return GemmKernel::Avx512;
            }
            if matches!(VectorOps::detect(), VectorOps::Avx2 | VectorOps::Avx512) {
                return GemmKernel::Avx2;
            }
        }
        GemmKernel::Scalar
    }

    /// Every kernel this process may run, the scalar twin first (for tests).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<GemmKernel> {
        let mut kernels = vec![GemmKernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if matches!(VectorOps::detect(), VectorOps::Avx2 | VectorOps::Avx512) {
                kernels.push(GemmKernel::Avx2);
            }
            if GemmKernel::detect() == GemmKernel::Avx512 {
                kernels.push(GemmKernel::Avx512);
            }
        }
        kernels
    }

    /// Rows per micro-tile.
    pub(super) fn rows(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            GemmKernel::Avx512 => MAX_MR,
            _ => 6,
        }
    }
}

/// An f32 weight `[out_features, in_features]` packed for [`PanelMatrix::matmul`].
#[derive(Debug, Clone)]
pub struct PanelMatrix {
    out_features: usize,
    in_features: usize,
    /// `[panel][in_features][NR]`: column `j` of panel `p` is output `p * NR + j`.
    panels: Vec<f32>,
}

impl PanelMatrix {
    /// Packs row-major weights `[out_features][in_features]`.
    pub fn from_rows(
        out_features: usize,
        in_features: usize,
        values: &[f32],
    ) -> Result<PanelMatrix, KernelError> {
        if in_features == 0 {
            return Err(KernelError::InvalidShape("panel matrix with no inputs"));
        }
        if values.len() != out_features * in_features {
            return Err(KernelError::LengthMismatch {
                what: "panel matrix values",
                expected: out_features * in_features,
                actual: values.len(),
            });
        }
        let num_panels = out_features.div_ceil(NR);
        let mut panels = vec![0.0f32; num_panels * in_features * NR];
        for (row, weights) in values.chunks_exact(in_features).enumerate() {
            let (panel, column) = (row / NR, row % NR);
            let base = panel * in_features * NR;
            for (k, &w) in weights.iter().enumerate() {
                panels[base + k * NR + column] = w;
            }
        }
        Ok(PanelMatrix {
            out_features,
            in_features,
            panels,
        })
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Bytes held (including the last panel's padding).
    pub fn storage_bytes(&self) -> usize {
        self.panels.len() * 4
    }

    /// The packed panels, `[panel][in_features][NR]`.
    pub(super) fn panels(&self) -> &[f32] {
        &self.panels
    }

    /// `out[n][out_features] = x[n][in_features] · Wᵀ + bias` on `pool` (no bias: zero).
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_with(GemmKernel::detect(), pool, x, n, bias, out)
    }

    pub(crate) fn matmul_with(
        &self,
        kernel: GemmKernel,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let (k, width) = (self.in_features, self.out_features);
        let names = [
            "panel matmul input",
            "panel matmul output",
            "panel matmul bias",
        ];
        if !check_lengths(names, k, width, x, n, bias, out)? {
            return Ok(());
        }
        let bias = bias.map_or(Bias::None, Bias::Init);
        run_panels(
            pool,
            x,
            n,
            k,
            &self.panels,
            width,
            kernel.rows(),
            bias,
            out,
            &|x, panel, init, tile| micro_tile(kernel, x, k, panel, init, tile),
        );
        Ok(())
    }
}

/// The argument check every encoder GEMM starts with: `x` holds `n` rows of `k`, `out` `n`
/// rows of `width`, the bias (if any) `width` values; `names` are the input, output and bias
/// as the errors name them. `Ok(false)`: the product is empty, nothing to compute.
pub(super) fn check_lengths(
    names: [&'static str; 3],
    k: usize,
    width: usize,
    x: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    out: &[f32],
) -> Result<bool, KernelError> {
    let [input, output, bias_name] = names;
    for (what, expected, actual) in [
        (input, n * k, x.len()),
        (output, n * width, out.len()),
        (bias_name, width, bias.map_or(width, <[f32]>::len)),
    ] {
        if expected != actual {
            return Err(KernelError::LengthMismatch {
                what,
                expected,
                actual,
            });
        }
    }
    Ok(n != 0 && width != 0)
}

/// Where a panel product's bias goes.
#[derive(Clone, Copy)]
pub(super) enum Bias<'a> {
    None,
    /// Each output's chain starts from its bias (the f32 path).
    Init(&'a [f32]),
    /// Chains start from zero; the bias is added to the finished sum and a NaN result is
    /// written as the one canonical quiet NaN (the bf16 path, whose kernels may differ in NaN
    /// payloads).
    After(&'a [f32]),
}

/// One micro-tile: rows of `x` (each `k` elements) against one panel (`k` rows of [`NR`]),
/// every output's chain started from `init`, into `tile`.
pub(super) type MicroTile<'a, T> =
    dyn Fn(&[T], &[T], &[f32; NR], &mut [[f32; NR]; MAX_MR]) + Sync + 'a;

/// The panel product's driver, shared by the f32 and bf16 matrices: `out[n][width]` from
/// `x[n][k]` and `panels[panel][k][NR]`, tasks over (row block, panel group) on `pool`, each
/// output computed by one `micro` call whatever task or tile it lands in.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_panels<T: Copy + Sync>(
    pool: &ThreadPool,
    x: &[T],
    n: usize,
    k: usize,
    panels: &[T],
    width: usize,
    tile_rows: usize,
    bias: Bias<'_>,
    out: &mut [f32],
    micro: &MicroTile<'_, T>,
) {
    let num_panels = width.div_ceil(NR);
    let row_blocks = n.div_ceil(ROW_BLOCK);
    // Few row blocks (short batches): one panel per task so every thread has work.
    let panels_per_task = if row_blocks >= 4 * pool.num_threads() {
        4
    } else {
        1
    };
    let panel_groups = num_panels.div_ceil(panels_per_task);
    let output = SharedMut::new(out);
    pool.parallel_for(row_blocks * panel_groups, &|task| {
        let (block, group) = (task / panel_groups, task % panel_groups);
        let rows = block * ROW_BLOCK..((block + 1) * ROW_BLOCK).min(n);
        let first_panel = group * panels_per_task;
        for panel in first_panel..(first_panel + panels_per_task).min(num_panels) {
            let weights = &panels[panel * k * NR..(panel + 1) * k * NR];
            let first_column = panel * NR;
            let columns = NR.min(width - first_column);
            let (init, after) = match bias {
                Bias::None => ([0.0; NR], None),
                Bias::Init(bias) => (panel_bias(Some(bias), first_column, columns), None),
                Bias::After(bias) => (
                    [0.0; NR],
                    Some(panel_bias(Some(bias), first_column, columns)),
                ),
            };
            let mut row = rows.start;
            while row < rows.end {
                let m = tile_rows.min(rows.end - row);
                let mut tile = [[0.0f32; NR]; MAX_MR];
                micro(&x[row * k..(row + m) * k], weights, &init, &mut tile);
                for (r, values) in tile[..m].iter().enumerate() {
                    for (c, &value) in values[..columns].iter().enumerate() {
                        let value = match &after {
                            None => value,
                            Some(bias) => {
                                let sum = value + bias[c];
                                if sum.is_nan() {
                                    f32::NAN
                                } else {
                                    sum
                                }
                            }
                        };
                        // SAFETY: this task alone owns rows `rows` × the columns of its
                        // panels, and the index lies inside `out` (the callers check its
                        // length is n × width).
                        unsafe { output.write((row + r) * width + first_column + c, value) };
                    }
                }
                row += m;
            }
        }
    });
}

/// The bias of one panel's columns, zero past the matrix's width.
fn panel_bias(bias: Option<&[f32]>, first_column: usize, columns: usize) -> [f32; NR] {
    let mut init = [0.0f32; NR];
    if let Some(bias) = bias {
        init[..columns].copy_from_slice(&bias[first_column..first_column + columns]);
    }
    init
}

/// `tile[r][j] = init[j] + Σ_c x[r][c] · panel[c][j]` for the `x.len() / k` rows (at most
/// `kernel.rows()`).
pub(super) fn micro_tile(
    kernel: GemmKernel,
    x: &[f32],
    k: usize,
    panel: &[f32],
    init: &[f32; NR],
    tile: &mut [[f32; NR]; MAX_MR],
) {
    let m = x.len() / k;
    match kernel {
        #[cfg(target_arch = "x86_64")]
        GemmKernel::Avx2 => {
            // SAFETY: `GemmKernel::Avx2` is only built after detecting AVX2 and FMA; `x` holds
            // `m` rows of `k`, `panel` `k` rows of `NR`, and `m <= 6` (the caller's tiles).
            unsafe {
                match m {
                    1 => avx2::micro_tile::<1>(x, k, panel, init, tile),
                    2 => avx2::micro_tile::<2>(x, k, panel, init, tile),
                    3 => avx2::micro_tile::<3>(x, k, panel, init, tile),
                    4 => avx2::micro_tile::<4>(x, k, panel, init, tile),
                    5 => avx2::micro_tile::<5>(x, k, panel, init, tile),
                    _ => avx2::micro_tile::<6>(x, k, panel, init, tile),
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        GemmKernel::Avx512 => {
            // SAFETY: `GemmKernel::Avx512` is only built when `KernelPath::Avx512` is usable
            // (AVX-512 F detected); `x` holds `m` rows of `k`, `panel` `k` rows of `NR`, and
            // `m <= MAX_MR` (the caller's tiles).
            unsafe {
                match m {
                    1 => avx512::micro_tile::<1>(x, k, panel, init, tile),
                    2 => avx512::micro_tile::<2>(x, k, panel, init, tile),
                    3 => avx512::micro_tile::<3>(x, k, panel, init, tile),
                    4 => avx512::micro_tile::<4>(x, k, panel, init, tile),
                    5 => avx512::micro_tile::<5>(x, k, panel, init, tile),
                    6 => avx512::micro_tile::<6>(x, k, panel, init, tile),
                    7 => avx512::micro_tile::<7>(x, k, panel, init, tile),
                    8 => avx512::micro_tile::<8>(x, k, panel, init, tile),
                    9 => avx512::micro_tile::<9>(x, k, panel, init, tile),
                    10 => avx512::micro_tile::<10>(x, k, panel, init, tile),
                    11 => avx512::micro_tile::<11>(x, k, panel, init, tile),
                    _ => avx512::micro_tile::<MAX_MR>(x, k, panel, init, tile),
                }
            }
        }
        GemmKernel::Scalar => scalar_micro_tile(x, k, panel, init, tile),
    }
}

/// The scalar twin: the same fused chain per output, in the same order.
fn scalar_micro_tile(
    x: &[f32],
    k: usize,
    panel: &[f32],
    init: &[f32; NR],
    tile: &mut [[f32; NR]; MAX_MR],
) {
    for (row, out) in x.chunks_exact(k).zip(tile.iter_mut()) {
        for (j, value) in out.iter_mut().enumerate() {
            let mut acc = init[j];
            for (c, &input) in row.iter().enumerate() {
                acc = input.mul_add(panel[c * NR + j], acc);
            }
            *value = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{MAX_MR, NR};

    /// `M` rows × 16 columns in 2·`M` accumulators; one broadcast per row and step.
    ///
    /// # Safety
    /// AVX2 and FMA; `x` holds at least `M` rows of `k`, `panel` at least `k` rows of `NR`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn micro_tile<const M: usize>(
        x: &[f32],
        k: usize,
        panel: &[f32],
        init: &[f32; NR],
        tile: &mut [[f32; NR]; MAX_MR],
    ) {
        debug_assert!(x.len() >= M * k && panel.len() >= k * NR && M <= 6);
        // SAFETY: the caller's contract bounds every pointer below: row `r < M` of `x` and
        // panel row `c < k` are in their slices.
        unsafe {
            let low = _mm256_loadu_ps(init.as_ptr());
            let high = _mm256_loadu_ps(init.as_ptr().add(8));
            let mut acc = [[low, high]; M];
            let xp = x.as_ptr();
            let wp = panel.as_ptr();
            for c in 0..k {
                let w0 = _mm256_loadu_ps(wp.add(c * NR));
                let w1 = _mm256_loadu_ps(wp.add(c * NR + 8));
                for (r, a) in acc.iter_mut().enumerate() {
                    let v = _mm256_broadcast_ss(&*xp.add(r * k + c));
                    a[0] = _mm256_fmadd_ps(v, w0, a[0]);
                    a[1] = _mm256_fmadd_ps(v, w1, a[1]);
                }
            }
            for (a, out) in acc.iter().zip(tile.iter_mut()) {
                _mm256_storeu_ps(out.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(out.as_mut_ptr().add(8), a[1]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{MAX_MR, NR};

    /// `M` rows × 16 columns in `M` accumulators; one broadcast per row and step.
    ///
    /// # Safety
    /// AVX-512 F; `x` holds at least `M` rows of `k`, `panel` at least `k` rows of `NR`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn micro_tile<const M: usize>(
        x: &[f32],
        k: usize,
        panel: &[f32],
        init: &[f32; NR],
        tile: &mut [[f32; NR]; MAX_MR],
    ) {
        debug_assert!(x.len() >= M * k && panel.len() >= k * NR && M <= MAX_MR);
        // SAFETY: the caller's contract bounds every pointer below: row `r < M` of `x` and
        // panel row `c < k` are in their slices; `init` and each tile row hold `NR` = 16.
        unsafe {
            let mut acc = [_mm512_loadu_ps(init.as_ptr()); M];
            let xp = x.as_ptr();
            let wp = panel.as_ptr();
            for c in 0..k {
                let w = _mm512_loadu_ps(wp.add(c * NR));
                for (r, a) in acc.iter_mut().enumerate() {
                    let v = _mm512_set1_ps(*xp.add(r * k + c));
                    *a = _mm512_fmadd_ps(v, w, *a);
                }
            }
            for (a, out) in acc.iter().zip(tile.iter_mut()) {
                _mm512_storeu_ps(out.as_mut_ptr(), *a);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::test_util::Rng;

    /// `x · wᵀ + bias` in f64 (`w` is `[width][k]`, `x` is `[n][k]`); the bf16 GEMM's tests
    /// use it on their rounded values.
    pub(in crate::encoder) fn reference(
        w: &[f32],
        x: &[f32],
        n: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Vec<f64> {
        let width = w.len() / k;
        let mut out = vec![0.0f64; n * width];
        for i in 0..n {
            for j in 0..width {
                let dot: f64 = (0..k)
                    .map(|c| f64::from(x[i * k + c]) * f64::from(w[j * k + c]))
                    .sum();
                out[i * width + j] = dot + bias.map_or(0.0, |b| f64::from(b[j]));
            }
        }
        out
    }

    #[test]
    fn matches_f64_reference_and_simd_equals_scalar_bitwise() {
        let mut rng = Rng::new(7);
        // Widths off the panel size, row counts off the tile and block sizes.
        let available = GemmKernel::available();
        eprintln!("panel matmul kernels tested against the scalar twin: {available:?}");
        #[cfg(target_arch = "x86_64")]
        for (kernel, name) in [(GemmKernel::Avx2, "AVX2"), (GemmKernel::Avx512, "AVX-512")] {
            if !available.contains(&kernel) {
                eprintln!("skipped: {name} panel matmul (host or TOKENMILL_KERNELS lacks it)");
            }
        }
        // Row counts around both tile heights (6, 12) and the row block (48).
        for (width, k, n) in [
            (37, 19, 1),
            (16, 8, 6),
            (40, 33, 53),
            (384, 64, 101),
            (20, 16, 11),
            (33, 40, 13),
            (16, 7, 60),
            // Enough row blocks for four panels per task.
            (72, 8, 600),
        ] {
            let w = rng.vec(width * k, -1.0, 1.0);
            let x = rng.vec(n * k, -2.0, 2.0);
            let bias = rng.vec(width, -0.5, 0.5);
            let matrix = PanelMatrix::from_rows(width, k, &w).unwrap();
            let pool = ThreadPool::new(3);
            for bias in [None, Some(bias.as_slice())] {
                let expected = reference(&w, &x, n, k, bias);
                let mut scalar = vec![0.0; n * width];
                matrix
                    .matmul_with(GemmKernel::Scalar, &pool, &x, n, bias, &mut scalar)
                    .unwrap();
                for (got, want) in scalar.iter().zip(&expected) {
                    assert!((f64::from(*got) - want).abs() < 1e-4, "{got} vs {want}");
                }
                let available = GemmKernel::available();
                for kernel in &available[1..] {
                    let mut simd = vec![0.0; n * width];
                    matrix
                        .matmul_with(*kernel, &pool, &x, n, bias, &mut simd)
                        .unwrap();
                    assert_eq!(
                        simd.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        scalar.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{kernel:?} {width}x{k} n={n}"
                    );
                }
            }
        }
    }

    /// Rows of a random `[131][24]` batch through a 50-wide matrix, bitwise the same alone
    /// (one thread) as in the batch (two threads); `matmul(pool, x, n, out)` is the GEMM.
    pub(in crate::encoder) fn check_rows_alone_equal_batched(
        from_rows: impl Fn(usize, usize, &[f32]) -> Box<dyn Fn(&ThreadPool, &[f32], usize, &mut [f32])>,
    ) {
        let mut rng = Rng::new(11);
        let (width, k, n) = (50, 24, 131);
        let matmul = from_rows(width, k, &rng.vec(width * k, -1.0, 1.0));
        let x = rng.vec(n * k, -1.0, 1.0);
        let mut batched = vec![0.0; n * width];
        matmul(&ThreadPool::new(2), &x, n, &mut batched);
        let single = ThreadPool::new(1);
        let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for i in [0, 5, 47, 48, 130] {
            let mut alone = vec![0.0; width];
            matmul(&single, &x[i * k..(i + 1) * k], 1, &mut alone);
            assert_eq!(
                bits(&alone),
                bits(&batched[i * width..(i + 1) * width]),
                "row {i}"
            );
        }
    }

    #[test]
    fn a_row_is_the_same_alone_and_in_a_batch() {
        check_rows_alone_equal_batched(|width, k, w| {
            let matrix = PanelMatrix::from_rows(width, k, w).unwrap();
            Box::new(move |pool, x, n, out| matrix.matmul(pool, x, n, None, out).unwrap())
        });
    }

    /// The argument checks every encoder GEMM shares: a 2 × 3 matrix refuses an input of the
    /// wrong length and a bias of the wrong width; packing refuses the wrong number of values
    /// and a matrix with no inputs.
    pub(in crate::encoder) fn check_bad_lengths_rejected<M>(
        from_rows: impl Fn(usize, usize, &[f32]) -> Result<M, KernelError>,
        matmul: impl Fn(
            &M,
            &ThreadPool,
            &[f32],
            usize,
            Option<&[f32]>,
            &mut [f32],
        ) -> Result<(), KernelError>,
    ) {
        let matrix = from_rows(2, 3, &[0.0; 6]).unwrap();
        let pool = ThreadPool::new(1);
        let mut out = [0.0; 2];
        assert!(matmul(&matrix, &pool, &[0.0; 2], 1, None, &mut out).is_err());
        assert!(matmul(&matrix, &pool, &[0.0; 3], 1, Some(&[0.0]), &mut out).is_err());
        assert!(from_rows(2, 3, &[0.0; 5]).is_err());
        assert!(from_rows(2, 0, &[]).is_err());
    }

    #[test]
    fn rejects_bad_lengths() {
        check_bad_lengths_rejected(PanelMatrix::from_rows, PanelMatrix::matmul);
    }
}
