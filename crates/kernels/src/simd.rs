//! f32 vector primitives for attention: one online-softmax step over a tile of at most
//! [`TILE`] keys for one (query row, head) pair, with an AVX2 path and a scalar twin that does
//! the same operations in the same order (fused multiply-adds where AVX2 fuses, the same
//! polynomial exponential, [`scalar_exp`]), so the two are bitwise equal.
//!
//! The AVX2 path scores eight keys at a time with independent accumulators and one transposing
//! reduction, so every key's dot product is summed in the same fixed order
//! (`((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))` over the eight accumulator lanes) no matter how
//! many keys the tile holds. The tile's max, exponentials and sum are vectorized in a fixed
//! order too: a pair's result depends only on its query and the tile's keys and values.
//!
//! [`VectorOps::attend_group`] folds a tile into up to [`GROUP`] pairs that see the same keys
//! (the query heads of one GQA group, or fully visible rows of a prefill chunk) in one call:
//! each K row is loaded once for all of them (scored four keys at a time, the first half of
//! the transposing reduction per quad), their rescale factors share one `exp8`, and each V row
//! feeds all their accumulators. Every pair still goes through exactly its own operations, so
//! the grouping never changes its bits (a test checks this against the per-pair path).
//!
//! With AVX-512 F/VL ([`VectorOps::Avx512`]) the same code has 32 vector registers, so a call
//! groups up to six pairs (twice AVX2's three, which fill its 16 registers); it scores two keys
//! per 512-bit multiply-add and replays the reduction tree on both halves at once, takes a
//! tile's sixteen weights in one 16-lane exp and adds the V rows into the accumulators sixteen
//! lanes at a time: lane for lane the same operations in the same order, so both paths give
//! the same bits.

use crate::cpu::CpuFeatures;

/// Most keys one online-softmax step handles; cache blocks larger than this are walked in
/// tiles of this many keys.
pub(crate) const TILE: usize = 16;

/// Most (row, head) pairs one [`VectorOps::attend_group`] call folds a tile into (the
/// AVX-512 path's group; [`VectorOps::group`] is each path's own).
pub(crate) const GROUP: usize = 6;

/// Pairs one AVX2 grouped step keeps in its 16 vector registers.
const AVX2_GROUP: usize = 3;

/// The vector primitives this CPU runs: AVX2 with FMA (also with AVX-512 F/VL: the same
/// results, wider attention groups), or scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VectorOps {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2's operations with AVX-512 F/VL's 32 registers and 16-lane value accumulation in
    /// [`VectorOps::attend_group`]; everything else is AVX2's code.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl VectorOps {
    /// The path for this process's [`CpuFeatures`].
    pub(crate) fn detect() -> VectorOps {
        VectorOps::from(CpuFeatures::get())
    }
}

impl VectorOps {
    /// Every path this CPU runs, the widest first and the scalar twin last (for tests, which
    /// print the paths they skip).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<VectorOps> {
        let mut paths = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let all = VectorOps::from(&CpuFeatures::ALL);
            if all == VectorOps::Avx512 {
                paths.push(VectorOps::Avx512);
            } else {
                eprintln!("attention kernels: AVX-512 F/VL path skipped (not on this CPU)");
            }
            let avx2 = CpuFeatures {
                avx512f: false,
                ..CpuFeatures::ALL
            };
            if VectorOps::from(&avx2) == VectorOps::Avx2 {
                paths.push(VectorOps::Avx2);
            } else {
                eprintln!("attention kernels: AVX2 path skipped (not on this CPU)");
            }
        }
        paths.push(VectorOps::Scalar);
        paths
    }
}

impl From<&CpuFeatures> for VectorOps {
    fn from(features: &CpuFeatures) -> VectorOps {
        #[cfg(target_arch = "x86_64")]
        {
            let usable = features.usable();
            if usable.avx2 && usable.fma {
                if usable.avx512f && usable.avx512vl {
                    return VectorOps::Avx512;
                }
                return VectorOps::Avx2;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = features;
        VectorOps::Scalar
    }
}

/// Keys and values of one tile for one kv head: rows `t < count` (`count <= TILE`) start at
/// `t * stride` and hold `head_dim` values.
#[derive(Clone, Copy)]
pub(crate) struct KeyTile<'a> {
    pub(crate) keys: &'a [f32],
    pub(crate) values: &'a [f32],
    pub(crate) stride: usize,
    pub(crate) count: usize,
}

impl KeyTile<'_> {
    /// Whether the tile's shape fits its buffers and the step's limits.
    fn is_valid(&self, d: usize) -> bool {
        let rows_fit = |buffer: &[f32]| (self.count - 1) * self.stride + d <= buffer.len();
        self.count >= 1 && self.count <= TILE && rows_fit(self.keys) && rows_fit(self.values)
    }
}

/// Running state of one query row's online softmax.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OnlineSoftmax {
    pub(crate) max: f32,
    pub(crate) sum: f32,
}

impl OnlineSoftmax {
    pub(crate) const EMPTY: OnlineSoftmax = OnlineSoftmax {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };
}

/// One pair's softmax weights for the first `count` keys of a tile and the factor its
/// accumulator is rescaled by before they are added.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TileWeights {
    pub(crate) weights: [f32; TILE],
    pub(crate) correction: f32,
    pub(crate) count: usize,
}

impl TileWeights {
    pub(crate) const EMPTY: TileWeights = TileWeights {
        weights: [0.0; TILE],
        correction: 1.0,
        count: 0,
    };
}

impl VectorOps {
    /// `gate[i] = gate[i] / (1 + e^-gate[i]) * up[i]` over the common length. Each element's
    /// result depends only on its value and its index modulo 8 (the vector body vs the tail).
    pub(crate) fn silu_mul(self, gate: &mut [f32], up: &[f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` and `Avx512` are only constructed after detecting AVX2 and FMA.
            VectorOps::Avx2 | VectorOps::Avx512 => unsafe { avx2::silu_mul(gate, up) },
            VectorOps::Scalar => scalar_silu_mul(gate, up),
        }
    }

    /// First half of folding a tile into a (row, head) pair's online softmax: scores
    /// `q·k * scale` for the tile's `count` keys, updates `state` and returns the weights
    /// `exp(s - new_max)` with the rescale factor `exp(old_max - new_max)`. Returns `None`
    /// (and leaves `state` alone) if the tile is empty, longer than [`TILE`] or does not fit
    /// its buffers.
    #[cfg(test)]
    #[inline]
    pub(crate) fn tile_weights(
        self,
        query: &[f32],
        tile: KeyTile<'_>,
        scale: f32,
        state: &mut OnlineSoftmax,
    ) -> Option<TileWeights> {
        if !tile.is_valid(query.len()) {
            return None;
        }
        Some(match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` and `Avx512` are only constructed after detecting AVX2 and FMA;
            // the tile was validated against `query.len()`.
            VectorOps::Avx2 | VectorOps::Avx512 => unsafe {
                avx2::tile_weights(query, tile, scale, state)
            },
            VectorOps::Scalar => scalar_tile_weights(query, tile, scale, state),
        })
    }

    /// Second half: `acc = acc · correction + Σ_t weights[t] · v_t` over the first
    /// `weights.count` value rows of `tile`, in key order. Does nothing if those rows do not
    /// fit the tile's buffers for `acc.len()` values.
    #[cfg(test)]
    #[inline]
    pub(crate) fn accumulate(self, tile: KeyTile<'_>, weights: &TileWeights, acc: &mut [f32]) {
        let tile = KeyTile {
            count: weights.count,
            ..tile
        };
        if !tile.is_valid(acc.len()) {
            return;
        }
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` and `Avx512` are only constructed after detecting AVX2 and FMA;
            // the tile's value rows were validated against `acc.len()`.
            VectorOps::Avx2 | VectorOps::Avx512 => unsafe {
                avx2::accumulate_one(tile, weights, acc)
            },
            VectorOps::Scalar => scalar_accumulate(tile, weights, acc),
        }
    }

    /// [`VectorOps::accumulate`] for two pairs at once, sharing the value loads. Each pair's
    /// accumulator goes through exactly the operations `accumulate` would apply.
    #[cfg(test)]
    #[inline]
    pub(crate) fn accumulate_two(
        self,
        tile: KeyTile<'_>,
        weights: [&TileWeights; 2],
        acc: [&mut [f32]; 2],
    ) {
        let [acc_a, acc_b] = acc;
        let fused = KeyTile {
            count: weights[0].count,
            ..tile
        };
        #[cfg(target_arch = "x86_64")]
        if matches!(self, VectorOps::Avx2 | VectorOps::Avx512)
            && weights[0].count == weights[1].count
            && acc_a.len() == acc_b.len()
            && fused.is_valid(acc_a.len())
        {
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and FMA; the tile's value
            // rows were validated against both accumulators' common length.
            unsafe { avx2::accumulate_two(fused, weights, [acc_a, acc_b]) };
            return;
        }
        self.accumulate(tile, weights[0], acc_a);
        self.accumulate(tile, weights[1], acc_b);
    }

    /// [`scalar_exp`] of two values (a segment merge's two rescale factors), on the SIMD paths
    /// compiled with the FMA instruction instead of calls to the C library's `fmaf`: both
    /// round once, so the bits are the same.
    pub(crate) fn scalar_exp_pair(self, a: f32, b: f32) -> (f32, f32) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` and `Avx512` are only constructed after detecting AVX2 and FMA.
            VectorOps::Avx2 | VectorOps::Avx512 => unsafe { avx2::scalar_exp_pair(a, b) },
            VectorOps::Scalar => (scalar_exp(a), scalar_exp(b)),
        }
    }

    /// Pairs one [`VectorOps::attend_group`] call of this path keeps in registers: callers
    /// group at most this many (a larger group is split, which changes nothing but speed).
    pub(crate) fn group(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            VectorOps::Avx2 => AVX2_GROUP,
            #[cfg(target_arch = "x86_64")]
            VectorOps::Avx512 => GROUP,
            VectorOps::Scalar => GROUP,
        }
    }

    /// Folds one tile into up to [`GROUP`] (row, head) pairs that all see the tile's first
    /// `tile.count` keys: `states[i]` and `accs[i * d..(i + 1) * d]` belong to `queries[i]`
    /// (`d = accs.len() / queries.len()`). Each K and V row is loaded once for all pairs, and
    /// each pair goes through exactly the operations it would alone (`tile_weights`, then
    /// `accumulate`), so the grouping never changes a pair's result. Does nothing if the
    /// shapes disagree or the tile does not fit its buffers.
    pub(crate) fn attend_group(
        self,
        queries: &[&[f32]],
        tile: KeyTile<'_>,
        scale: f32,
        states: &mut [OnlineSoftmax],
        accs: &mut [f32],
    ) {
        let n = queries.len();
        if n == 0 || n > GROUP || states.len() != n || !accs.len().is_multiple_of(n) {
            return;
        }
        let d = accs.len() / n;
        if queries.iter().any(|query| query.len() != d) || !tile.is_valid(d) {
            return;
        }
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and FMA; every query and
            // accumulator holds d values and the tile was validated against d.
            VectorOps::Avx2 => {
                // Groups of up to three: AVX2's registers hold no more.
                for (start, queries) in (0..n).step_by(AVX2_GROUP).zip(queries.chunks(AVX2_GROUP)) {
                    let m = queries.len();
                    let q = |i: usize| queries[i.min(m - 1)].as_ptr();
                    let states = &mut states[start..start + m];
                    let accs = &mut accs[start * d..(start + m) * d];
                    // SAFETY: as above, for the chunk's `m` pairs.
                    unsafe {
                        match m {
                            1 => avx2::attend_group::<1>([q(0)], tile, scale, states, accs),
                            2 => avx2::attend_group::<2>([q(0), q(1)], tile, scale, states, accs),
                            _ => avx2::attend_group::<3>(
                                [q(0), q(1), q(2)],
                                tile,
                                scale,
                                states,
                                accs,
                            ),
                        }
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx512` is only constructed after detecting AVX2, FMA and AVX-512 F/VL;
            // as above for the shapes.
            VectorOps::Avx512 => unsafe {
                let q = |i: usize| queries[i.min(n - 1)].as_ptr();
                match n {
                    1 => avx2::attend_group_wide::<1>([q(0)], tile, scale, states, accs),
                    2 => avx2::attend_group_wide::<2>([q(0), q(1)], tile, scale, states, accs),
                    3 => {
                        avx2::attend_group_wide::<3>([q(0), q(1), q(2)], tile, scale, states, accs)
                    }
                    4 => {
                        let q = [q(0), q(1), q(2), q(3)];
                        avx2::attend_group_wide::<4>(q, tile, scale, states, accs)
                    }
                    5 => {
                        let q = [q(0), q(1), q(2), q(3), q(4)];
                        avx2::attend_group_wide::<5>(q, tile, scale, states, accs)
                    }
                    _ => {
                        let q = [q(0), q(1), q(2), q(3), q(4), q(5)];
                        avx2::attend_group_wide::<6>(q, tile, scale, states, accs)
                    }
                }
            },
            VectorOps::Scalar => {
                for ((query, state), acc) in
                    queries.iter().zip(states).zip(accs.chunks_exact_mut(d))
                {
                    let weights = scalar_tile_weights(query, tile, scale, state);
                    scalar_accumulate(tile, &weights, acc);
                }
            }
        }
    }

    /// Both halves in one call.
    #[cfg(test)]
    pub(crate) fn attend_tile(
        self,
        query: &[f32],
        tile: KeyTile<'_>,
        scale: f32,
        state: &mut OnlineSoftmax,
        acc: &mut [f32],
    ) {
        if acc.len() != query.len() {
            return;
        }
        if let Some(weights) = self.tile_weights(query, tile, scale, state) {
            self.accumulate(tile, &weights, acc);
        }
    }
}

/// `e^x` exactly as the AVX2 path's `exp8` computes each lane: the same clamping, range
/// reduction `x = n·ln2 + r` (two fused steps), degree-6 polynomial in fused multiply-adds and
/// power-of-two scaling; inputs below -87.3 (and -inf) give exactly 0.
/// The AVX-512 lane mask of the first `n` of sixteen lanes (`n` above 16 counts as 16).
#[cfg(target_arch = "x86_64")]
pub(crate) fn first_lanes_mask(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// The exponential's constants, shared by [`scalar_exp`] and the 8- and 16-lane forms: the
/// clamp bounds, `ln 2` split in two for the range reduction, and the polynomial's
/// coefficients, highest degree first.
const EXP_LOW: f32 = -87.336_55;
const EXP_HIGH: f32 = 88.376_26;
const EXP_LN2_HIGH: f32 = 0.693_359_4;
const EXP_LN2_LOW: f32 = -2.121_944_4e-4;
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

#[inline]
pub(crate) fn scalar_exp(x: f32) -> f32 {
    let underflow = x < EXP_LOW;
    // `max_ps(x, LOW)` / `min_ps(., HIGH)`: the bound unless the comparison holds (NaN too).
    let x = if x > EXP_LOW { x } else { EXP_LOW };
    let x = if x < EXP_HIGH { x } else { EXP_HIGH };
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(EXP_LN2_HIGH, x);
    let r = (-n).mul_add(EXP_LN2_LOW, r);
    let mut y = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        y = y.mul_add(r, *c);
    }
    let r2 = r * r;
    let y = y.mul_add(r2, r) + 1.0;
    // n is integral and within [-126, 128] here.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if underflow {
        0.0
    } else {
        y * scale
    }
}

/// `q·k` as the AVX2 path sums it: eight lanes, each a chain of fused multiply-adds over the
/// 8-wide chunks in order (the last chunk zero-padded), reduced as
/// `((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))`.
fn scalar_dot(query: &[f32], key: &[f32]) -> f32 {
    let d = query.len().min(key.len());
    let mut lanes = [0.0f32; 8];
    for c in (0..d).step_by(8) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            let (q, k) = if c + l < d {
                (query[c + l], key[c + l])
            } else {
                (0.0, 0.0)
            };
            *lane = q.mul_add(k, *lane);
        }
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// Turns a tile's scaled scores into weights and updates the softmax state as the AVX2 path
/// does (the lanes of a 16-wide tile, absent keys at -inf); returns the factor the accumulator
/// must be rescaled by.
fn softmax_tile_weights(scores: &mut [f32], state: &mut OnlineSoftmax) -> f32 {
    let tile_max = scores
        .iter()
        .fold(f32::NEG_INFINITY, |m, &s| if m > s { m } else { s });
    let new_max = if tile_max > state.max {
        tile_max
    } else {
        state.max
    };
    let correction = scalar_exp(state.max - new_max);
    let mut lanes = [0.0f32; TILE];
    for (lane, score) in lanes.iter_mut().zip(scores.iter_mut()) {
        *score = scalar_exp(*score - new_max);
        *lane = *score;
    }
    // `sum_all(w0 + w1)`: the two 8-lane halves added, then the halves of that, in pairs.
    let v: [f32; 8] = std::array::from_fn(|i| lanes[i] + lanes[i + 8]);
    let tile_sum = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    state.sum = state.sum * correction + tile_sum;
    state.max = new_max;
    correction
}

fn scalar_tile_weights(
    query: &[f32],
    tile: KeyTile<'_>,
    scale: f32,
    state: &mut OnlineSoftmax,
) -> TileWeights {
    let d = query.len();
    let mut result = TileWeights {
        count: tile.count,
        ..TileWeights::EMPTY
    };
    let scores = &mut result.weights[..tile.count];
    for (t, score) in scores.iter_mut().enumerate() {
        *score = scalar_dot(query, &tile.keys[t * tile.stride..t * tile.stride + d]) * scale;
    }
    result.correction = softmax_tile_weights(scores, state);
    result
}

fn scalar_accumulate(tile: KeyTile<'_>, weights: &TileWeights, acc: &mut [f32]) {
    for (j, a) in acc.iter_mut().enumerate() {
        let mut value = *a * weights.correction;
        for (t, &weight) in weights.weights[..weights.count].iter().enumerate() {
            value = weight.mul_add(tile.values[t * tile.stride + j], value);
        }
        *a = value;
    }
}

#[cfg(test)]
fn scalar_attend_tile(
    query: &[f32],
    tile: KeyTile<'_>,
    scale: f32,
    state: &mut OnlineSoftmax,
    acc: &mut [f32],
) {
    let weights = scalar_tile_weights(query, tile, scale, state);
    scalar_accumulate(tile, &weights, acc);
}

fn scalar_silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + scalar_exp(0.0 - *g)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests;
