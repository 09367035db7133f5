//! The encoder's bf16 GEMM (`--dtype bfloat16`): weights rounded to bf16 once at load,
//! activations rounded per product, f32 accumulation.
//!
//! The arithmetic is fixed by AVX-512 BF16's `vdpbf16ps`, measured on the Xeon (tests below):
//! per pair of inputs `(2p, 2p+1)` it adds the odd product, then the even one, each a single
//! correctly rounded fused multiply-add (`acc = fma(x[2p+1], w[2p+1], acc)`, then
//! `acc = fma(x[2p], w[2p], acc)`), with denormal inputs read as zero and denormal results
//! flushed to zero. Every output here is that chain over the pairs in order, started from
//! zero; the bias is added to the finished sum (`out = acc + bias`, a NaN written as the
//! canonical quiet NaN). Inputs are rounded to nearest even and flushed to zero below 2^-56
//! ([`round_bf16`]): every product is then a multiple of 2^-126 and at least 2^-112, so every
//! partial sum is zero or a normal number and the flushing never changes a result. That makes
//! the chain exactly the f32 panel kernels' fused chain over the inputs with each pair swapped,
//! so the f32 micro-kernels (scalar twin, AVX2, AVX-512 F) on pair-swapped, bf16-valued f32
//! panels are bitwise equal to the `vdpbf16ps` kernel. They are the default: on the Xeon
//! `vdpbf16ps` does fewer multiply-adds per cycle than `vfmadd231ps` (measured 0.4-0.5x), so
//! it runs only when [`VDPBF16PS_ENV`] asks. Either way the bf16 path is about as fast as the
//! f32 one; what it changes is the numerics (vLLM's `--dtype bfloat16`), not the speed.
//!
//! AMX's `tdpbf16ps` is not used: on this Xeon its sums matched none of the scalar formulas
//! tried (fused chains in either pair order, with or without denormal flushing; pair sums
//! rounded, then accumulated in order or as a binary tree; the exact sum rounded once;
//! products aligned to the largest one and truncated at 20 to 43 bits, then added to the
//! accumulator). Within one instruction the products are summed before the accumulator
//! (1 plus two half-ulp products gives 1 + ulp, where the chain gives 1), yet not exactly (0
//! plus products 1 and four half-ulps gives 1 + ulp, not 1 + 2 ulp): see
//! `amx_tile_sums_are_not_the_chain`. Without a scalar twin its results would depend on the
//! host, so the bf16 GEMM stays on vector registers.

use std::cell::RefCell;

use super::gemm::{check_lengths, run_panels, Bias, GemmKernel, PanelMatrix, MAX_MR, NR};
use crate::cpu::CpuFeatures;
use crate::pool::{SharedMut, ThreadPool};
use crate::KernelError;

/// Set to `1` (or `on`, `true`, `yes`) to run the bf16 GEMM on `vdpbf16ps` where the CPU has
/// AVX-512 BF16 (same results; see `Bf16Kernel::detect` for why it is off by default).
pub const VDPBF16PS_ENV: &str = "TOKENMILL_VDPBF16PS";

/// Whether [`VDPBF16PS_ENV`] asks for the `vdpbf16ps` kernel (read once).
fn vdpbf16ps_requested() -> bool {
    static REQUESTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REQUESTED.get_or_init(|| {
        std::env::var(VDPBF16PS_ENV).is_ok_and(|value| {
            matches!(
                value.trim().to_ascii_lowercase().as_str(),
                "1" | "on" | "true" | "yes"
            )
        })
    })
}

/// bf16 exponent field below which [`round_bf16`] flushes to zero: 71 - 127 = -56.
const MIN_EXPONENT_FIELD: u32 = 71;
/// Activation rows converted per pool task.
const CONVERT_ROWS: usize = 64;

/// `value` as bf16 bits: rounded to nearest even, magnitudes below 2^-56 (after rounding) to
/// a zero of the same sign, any NaN to the quiet NaN `0x7fc0`. Integer operations only, so
/// every caller gets the same bits.
#[inline(always)]
pub(crate) fn round_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let exponent = (rounded >> 7) & 0xff;
    let flushed = if exponent < MIN_EXPONENT_FIELD {
        rounded & 0x8000
    } else {
        rounded
    };
    let nan = bits & 0x7fff_ffff > 0x7f80_0000;
    (if nan { 0x7fc0 } else { flushed }) as u16
}

/// bf16 bits widened to f32 (exact).
#[inline(always)]
fn widen(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// How a [`Bf16PanelMatrix`] multiplies, picked at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bf16Kernel {
    /// An f32 panel micro-kernel over pair-swapped bf16 values (scalar twin, AVX2, AVX-512 F).
    Fma(GemmKernel),
    /// `vdpbf16ps`: 12 rows × 16 columns, one instruction per row and pair.
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16,
}

impl Bf16Kernel {
    /// The kernel this process runs: the f32 panel kernel on pair-swapped bf16 values, or
    /// `vdpbf16ps` where the CPU has AVX-512 BF16 and [`VDPBF16PS_ENV`] asks for it (on the
    /// Xeon it retires one instruction per 2-3 cycles, 0.4-0.5x the multiply-adds of
    /// `vfmadd231ps`, so it is not the default).
    pub(crate) fn detect() -> Bf16Kernel {
        #[cfg(target_arch = "x86_64")]
        if let Some(kernel) = Bf16Kernel::vdpbf16ps() {
            if vdpbf16ps_requested() {
                return kernel;
            }
        }
        Bf16Kernel::Fma(GemmKernel::detect())
    }

    /// The `vdpbf16ps` kernel if this process may run it.
    #[cfg(target_arch = "x86_64")]
    fn vdpbf16ps() -> Option<Bf16Kernel> {
        (GemmKernel::detect() == GemmKernel::Avx512 && CpuFeatures::get().avx512bf16)
            .then_some(Bf16Kernel::Avx512Bf16)
    }

    /// Every kernel this process may run, the scalar twin first (for tests).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Bf16Kernel> {
        let mut kernels: Vec<Bf16Kernel> = GemmKernel::available()
            .into_iter()
            .map(Bf16Kernel::Fma)
            .collect();
        #[cfg(target_arch = "x86_64")]
        kernels.extend(Bf16Kernel::vdpbf16ps());
        kernels
    }
}

/// The weights as the kernel reads them.
#[derive(Debug, Clone)]
enum Storage {
    /// bf16 values as f32, each input pair swapped, packed as the f32 panels.
    Widened(PanelMatrix),
    /// `[panel][pairs][NR]` u32, each the pair `(w[2p], w[2p+1])` as bf16 (low half even).
    Packed(Vec<u32>),
}

/// A weight `[out_features, in_features]` rounded to bf16 once, for [`Bf16PanelMatrix::matmul`].
#[derive(Debug, Clone)]
pub struct Bf16PanelMatrix {
    out_features: usize,
    in_features: usize,
    /// Input pairs per row (`in_features` rounded up to even, halved; a missing odd input is
    /// zero).
    pairs: usize,
    kernel: Bf16Kernel,
    storage: Storage,
}

/// Per-thread activation buffers, grown to the largest product seen and then reused.
#[derive(Default)]
struct Scratch {
    widened: Vec<f32>,
    packed: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Bf16PanelMatrix {
    /// Rounds and packs row-major f32 weights `[out_features][in_features]` for the fastest
    /// kernel of this process.
    pub fn from_rows(
        out_features: usize,
        in_features: usize,
        values: &[f32],
    ) -> Result<Bf16PanelMatrix, KernelError> {
        Bf16PanelMatrix::with_kernel(Bf16Kernel::detect(), out_features, in_features, values)
    }

    pub(crate) fn with_kernel(
        kernel: Bf16Kernel,
        out_features: usize,
        in_features: usize,
        values: &[f32],
    ) -> Result<Bf16PanelMatrix, KernelError> {
        if in_features == 0 {
            return Err(KernelError::InvalidShape(
                "bf16 panel matrix with no inputs",
            ));
        }
        if values.len() != out_features * in_features {
            return Err(KernelError::LengthMismatch {
                what: "bf16 panel matrix values",
                expected: out_features * in_features,
                actual: values.len(),
            });
        }
        #[cfg(target_arch = "x86_64")]
        if kernel == Bf16Kernel::Avx512Bf16 && Bf16Kernel::vdpbf16ps().is_none() {
            return Err(KernelError::InvalidShape(
                "the AVX-512 BF16 kernel on a CPU (or TOKENMILL_KERNELS) without it",
            ));
        }
        let pairs = in_features.div_ceil(2);
        let storage = match kernel {
            Bf16Kernel::Fma(_) => {
                let mut swapped = vec![0.0f32; out_features * 2 * pairs];
                for (row, out) in values
                    .chunks_exact(in_features)
                    .zip(swapped.chunks_exact_mut(2 * pairs))
                {
                    swap_pairs_widened(row, out);
                }
                Storage::Widened(PanelMatrix::from_rows(out_features, 2 * pairs, &swapped)?)
            }
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Avx512Bf16 => {
                let num_panels = out_features.div_ceil(NR);
                let mut panels = vec![0u32; num_panels * pairs * NR];
                for (row, weights) in values.chunks_exact(in_features).enumerate() {
                    let (panel, column) = (row / NR, row % NR);
                    let base = panel * pairs * NR;
                    let mut packed = vec![0u32; pairs];
                    pack_pairs(weights, &mut packed);
                    for (p, &pair) in packed.iter().enumerate() {
                        panels[base + p * NR + column] = pair;
                    }
                }
                Storage::Packed(panels)
            }
        };
        Ok(Bf16PanelMatrix {
            out_features,
            in_features,
            pairs,
            kernel,
            storage,
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

    /// Bytes held (including padding).
    pub fn storage_bytes(&self) -> usize {
        match &self.storage {
            Storage::Widened(matrix) => matrix.storage_bytes(),
            Storage::Packed(panels) => panels.len() * 4,
        }
    }

    /// `out[n][out_features] = bf16(x[n][in_features]) · Wᵀ + bias` on `pool` (no bias: zero).
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let (k, width) = (self.in_features, self.out_features);
        let names = [
            "bf16 panel matmul input",
            "bf16 panel matmul output",
            "bf16 panel matmul bias",
        ];
        if !check_lengths(names, k, width, x, n, bias, out)? {
            return Ok(());
        }
        let zeros;
        let bias = match bias {
            Some(bias) => bias,
            None => {
                zeros = vec![0.0f32; width];
                &zeros
            }
        };
        let pairs = self.pairs;
        SCRATCH.with_borrow_mut(|scratch| match (&self.storage, self.kernel) {
            (Storage::Widened(matrix), Bf16Kernel::Fma(gemm)) => {
                scratch.widened.resize(n * 2 * pairs, 0.0);
                let rows = &mut scratch.widened[..n * 2 * pairs];
                convert(pool, x, k, rows, 2 * pairs, swap_pairs_widened);
                let kk = 2 * pairs;
                run_panels(
                    pool,
                    rows,
                    n,
                    kk,
                    matrix.panels(),
                    width,
                    gemm.rows(),
                    Bias::After(bias),
                    out,
                    &|x, panel, init, tile| super::gemm::micro_tile(gemm, x, kk, panel, init, tile),
                );
            }
            #[cfg(target_arch = "x86_64")]
            (Storage::Packed(panels), Bf16Kernel::Avx512Bf16) => {
                scratch.packed.resize(n * pairs, 0);
                let rows = &mut scratch.packed[..n * pairs];
                convert(pool, x, k, rows, pairs, pack_pairs);
                run_panels(
                    pool,
                    rows,
                    n,
                    pairs,
                    panels,
                    width,
                    MAX_MR,
                    Bias::After(bias),
                    out,
                    &|x, panel, init, tile| avx512bf16::micro_tile(x, pairs, panel, init, tile),
                );
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("storage is built for its kernel"),
        });
        Ok(())
    }
}

/// One row rounded to bf16 and widened, each pair `(2p, 2p+1)` stored swapped (odd first, as
/// `vdpbf16ps` adds them); `out` is the row's `2 · pairs` values (a missing odd input zero).
fn swap_pairs_widened(row: &[f32], out: &mut [f32]) {
    let whole = row.len() / 2;
    for (pair, values) in out.chunks_exact_mut(2).zip(row.chunks_exact(2)) {
        pair[0] = widen(round_bf16(values[1]));
        pair[1] = widen(round_bf16(values[0]));
    }
    if let (Some(&last), Some(pair)) = (row.get(2 * whole), out.chunks_exact_mut(2).nth(whole)) {
        pair[0] = 0.0;
        pair[1] = widen(round_bf16(last));
    }
}

/// One row rounded to bf16 pairs, `(x[2p], x[2p+1])` in the low and high halves.
fn pack_pairs(row: &[f32], out: &mut [u32]) {
    let whole = row.len() / 2;
    for (pair, values) in out.iter_mut().zip(row.chunks_exact(2)) {
        *pair = u32::from(round_bf16(values[0])) | (u32::from(round_bf16(values[1])) << 16);
    }
    if let (Some(&last), Some(pair)) = (row.get(2 * whole), out.get_mut(whole)) {
        *pair = u32::from(round_bf16(last));
    }
}

/// Converts the `x.len() / k` rows of `x` into `out` (`stride` elements per row) on `pool`.
fn convert<T: Send + Sync>(
    pool: &ThreadPool,
    x: &[f32],
    k: usize,
    out: &mut [T],
    stride: usize,
    row_fn: fn(&[f32], &mut [T]),
) {
    let n = x.len() / k;
    let output = SharedMut::new(out);
    pool.parallel_for(n.div_ceil(CONVERT_ROWS), &|task| {
        for row in task * CONVERT_ROWS..((task + 1) * CONVERT_ROWS).min(n) {
            // SAFETY: each task owns its rows of `out`, which holds `n` rows of `stride`.
            let target = unsafe { output.slice_mut(row * stride, stride) };
            row_fn(&x[row * k..(row + 1) * k], target);
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod avx512bf16 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    use super::{MAX_MR, NR};

    /// Up to [`MAX_MR`] rows (`x.len() / pairs`) against one panel.
    pub(super) fn micro_tile(
        x: &[u32],
        pairs: usize,
        panel: &[u32],
        init: &[f32; NR],
        tile: &mut [[f32; NR]; MAX_MR],
    ) {
        let m = x.len() / pairs;
        assert!(m <= MAX_MR && panel.len() >= pairs * NR);
        // SAFETY: this kernel is only chosen when `Bf16Kernel::detect` saw AVX-512 F and
        // AVX-512 BF16; the slices hold `m` rows of `pairs` and `pairs` rows of `NR` (asserted).
        unsafe {
            match m {
                1 => tile_rows::<1>(x, pairs, panel, init, tile),
                2 => tile_rows::<2>(x, pairs, panel, init, tile),
                3 => tile_rows::<3>(x, pairs, panel, init, tile),
                4 => tile_rows::<4>(x, pairs, panel, init, tile),
                5 => tile_rows::<5>(x, pairs, panel, init, tile),
                6 => tile_rows::<6>(x, pairs, panel, init, tile),
                7 => tile_rows::<7>(x, pairs, panel, init, tile),
                8 => tile_rows::<8>(x, pairs, panel, init, tile),
                9 => tile_rows::<9>(x, pairs, panel, init, tile),
                10 => tile_rows::<10>(x, pairs, panel, init, tile),
                11 => tile_rows::<11>(x, pairs, panel, init, tile),
                _ => tile_rows::<MAX_MR>(x, pairs, panel, init, tile),
            }
        }
    }

    /// `M` rows × 16 columns in `M` accumulators; one broadcast pair per row and step.
    ///
    /// # Safety
    /// AVX-512 F and BF16; `x` holds at least `M` rows of `pairs`, `panel` `pairs` rows of `NR`.
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_rows<const M: usize>(
        x: &[u32],
        pairs: usize,
        panel: &[u32],
        init: &[f32; NR],
        tile: &mut [[f32; NR]; MAX_MR],
    ) {
        // SAFETY: the caller's contract bounds every pointer below.
        unsafe {
            let mut acc = [_mm512_loadu_ps(init.as_ptr()); M];
            let xp = x.as_ptr();
            let wp = panel.as_ptr();
            for c in 0..pairs {
                let w = _mm512_loadu_si512(wp.add(c * NR).cast());
                for (r, a) in acc.iter_mut().enumerate() {
                    let v = _mm512_set1_epi32(*xp.add(r * pairs + c) as i32);
                    asm!(
                        "vdpbf16ps {a}, {v}, {w}",
                        a = inout(zmm_reg) *a,
                        v = in(zmm_reg) v,
                        w = in(zmm_reg) w,
                        options(pure, nomem, nostack),
                    );
                }
            }
            for (a, out) in acc.iter().zip(tile.iter_mut()) {
                _mm512_storeu_ps(out.as_mut_ptr(), *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Rng;

    /// Random bf16 bits: `wide` spans every exponent (denormals, zero, huge, inf, NaN
    /// included), otherwise exponents near 1.
    fn random_bits(rng: &mut Rng, wide: bool) -> u16 {
        let sign = (rng.next_u64() & 1) as u16;
        let exponent = if wide {
            rng.below(256) as u16
        } else {
            120 + rng.below(15) as u16
        };
        (sign << 15) | (exponent << 7) | (rng.next_u64() & 0x7f) as u16
    }

    /// Adversarial f32 inputs: ordinary values, values that round to ties, tiny values around
    /// the flush threshold and denormals, huge values that overflow, infinities and NaN.
    fn adversarial(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| match rng.below(16) {
                0 => f32::from_bits(rng.next_u64() as u32 & 0x007f_ffff),
                1 => rng.uniform(-1.0, 1.0) * 2f32.powi(-56 - rng.below(4) as i32 + 2),
                2 => rng.uniform(-1.0, 1.0) * 2f32.powi(60 + rng.below(5) as i32),
                3 => f32::from_bits(0x3f80_8000 | (rng.next_u64() as u32 & 0x8001_0000)),
                4 if rng.below(8) == 0 => f32::INFINITY,
                5 if rng.below(8) == 0 => f32::NAN,
                _ => rng.uniform(-2.0, 2.0),
            })
            .collect()
    }

    fn daz(bits: u16) -> f32 {
        let value = widen(bits);
        if value.is_subnormal() {
            0.0f32.copysign(value)
        } else {
            value
        }
    }

    fn ftz(value: f32) -> f32 {
        if value.is_subnormal() {
            0.0f32.copysign(value)
        } else {
            value
        }
    }

    #[test]
    fn rounding_is_nearest_even_with_flush_and_one_nan() {
        assert_eq!(round_bf16(1.0), 0x3f80);
        // Ties go to even: 1 + 2^-8 is halfway between 0x3f80 and 0x3f81.
        assert_eq!(round_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(round_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(round_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(round_bf16(-2.5), 0xc020);
        // Below 2^-56 to a signed zero; 2^-56 itself stays.
        assert_eq!(round_bf16(2f32.powi(-57)), 0);
        assert_eq!(round_bf16(-2f32.powi(-57)), 0x8000);
        assert_eq!(round_bf16(f32::from_bits(1)), 0);
        assert_eq!(widen(round_bf16(2f32.powi(-56))), 2f32.powi(-56));
        // Overflow rounds to infinity; NaN of any sign or payload is one quiet NaN.
        assert_eq!(round_bf16(f32::MAX), 0x7f80);
        assert_eq!(round_bf16(f32::NEG_INFINITY), 0xff80);
        assert_eq!(round_bf16(-f32::NAN), 0x7fc0);
        assert_eq!(round_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }

    /// `vdpbf16ps` on one register: `c[j] += a[2j] b[2j] + a[2j+1] b[2j+1]`.
    #[cfg(target_arch = "x86_64")]
    fn vdpbf16ps(a: &[u16; 32], b: &[u16; 32], c: &[f32; 16]) -> [f32; 16] {
        use std::arch::asm;
        let mut out = *c;
        // SAFETY: only called after detecting AVX-512 F and BF16; the three pointers address
        // 64 bytes each.
        unsafe {
            asm!(
                "vmovdqu64 zmm0, [{a}]",
                "vmovdqu64 zmm1, [{b}]",
                "vmovdqu64 zmm2, [{c}]",
                "vdpbf16ps zmm2, zmm0, zmm1",
                "vmovdqu64 [{c}], zmm2",
                a = in(reg) a.as_ptr(),
                b = in(reg) b.as_ptr(),
                c = in(reg) out.as_mut_ptr(),
                out("zmm0") _,
                out("zmm1") _,
                out("zmm2") _,
                options(nostack),
            );
        }
        out
    }

    /// The arithmetic the kernels reproduce, measured: per pair the odd product then the even
    /// one, each one fused multiply-add, denormal inputs as zero and denormal results flushed.
    /// Checked bit for bit (zero signs and NaN included) over every exponent.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vdpbf16ps_is_the_odd_then_even_fused_chain() {
        let features = CpuFeatures::get();
        if !(features.avx512f && features.avx512bf16) {
            eprintln!(
                "skipped: vdpbf16ps semantics (host or TOKENMILL_KERNELS lacks AVX-512 BF16)"
            );
            return;
        }
        let mut rng = Rng::new(9);
        for trial in 0..20_000 {
            let wide = trial % 2 == 0;
            let mut a = [0u16; 32];
            let mut b = [0u16; 32];
            let mut c = [0f32; 16];
            for v in a.iter_mut().chain(b.iter_mut()) {
                *v = random_bits(&mut rng, wide);
            }
            for v in c.iter_mut() {
                *v = widen(random_bits(&mut rng, wide)) * rng.uniform(1.0, 2.0);
            }
            // Exact cancellation of the accumulator by the odd product.
            c[0] = -(widen(a[1]) * widen(b[1]));
            let got = vdpbf16ps(&a, &b, &c);
            for j in 0..16 {
                let (a0, a1, b0, b1) = (a[2 * j], a[2 * j + 1], b[2 * j], b[2 * j + 1]);
                let odd = ftz(daz(a1).mul_add(daz(b1), ftz(c[j])));
                let want = ftz(daz(a0).mul_add(daz(b0), odd));
                let same = want.to_bits() == got[j].to_bits() || (want.is_nan() && got[j].is_nan());
                assert!(
                    same,
                    "trial {trial} lane {j}: {:08x} vs {:08x}",
                    got[j].to_bits(),
                    want.to_bits()
                );
            }
        }
    }

    /// Why AMX `tdpbf16ps` is not used: it is not the kernels' chain. Products within one
    /// instruction are summed before the accumulator (1 + two half-ulp products: 1 + ulp,
    /// where the chain ties back to 1 twice), but not exactly (0 + 1 + four half-ulp products:
    /// 1 + ulp, where the exact sum is 1 + 2 ulp, representable). No scalar formula tried
    /// matched it on random inputs either (module docs); this fails if a CPU's tiles become
    /// the chain, the cue to use them.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn amx_tile_sums_are_not_the_chain() {
        use crate::cpu::tiles::{release_tiles, TileConfig};
        use std::arch::asm;
        let features = CpuFeatures::get();
        if !(features.amx_tile && features.amx_bf16 && crate::cpu::amx_enabled()) {
            eprintln!("skipped: AMX bf16 semantics (no AMX-BF16 tiles in this process: host, permission or TOKENMILL_KERNELS)");
            return;
        }
        // Column 0 of one tdpbf16ps: acc + Σ_i a[i] b[i] over up to 32 products.
        let tile = |acc: f32, products: &[(f32, f32)]| -> f32 {
            #[repr(C, align(64))]
            struct Buffers([u16; 32], [[u16; 32]; 16], [f32; 16]);
            let mut buffers = Buffers([0; 32], [[0; 32]; 16], [0.0; 16]);
            for (i, &(x, w)) in products.iter().enumerate() {
                buffers.0[i] = round_bf16(x);
                buffers.1[i / 2][i % 2] = round_bf16(w);
            }
            buffers.2[0] = acc;
            let config = TileConfig::new(&[(1, 64), (16, 64), (1, 64)]);
            // SAFETY: AMX with its permission (checked above); each tile reads or writes
            // inside `buffers` (1 × 64, 16 × 64 and 1 × 64 bytes at stride 64).
            unsafe {
                config.load();
                asm!(
                    "tileloadd tmm0, [{a} + {stride}*1]",
                    "tileloadd tmm1, [{b} + {stride}*1]",
                    "tileloadd tmm2, [{c} + {stride}*1]",
                    "tdpbf16ps tmm2, tmm0, tmm1",
                    "tilestored [{c} + {stride}*1], tmm2",
                    a = in(reg) buffers.0.as_ptr(),
                    b = in(reg) buffers.1.as_ptr(),
                    c = in(reg) buffers.2.as_mut_ptr(),
                    stride = in(reg) 64usize,
                    options(nostack),
                );
                release_tiles();
            }
            buffers.2[0]
        };
        let t = 2f32.powi(-12);
        let ulp = 2f32.powi(-23);
        let chain = |acc: f32, products: &[(f32, f32)]| {
            let mut acc = acc;
            for pair in products.chunks(2) {
                for &(x, w) in pair.iter().rev() {
                    acc = x.mul_add(w, acc);
                }
            }
            acc
        };
        let halves = [(t, t), (t, t)];
        let first = tile(1.0, &halves);
        eprintln!("tdpbf16ps: 1 + 2 x 2^-24 = 1 + {} ulp", (first - 1.0) / ulp);
        assert_eq!(chain(1.0, &halves), 1.0);
        let spread = [(1.0, 1.0), (t, t), (t, t), (t, t), (t, t)];
        let second = tile(0.0, &spread);
        eprintln!(
            "tdpbf16ps: 0 + 1 + 4 x 2^-24 = 1 + {} ulp",
            (second - 1.0) / ulp
        );
        assert_eq!(chain(0.0, &spread), 1.0);
        let exact = 1.0 + 2.0 * ulp;
        assert!(
            first != 1.0 || second != 1.0,
            "tdpbf16ps matched the chain on both probes: it may serve as a bf16 kernel here"
        );
        assert!(
            first != 1.0 && second != exact,
            "a new tile arithmetic: re-measure it"
        );
    }

    /// The f64 reference of `x · wᵀ + bias` over the bf16-rounded operands.
    fn reference(w: &[f32], x: &[f32], n: usize, k: usize, bias: &[f32]) -> Vec<f64> {
        let rounded = |v: &[f32]| v.iter().map(|&v| widen(round_bf16(v))).collect::<Vec<_>>();
        super::super::gemm::tests::reference(&rounded(w), &rounded(x), n, k, Some(bias))
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn matches_f64_reference_and_every_kernel_equals_the_scalar_twin_bitwise() {
        let available = Bf16Kernel::available();
        eprintln!("bf16 panel matmul kernels tested against the scalar twin: {available:?}");
        #[cfg(target_arch = "x86_64")]
        for (kernel, name) in [
            (Bf16Kernel::Fma(GemmKernel::Avx2), "AVX2"),
            (Bf16Kernel::Fma(GemmKernel::Avx512), "AVX-512 F"),
            (Bf16Kernel::Avx512Bf16, "AVX-512 BF16"),
        ] {
            if !available.contains(&kernel) {
                eprintln!("skipped: {name} bf16 panel matmul (host or TOKENMILL_KERNELS lacks it)");
            }
        }
        let mut rng = Rng::new(17);
        let pool = ThreadPool::new(3);
        // Odd input widths (a zero-padded last pair), widths off the panel size, row counts
        // around the tile heights (6, 12) and the row block (48).
        for (width, k, n) in [
            (37, 19, 1),
            (16, 8, 6),
            (40, 33, 53),
            (384, 64, 101),
            (20, 16, 11),
            (33, 41, 13),
            (72, 8, 600),
        ] {
            let bias = rng.vec(width, -0.5, 0.5);
            for adversarial_data in [false, true] {
                let (w, x) = if adversarial_data {
                    (
                        adversarial(&mut rng, width * k),
                        adversarial(&mut rng, n * k),
                    )
                } else {
                    (rng.vec(width * k, -1.0, 1.0), rng.vec(n * k, -2.0, 2.0))
                };
                let scalar_matrix =
                    Bf16PanelMatrix::with_kernel(Bf16Kernel::Fma(GemmKernel::Scalar), width, k, &w)
                        .unwrap();
                let mut scalar = vec![0.0; n * width];
                scalar_matrix
                    .matmul(&pool, &x, n, Some(&bias), &mut scalar)
                    .unwrap();
                if !adversarial_data {
                    let expected = reference(&w, &x, n, k, &bias);
                    for (got, want) in scalar.iter().zip(&expected) {
                        assert!((f64::from(*got) - want).abs() < 1e-4, "{got} vs {want}");
                    }
                } else {
                    assert!(scalar.iter().any(|v| v.is_nan() || v.is_infinite()));
                    assert!(scalar
                        .iter()
                        .filter(|v| v.is_nan())
                        .all(|v| v.to_bits() == f32::NAN.to_bits()));
                }
                for &kernel in &available[1..] {
                    let matrix = Bf16PanelMatrix::with_kernel(kernel, width, k, &w).unwrap();
                    let mut out = vec![0.0; n * width];
                    matrix.matmul(&pool, &x, n, Some(&bias), &mut out).unwrap();
                    assert_eq!(bits(&out), bits(&scalar), "{kernel:?} {width}x{k} n={n}");
                }
            }
        }
    }

    /// The chain's order matters: the same inputs summed even-then-odd (the unswapped f32
    /// panels) differ from the scalar twin somewhere, so the bitwise checks above can fail.
    #[test]
    fn the_pair_order_is_observable() {
        let mut rng = Rng::new(23);
        let (width, k, n) = (32, 64, 24);
        let w = rng.vec(width * k, -1.0, 1.0);
        let x = rng.vec(n * k, -1.0, 1.0);
        let pool = ThreadPool::new(1);
        let twin = Bf16PanelMatrix::with_kernel(Bf16Kernel::Fma(GemmKernel::Scalar), width, k, &w)
            .unwrap();
        let mut swapped = vec![0.0; n * width];
        twin.matmul(&pool, &x, n, None, &mut swapped).unwrap();
        let round = |v: &[f32]| v.iter().map(|&v| widen(round_bf16(v))).collect::<Vec<_>>();
        let unswapped = PanelMatrix::from_rows(width, k, &round(&w)).unwrap();
        let mut natural = vec![0.0; n * width];
        unswapped
            .matmul_with(GemmKernel::Scalar, &pool, &round(&x), n, None, &mut natural)
            .unwrap();
        assert_ne!(bits(&natural), bits(&swapped));
    }

    #[test]
    fn a_row_is_the_same_alone_and_in_a_batch() {
        super::super::gemm::tests::check_rows_alone_equal_batched(|width, k, w| {
            let matrix = Bf16PanelMatrix::from_rows(width, k, w).unwrap();
            Box::new(move |pool, x, n, out| matrix.matmul(pool, x, n, None, out).unwrap())
        });
    }

    #[test]
    fn rejects_bad_lengths() {
        super::super::gemm::tests::check_bad_lengths_rejected(
            Bf16PanelMatrix::from_rows,
            Bf16PanelMatrix::matmul,
        );
    }
}
