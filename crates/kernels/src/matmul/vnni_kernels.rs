//! VNNI group kernels for every eight-row interleaved layout (`interleaved.rs`: Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, MXFP4; `kquant.rs`: Q4_K, Q5_K, Q6_K), written once over
//! [`Lanes`] and instantiated for AVX-VNNI (256-bit, one group per call) and AVX-512 VNNI
//! (512-bit, two groups per call).
//!
//! `vpdpbusd` multiplies unsigned weight bytes by signed activation bytes and adds each lane's
//! four products into its i32 accumulator without saturating, so it replaces AVX2's
//! `maddubs` + `madd` pair and its i16 flush schedule. Signed weights avoid the sign transfer
//! by a bias: Q8_0 bytes are read as `w + 128` (`w ^ 0x80`) and IQ4 and MXFP4 levels looked up
//! as `level + 128`, and `128 · Σx` (the activation block's exact integer sum) is subtracted from
//! the block dot, as Q4_0/Q5_0 subtract `8 · Σx` / `16 · Σx`; Q6_K, whose scales change every
//! 16 elements, subtracts `32 · Σx` per 16-element half (`QuantizedRow::half_sums`).
//!
//! Every block dot is the exact integer the scalar twins compute, and the f32 operations per
//! (weight row, activation row) are theirs in the same order, so results are bitwise equal to
//! `group_tile_scalar` / `kquant::tile_scalar` (and to the AVX2 kernels). Bounds: a Q8_0 step
//! adds at most 4 · 255 · 127 per lane and a block at most 32 · 255 · 127 < 2²⁰; K-quant
//! sub-block dots stay below 32 · 31 · 127 before their 6-bit scale; nothing approaches i32.

use super::activation::QuantizedRow;
use super::grouped::{GroupPair, PairOut, GROUP};
use super::interleaved::{GroupKind, NIBBLE_BYTES, TABLE_IQ4_NL, TABLE_IQ4_XS, TABLE_MXFP4};
use super::kquant::{
    q6_run, KKind, D, DMIN, Q5_HIGH, Q6_SCALES, STEP, UNPACKED_MINS, UNPACKED_SCALES,
};
use super::kquant_avx2::unpack_scales_mins;
use super::prefetch;
use super::vnni::{Bases, Lanes, Ymm, Zmm};
use crate::quant::{KVALUES_IQ4NL, KVALUES_MXFP4, QK};

/// A table of int8 levels plus 128, as unsigned bytes.
const fn biased(levels: &[i8; 16]) -> [u8; 16] {
    let mut table = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        table[i] = (levels[i] as i16 + 128) as u8;
        i += 1;
    }
    table
}

/// GGML's IQ4 levels plus 128.
const IQ4_BIASED: [u8; 16] = biased(&KVALUES_IQ4NL);
/// GGML's MXFP4 levels plus 128.
const MXFP4_BIASED: [u8; 16] = biased(&KVALUES_MXFP4);

impl GroupPair<'_> {
    /// Bases of group-block `b` of both groups.
    ///
    /// # Safety
    /// `b < blocks` and both groups hold `blocks` group-blocks of `stride` bytes.
    #[inline(always)]
    unsafe fn block(&self, b: usize, stride: usize) -> Bases {
        // SAFETY: the caller's contract.
        unsafe {
            Bases(
                self.first.as_ptr().add(b * stride),
                self.second.as_ptr().add(b * stride),
            )
        }
    }
}

/// Prefetches the group-block [`prefetch::VNNI_AHEAD_BYTES`] ahead in both of the call's
/// groups and the same block two groups on (`2 * group_len`: on AVX-512 the two groups the
/// driver's next call reads; on AVX-VNNI, one group per call with `base.1 == base.0`, the
/// group after the next). Every row count prefetches: a step of 2-15 rows meets each weight
/// block first in its first row tile and waited on memory there as a one-row step did.
/// Xeon, two threads, default model, alternated `bench speed` runs (in-stream one-row hint
/// only -> this): one-row decode (ctx 0 -> 128) 228.6 / 227.9 / 228.6 -> 318.8 / 321.2 /
/// 297.1 tok/s, (ctx 512 -> 640) 160.6 / 171.6 / 163.6 -> 176.3 / 204.2 / 177.7; verification
/// steps at ctx 512 of 2 / 4 / 8 rows 231 / 338 / 459 -> 275 / 405 / 485 tok/s; 64-row
/// batches and prefill on the VNNI path (no AMX) unchanged. AVX-VNNI forced
/// (`TOKENMILL_KERNELS=avx-vnni`) on the same Xeon: one-row decode (ctx 0 -> 128) 236.8 /
/// 230.9 -> 336.9 / 329.1 tok/s, 4-row steps 323.9 / 344.9 -> 393.3 / 393.5.
#[inline(always)]
fn prefetch_ahead(base: Bases, stride: usize, group_len: usize) {
    // Where a call reads one group (AVX-VNNI, a task's odd last group) `base.1 == base.0` and
    // every line is asked for twice. Hinting it once measured slower on AVX-VNNI (decode ctx 0:
    // 159.0 / 166.1 against 193.0 / 231.4 tok/s, alternated; not explained: perhaps a hint
    // dropped while the fill buffers are full gets a second chance).
    prefetch::stream(base.0, stride, prefetch::VNNI_AHEAD_BYTES);
    prefetch::stream(base.1, stride, prefetch::VNNI_AHEAD_BYTES);
    prefetch::block(base.0.wrapping_add(2 * group_len), stride);
    prefetch::block(base.1.wrapping_add(2 * group_len), stride);
}

/// Stores each row's accumulator into `out`.
#[inline(always)]
unsafe fn store_all<S: Lanes, const R: usize>(acc: [S::F; R], out: &mut PairOut<R>) {
    let [first, second] = out;
    for (r, value) in acc.into_iter().enumerate() {
        // SAFETY: the caller's features (see `Lanes`).
        unsafe { S::store(value, &mut first[r], &mut second[r]) };
    }
}

/// Q4_0/Q4_1 (`FIVE = false`) or Q5_0/Q5_1 (`FIVE = true`): the AVX2 kernel's unpacking, with
/// one `vpdpbusd` per step and row.
#[inline(always)]
unsafe fn q4_tile<S: Lanes, const R: usize, const FIVE: bool, const MIN: bool>(
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    // The kind from the type parameters, so its offset, layout and min term are constants.
    let kind = match (FIVE, MIN) {
        (false, false) => GroupKind::Q4Zero,
        (false, true) => GroupKind::Q4One,
        (true, false) => GroupKind::Q5Zero,
        (true, true) => GroupKind::Q5One,
    };
    let stride = kind.block_stride();
    // SAFETY: (whole body) the caller's features; group-block b's bytes lie inside both groups
    // and activation block b inside every row (entry point contract).
    unsafe {
        let mask = S::splat8(0x0f);
        let fifth = S::splat8(0x10);
        let offset = kind.offset();
        let mut acc = [S::zero_f(); R];
        for b in 0..groups.blocks {
            let base = groups.block(b, stride);
            prefetch_ahead(base, stride, groups.blocks * stride);
            let scales = S::f16x8(base);
            let quants = base.add(kind.quant_offset());
            let (mut high_of_low, mut high_of_high) = if FIVE {
                let qh = S::bytes32(base.add(kind.high_bits_offset()));
                (S::shl4_16(qh), qh)
            } else {
                (S::zero(), S::zero())
            };
            let mut dots = [S::zero(); R];
            for kk in 0..4 {
                let packed = S::bytes32(quants.add(kk * 32));
                let mut low = S::and(packed, mask);
                let mut high = S::and(S::shr4_16(packed), mask);
                if FIVE {
                    low = S::or(low, S::and(high_of_low, fifth));
                    high = S::or(high, S::and(high_of_high, fifth));
                    high_of_low = S::shr1_16(high_of_low);
                    high_of_high = S::shr1_16(high_of_high);
                }
                for r in 0..R {
                    let x = xs[r].quants.as_ptr().add(b * QK);
                    dots[r] = S::dot(dots[r], low, S::broadcast4(x.add(4 * kk)));
                    dots[r] = S::dot(dots[r], high, S::broadcast4(x.add(16 + 4 * kk)));
                }
            }
            let mins = if MIN {
                S::f16x8(base.add(16))
            } else {
                S::zero_f()
            };
            for r in 0..R {
                let mut dot = dots[r];
                if offset != 0 {
                    dot = S::sub32(dot, S::splat32(offset * *xs[r].quant_sums.get_unchecked(b)));
                }
                let d = S::mul_f(scales, S::splat_f(*xs[r].scales.get_unchecked(b)));
                acc[r] = S::fmadd(d, S::to_f32(dot), acc[r]);
                if MIN {
                    acc[r] = S::fmadd(mins, S::splat_f(*xs[r].block_sums.get_unchecked(b)), acc[r]);
                }
            }
        }
        store_all::<S, R>(acc, out);
    }
}

/// Q8_0: weight bytes biased to `w + 128`, `128 · Σx` subtracted per block.
#[inline(always)]
unsafe fn q8_tile<S: Lanes, const R: usize>(
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    let kind = GroupKind::Q8Zero;
    let stride = kind.block_stride();
    // SAFETY: (whole body) as in `q4_tile`.
    unsafe {
        let bias = S::splat8(i8::MIN);
        let mut acc = [S::zero_f(); R];
        for b in 0..groups.blocks {
            let base = groups.block(b, stride);
            prefetch_ahead(base, stride, groups.blocks * stride);
            let scales = S::f16x8(base);
            let quants = base.add(kind.quant_offset());
            let mut dots = [S::zero(); R];
            for step in 0..8 {
                let w = S::xor(S::bytes32(quants.add(step * 32)), bias);
                for r in 0..R {
                    let x = xs[r].quants.as_ptr().add(b * QK + 4 * step);
                    dots[r] = S::dot(dots[r], w, S::broadcast4(x));
                }
            }
            for r in 0..R {
                let dot = S::sub32(
                    dots[r],
                    S::splat32(128 * *xs[r].quant_sums.get_unchecked(b)),
                );
                let d = S::mul_f(scales, S::splat_f(*xs[r].scales.get_unchecked(b)));
                acc[r] = S::fmadd(d, S::to_f32(dot), acc[r]);
            }
        }
        store_all::<S, R>(acc, out);
    }
}

/// The nibble-table kinds, IQ4_NL (`TABLE_IQ4_NL`), IQ4_XS (`TABLE_IQ4_XS`) or MXFP4
/// (`TABLE_MXFP4`): levels looked up biased by 128, `128 · Σx` subtracted per 32-element
/// block; IQ4_XS's per-32 scale `d · (ls - 32)` built in f32 lanes, MXFP4's `2^(e - 128)`
/// from its E8M0 bytes (both exact).
#[inline(always)]
unsafe fn table_tile<S: Lanes, const R: usize, const TABLE: u8>(
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    let kind = GroupKind::of_table(TABLE);
    let (sub_scales, e8m0) = (TABLE == TABLE_IQ4_XS, TABLE == TABLE_MXFP4);
    let stride = kind.block_stride();
    let subs = kind.block_elems() / QK;
    // SAFETY: (whole body) as in `q4_tile`.
    unsafe {
        let mask = S::splat8(0x0f);
        let table = S::table16(if e8m0 { &MXFP4_BIASED } else { &IQ4_BIASED });
        let mut acc = [S::zero_f(); R];
        for b in 0..groups.blocks {
            let base = groups.block(b, stride);
            prefetch_ahead(base, stride, groups.blocks * stride);
            let d = if e8m0 {
                S::e8m0x8(base)
            } else {
                S::f16x8(base)
            };
            let (scales_h, scales_l) = if sub_scales {
                (
                    S::u16x8(base.add(16)),
                    S::bytes32(base.add(kind.high_bits_offset())),
                )
            } else {
                (S::zero(), S::zero())
            };
            for sub in 0..subs {
                let scale = if sub_scales {
                    let low = S::and(S::shr_32(scales_l, 4 * sub as i32), S::splat32(0x0f));
                    let high = S::and(S::shr_32(scales_h, 2 * sub as i32), S::splat32(3));
                    let ls = S::sub32(S::or(low, S::shl4_32(high)), S::splat32(32));
                    S::mul_f(d, S::to_f32(ls))
                } else {
                    d
                };
                let quants = base.add(kind.quant_offset() + sub * NIBBLE_BYTES);
                let xb = b * subs + sub;
                let mut dots = [S::zero(); R];
                for kk in 0..4 {
                    let packed = S::bytes32(quants.add(kk * 32));
                    let low = S::lookup(table, S::and(packed, mask));
                    let high = S::lookup(table, S::and(S::shr4_16(packed), mask));
                    for r in 0..R {
                        let x = xs[r].quants.as_ptr().add(xb * QK);
                        dots[r] = S::dot(dots[r], low, S::broadcast4(x.add(4 * kk)));
                        dots[r] = S::dot(dots[r], high, S::broadcast4(x.add(16 + 4 * kk)));
                    }
                }
                for r in 0..R {
                    let dot = S::sub32(
                        dots[r],
                        S::splat32(128 * *xs[r].quant_sums.get_unchecked(xb)),
                    );
                    let dx = S::mul_f(scale, S::splat_f(*xs[r].scales.get_unchecked(xb)));
                    acc[r] = S::fmadd(dx, S::to_f32(dot), acc[r]);
                }
            }
        }
        store_all::<S, R>(acc, out);
    }
}

/// Q4_K (`FIVE_BITS = false`) or Q5_K: per 32-element sub-block an exact i32 dot, times its
/// 6-bit scale, then the scalar twin's f32 order (scaled dots, then the mins).
#[inline(always)]
unsafe fn q4_k_tile<S: Lanes, const R: usize, const FIVE_BITS: bool>(
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    let kind = if FIVE_BITS { KKind::Q5 } else { KKind::Q4 };
    let stride = kind.stride();
    // SAFETY: (whole body) as in `q4_tile` (super-block s holds activation blocks 8s..8s + 8);
    // the scales and mins are read from each group's 128 unpacked bytes.
    unsafe {
        let mask = S::splat8(0x0f);
        let mut acc = [S::zero_f(); R];
        for s in 0..groups.blocks {
            let base = groups.block(s, stride);
            prefetch_ahead(base, stride, groups.blocks * stride);
            let d = S::f16x8(base.add(D));
            let first = unpack_scales_mins(base.0);
            let second = if S::PAIRED {
                unpack_scales_mins(base.1)
            } else {
                first
            };
            let unpacked = Bases(first.as_ptr(), second.as_ptr());
            let scales = unpacked.add(UNPACKED_SCALES);
            for c in 0..4 {
                let scale_low = S::u8x8(scales.add(2 * c * GROUP));
                let scale_high = S::u8x8(scales.add((2 * c + 1) * GROUP));
                let run = base.add(kind.quants() + c * 8 * STEP);
                let mut dot_low = [S::zero(); R];
                let mut dot_high = [S::zero(); R];
                for kk in 0..8 {
                    let packed = S::bytes32(run.add(kk * STEP));
                    let mut low = S::and(packed, mask);
                    let mut high = S::and(S::shr4_16(packed), mask);
                    if FIVE_BITS {
                        let bits = S::bytes32(base.add(Q5_HIGH + kk * STEP));
                        low = S::or(low, S::bit_as_16(bits, 2 * c));
                        high = S::or(high, S::bit_as_16(bits, 2 * c + 1));
                    }
                    for r in 0..R {
                        let x = xs[r].quants.as_ptr().add((8 * s + 2 * c) * QK + 4 * kk);
                        dot_low[r] = S::dot(dot_low[r], low, S::broadcast4(x));
                        dot_high[r] = S::dot(dot_high[r], high, S::broadcast4(x.add(QK)));
                    }
                }
                for r in 0..R {
                    let xb = 8 * s + 2 * c;
                    let low = S::to_f32(S::mul32(dot_low[r], scale_low));
                    let d_low = S::mul_f(d, S::splat_f(*xs[r].scales.get_unchecked(xb)));
                    acc[r] = S::fmadd(d_low, low, acc[r]);
                    let high = S::to_f32(S::mul32(dot_high[r], scale_high));
                    let d_high = S::mul_f(d, S::splat_f(*xs[r].scales.get_unchecked(xb + 1)));
                    acc[r] = S::fmadd(d_high, high, acc[r]);
                }
            }
            let dmin = S::f16x8(base.add(DMIN));
            let mut m = [S::zero_f(); R];
            for j in 0..8 {
                let mins = S::to_f32(S::u8x8(unpacked.add(UNPACKED_MINS + j * GROUP)));
                for r in 0..R {
                    m[r] = S::fmadd(
                        mins,
                        S::splat_f(*xs[r].block_sums.get_unchecked(8 * s + j)),
                        m[r],
                    );
                }
            }
            for r in 0..R {
                acc[r] = S::fnmadd(dmin, m[r], acc[r]);
            }
        }
        store_all::<S, R>(acc, out);
    }
}

/// Q6_K: the unsigned quants `q` (0..64) go straight into `vpdpbusd`; each 16-element half's
/// accumulator starts at `-32 · Σx` over its activations (`half_sums`), so it ends at the exact
/// `v = Σ (q - 32) · x`. Blocks `4h..4h + 3` are one mask of their run each; block `4h + 3`,
/// gathered from the runs' top bit pairs, is formed as `4q` (bits 2..8, two fewer operations)
/// and its `v` is then `4 · Σ (q - 32) · x`. The two halves' int8 scales are applied in f32,
/// `s₀ · v₀` then `fma(s₁, v₁, ·)` (block `4h + 3`: `s / 4`, a power-of-two step), which is
/// exact: `|v| ≤ 4 · 16 · 32 · 127 < 2²⁴` converts exactly, each product is the integer
/// `s · Σ (q - 32) · x` of magnitude below 2²³ and their sum below 2²⁴, so the result is the
/// scalar twin's integer block dot converted to f32. Blocks then enter the accumulator in the
/// twin's order.
#[inline(always)]
unsafe fn q6_k_tile<S: Lanes, const R: usize>(
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    let stride = KKind::Q6.stride();
    // SAFETY: (whole body) as in `q4_k_tile`.
    unsafe {
        let mut acc = [S::zero_f(); R];
        for s in 0..groups.blocks {
            let base = groups.block(s, stride);
            prefetch_ahead(base, stride, groups.blocks * stride);
            let d = S::f16x8(base.add(D));
            for h in 0..2 {
                let first = 8 * s + 4 * h;
                let add = |acc: &mut [S::F; R], dots: [S::F; R], xb: usize| {
                    for r in 0..R {
                        let dx = S::mul_f(d, S::splat_f(*xs[r].scales.get_unchecked(xb)));
                        acc[r] = S::fmadd(dx, dots[r], acc[r]);
                    }
                };
                if R == 1 {
                    // All four blocks from one pass over the three runs.
                    let dots = q6_k_blocks::<S, R, 0, 4>(base, h, first, xs);
                    for (g, dots) in dots.into_iter().enumerate() {
                        add(&mut acc, dots, first + g);
                    }
                } else {
                    // Two passes of two blocks keep more rows' accumulators in registers.
                    for (g, dots) in q6_k_blocks::<S, R, 0, 2>(base, h, first, xs)
                        .into_iter()
                        .enumerate()
                    {
                        add(&mut acc, dots, first + g);
                    }
                    for (g, dots) in q6_k_blocks::<S, R, 2, 2>(base, h, first, xs)
                        .into_iter()
                        .enumerate()
                    {
                        add(&mut acc, dots, first + 2 + g);
                    }
                }
            }
        }
        store_all::<S, R>(acc, out);
    }
}

/// Blocks `first + G0 .. first + G0 + N` (`first = 8s + 4h`) of the Q6_K group-block at
/// `base`: per activation row, each block's exact integer dot as f32.
///
/// # Safety
/// As [`q6_k_tile`]'s body: the caller's features, `base` a whole group-block, the blocks
/// inside every activation row.
#[inline(always)]
unsafe fn q6_k_blocks<S: Lanes, const R: usize, const G0: usize, const N: usize>(
    base: Bases,
    h: usize,
    first: usize,
    xs: &[QuantizedRow<'_>; R],
) -> [[S::F; R]; N] {
    // SAFETY: (whole body) the caller's contract; every load lies in the group-block or in
    // the blocks' activations.
    unsafe {
        let six_bits = S::splat8(0x3f);
        let top_bits = S::splat8(-0x40);
        let bits_4_6 = S::splat8(0x30);
        let bits_0_4 = S::splat8(0x0f);
        // (No `array::map` or `from_fn` over vectors here: those generic helpers carry no
        // target features, so what they call would not be inlined.)
        let runs = [
            base.add(q6_run(h, 0)),
            base.add(q6_run(h, 1)),
            base.add(q6_run(h, 2)),
        ];
        let needs_run = |v: usize| (G0..G0 + N).any(|g| g == v || g == 3);
        let mut dots = [[S::zero_f(); R]; N];
        for half in 0..2 {
            let mut sums = [[S::zero(); R]; N];
            for (i, sums) in sums.iter_mut().enumerate() {
                let g = G0 + i;
                // Block 3's quants enter as 4q (see `q6_k_tile`).
                let factor = if g == 3 { 4 } else { 1 };
                for r in 0..R {
                    let sum = *xs[r].half_sums.get_unchecked(2 * (first + g) + half);
                    sums[r] = S::splat32(-32 * factor * sum);
                }
            }
            for kk in 4 * half..4 * half + 4 {
                // Run v is read where block v or block 3 is computed.
                let mut bytes = [S::zero(); 3];
                for (v, bytes) in bytes.iter_mut().enumerate() {
                    if needs_run(v) {
                        *bytes = S::bytes32(runs[v].add(kk * STEP));
                    }
                }
                for (i, sums) in sums.iter_mut().enumerate() {
                    let g = G0 + i;
                    let q = if g < 3 {
                        S::and(bytes[g], six_bits)
                    } else {
                        // 4q: bits 2..4 from run 0's top pair, 4..6 from run 1's, 6..8 from
                        // run 2's (16-bit shifts: what crosses bytes is masked off).
                        let pair0 = S::shr_16::<4>(S::and(bytes[0], top_bits));
                        let upper = S::select(bits_4_6, S::shr_16::<2>(bytes[1]), bytes[2]);
                        S::select(bits_0_4, pair0, upper)
                    };
                    for r in 0..R {
                        let x = xs[r].quants.as_ptr().add((first + g) * QK + 4 * kk);
                        sums[r] = S::dot(sums[r], q, S::broadcast4(x));
                    }
                }
            }
            for i in 0..N {
                let g = G0 + i;
                let sub = 8 * h + 2 * g + half;
                let mut scale = S::to_f32(S::i8x8(base.add(Q6_SCALES + sub * GROUP)));
                if g == 3 {
                    scale = S::mul_f(scale, S::splat_f(0.25));
                }
                for r in 0..R {
                    let v = S::to_f32(sums[i][r]);
                    dots[i][r] = if half == 0 {
                        S::mul_f(scale, v)
                    } else {
                        S::fmadd(scale, v, dots[i][r])
                    };
                }
            }
        }
        dots
    }
}

/// Which interleaved kernel a kind runs.
macro_rules! interleaved_dispatch {
    ($lanes:ty, $kind:expr, $groups:expr, $xs:expr, $out:expr) => {
        match $kind {
            GroupKind::Q8Zero => q8_tile::<$lanes, R>($groups, $xs, $out),
            GroupKind::Q4Zero => q4_tile::<$lanes, R, false, false>($groups, $xs, $out),
            GroupKind::Q4One => q4_tile::<$lanes, R, false, true>($groups, $xs, $out),
            GroupKind::Q5Zero => q4_tile::<$lanes, R, true, false>($groups, $xs, $out),
            GroupKind::Q5One => q4_tile::<$lanes, R, true, true>($groups, $xs, $out),
            GroupKind::Iq4Nl => table_tile::<$lanes, R, TABLE_IQ4_NL>($groups, $xs, $out),
            GroupKind::Iq4Xs => table_tile::<$lanes, R, TABLE_IQ4_XS>($groups, $xs, $out),
            GroupKind::Mxfp4 => table_tile::<$lanes, R, TABLE_MXFP4>($groups, $xs, $out),
        }
    };
}

/// Which K-quant kernel a kind runs.
macro_rules! k_dispatch {
    ($lanes:ty, $kind:expr, $groups:expr, $xs:expr, $out:expr) => {
        match $kind {
            KKind::Q4 => q4_k_tile::<$lanes, R, false>($groups, $xs, $out),
            KKind::Q5 => q4_k_tile::<$lanes, R, true>($groups, $xs, $out),
            KKind::Q6 => q6_k_tile::<$lanes, R>($groups, $xs, $out),
        }
    };
}

/// Interleaved group `groups.first` against `R` activation rows on AVX-VNNI: `out[0][r][lane]`.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI. `groups.first` must hold
/// `groups.blocks` group-blocks of `kind` and every activation row the matching quantized
/// blocks.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) unsafe fn interleaved_avxvnni<const R: usize>(
    kind: GroupKind,
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    // SAFETY: the caller's contract covers the kernels'.
    unsafe { interleaved_dispatch!(Ymm, kind, groups, xs, out) }
}

/// Interleaved groups `groups.first` and `groups.second` against `R` activation rows on
/// AVX-512: `out[g][r][lane]`.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F, BW and VNNI. Both groups must hold
/// `groups.blocks` group-blocks of `kind` and every activation row the matching quantized
/// blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn interleaved_avx512<const R: usize>(
    kind: GroupKind,
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    // SAFETY: the caller's contract covers the kernels'.
    unsafe { interleaved_dispatch!(Zmm, kind, groups, xs, out) }
}

/// K-quant group `groups.first` against `R` activation rows on AVX-VNNI.
///
/// # Safety
/// As [`interleaved_avxvnni`], with `groups.blocks` super-blocks of `kind`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) unsafe fn k_avxvnni<const R: usize>(
    kind: KKind,
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    // SAFETY: the caller's contract covers the kernels'.
    unsafe { k_dispatch!(Ymm, kind, groups, xs, out) }
}

/// K-quant groups `groups.first` and `groups.second` against `R` activation rows on AVX-512.
///
/// # Safety
/// As [`interleaved_avx512`], with `groups.blocks` super-blocks of `kind`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn k_avx512<const R: usize>(
    kind: KKind,
    groups: GroupPair<'_>,
    xs: &[QuantizedRow<'_>; R],
    out: &mut PairOut<R>,
) {
    // SAFETY: the caller's contract covers the kernels'.
    unsafe { k_dispatch!(Zmm, kind, groups, xs, out) }
}
