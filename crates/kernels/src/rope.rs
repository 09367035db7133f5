//! Rotary position embeddings from a precomputed cos/sin table.

use crate::KernelError;

/// How the model stretches RoPE frequencies for longer contexts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// Context extension factor.
        factor: f32,
    },
    /// Llama 3.x frequency-dependent scaling (HF `_compute_llama3_parameters`): long
    /// wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    Llama3 {
        /// Context extension factor.
        factor: f32,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f32,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
    /// YaRN (HF `_compute_yarn_parameters`, llama.cpp's `rope_yarn`): pair `i` turns at
    /// `θᵢ / factor · (1 − rᵢ) + θᵢ · rᵢ`, where the ramp `rᵢ` is 1 for pairs that turn more
    /// than `beta_fast` times over the original context, 0 for those that turn fewer than
    /// `beta_slow` times, linear between; cos and sin are multiplied by `attention_factor`.
    Yarn {
        /// Context extension factor.
        factor: f32,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
        /// Rotations over the original context above which a pair keeps its frequency.
        beta_fast: f32,
        /// Rotations below which a pair is fully interpolated.
        beta_slow: f32,
        /// cos and sin are multiplied by it (`0.1 ln(factor) + 1` unless the model says).
        attention_factor: f32,
        /// The ramp's ends are rounded outwards to whole pairs (HF's default and llama.cpp's
        /// only behaviour); gpt-oss is trained without (`truncate: false`).
        truncate: bool,
    },
}

/// Which dimensions form a rotation pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i + 1)`: GGUF Llama checkpoints (llama.cpp permutes Q/K so this holds).
    Normal,
    /// Split halves `(i, i + d/2)`: HF checkpoints, Qwen2 and GPT-NeoX.
    Neox,
}

/// cos/sin of `position · inv_freq[i]` for positions `0..max_positions`, computed in f64 and
/// stored as f32. Positions past the table are computed on the fly the same way, so they give
/// the same values a larger table would.
#[derive(Debug, Clone)]
pub struct RopeCache {
    rotary_dim: usize,
    max_positions: usize,
    inv_freq: Vec<f64>,
    /// cos and sin are multiplied by it (LongRoPE's attention factor; 1 otherwise).
    magnitude: f64,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeCache {
    /// Builds the table for `rotary_dim` rotated dimensions per head (even, usually
    /// `head_dim`).
    pub fn new(
        rotary_dim: usize,
        theta: f32,
        max_positions: usize,
        scaling: RopeScaling,
    ) -> Result<RopeCache, KernelError> {
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(KernelError::InvalidShape(
                "rotary_dim must be even and non-zero",
            ));
        }
        if theta.is_nan() || theta <= 0.0 {
            return Err(KernelError::InvalidShape("rope theta must be positive"));
        }
        let half = rotary_dim / 2;
        if let RopeScaling::Yarn {
            factor,
            attention_factor,
            ..
        } = scaling
        {
            if !(factor.is_finite() && factor > 0.0 && attention_factor.is_finite()) {
                return Err(KernelError::InvalidShape(
                    "yarn factor must be positive and the attention factor finite",
                ));
            }
            let ramp = yarn_ramp(theta, rotary_dim, scaling);
            let inv_freq = (0..half)
                .map(|i| {
                    let extrapolated = base_frequency(theta, i, rotary_dim);
                    let interpolated = extrapolated / f64::from(factor);
                    interpolated * (1.0 - ramp[i]) + extrapolated * ramp[i]
                })
                .collect();
            return Ok(RopeCache::from_frequencies(
                rotary_dim,
                max_positions,
                inv_freq,
                f64::from(attention_factor),
            ));
        }
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| scale_frequency(base_frequency(theta, i, rotary_dim), scaling))
            .collect();
        Ok(RopeCache::from_frequencies(
            rotary_dim,
            max_positions,
            inv_freq,
            1.0,
        ))
    }

    /// LongRoPE (Phi-3's `rope_factors_long`/`_short`, llama.cpp's `freq_factors`): pair `i`
    /// turns at `theta^(-2i/rotary_dim) / factors[i]`, and cos and sin are multiplied by
    /// `magnitude` (the attention factor `sqrt(1 + ln(s) / ln(original context))`).
    pub fn with_frequency_factors(
        rotary_dim: usize,
        theta: f32,
        max_positions: usize,
        factors: &[f32],
        magnitude: f32,
    ) -> Result<RopeCache, KernelError> {
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(KernelError::InvalidShape(
                "rotary_dim must be even and non-zero",
            ));
        }
        if theta.is_nan() || theta <= 0.0 {
            return Err(KernelError::InvalidShape("rope theta must be positive"));
        }
        if factors.len() != rotary_dim / 2 {
            return Err(KernelError::LengthMismatch {
                what: "rope frequency factors",
                expected: rotary_dim / 2,
                actual: factors.len(),
            });
        }
        if factors.iter().any(|&f| f.is_nan() || f <= 0.0) || !magnitude.is_finite() {
            return Err(KernelError::InvalidShape(
                "rope frequency factors must be positive and the magnitude finite",
            ));
        }
        let inv_freq = factors
            .iter()
            .enumerate()
            .map(|(i, &factor)| base_frequency(theta, i, rotary_dim) / f64::from(factor))
            .collect();
        Ok(RopeCache::from_frequencies(
            rotary_dim,
            max_positions,
            inv_freq,
            f64::from(magnitude),
        ))
    }

    fn from_frequencies(
        rotary_dim: usize,
        max_positions: usize,
        inv_freq: Vec<f64>,
        magnitude: f64,
    ) -> RopeCache {
        let half = rotary_dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for position in 0..max_positions {
            for &frequency in &inv_freq {
                let angle = position as f64 * frequency;
                cos.push((angle.cos() * magnitude) as f32);
                sin.push((angle.sin() * magnitude) as f32);
            }
        }
        RopeCache {
            rotary_dim,
            max_positions,
            inv_freq,
            magnitude,
            cos,
            sin,
        }
    }

    /// Rotated dimensions per head.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// Positions covered by the precomputed table.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The (possibly scaled) inverse frequencies, one per rotation pair.
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    /// Fills `cos`/`sin` (length `rotary_dim / 2`) for `position`.
    fn angles(&self, position: usize, cos: &mut [f32], sin: &mut [f32]) {
        let half = self.rotary_dim / 2;
        if position < self.max_positions {
            cos.copy_from_slice(&self.cos[position * half..(position + 1) * half]);
            sin.copy_from_slice(&self.sin[position * half..(position + 1) * half]);
        } else {
            for ((c, s), &frequency) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
                let angle = position as f64 * frequency;
                *c = (angle.cos() * self.magnitude) as f32;
                *s = (angle.sin() * self.magnitude) as f32;
            }
        }
    }
}

/// `theta^(-2i/rotary_dim)`: pair `i`'s unscaled frequency.
fn base_frequency(theta: f32, pair: usize, rotary_dim: usize) -> f64 {
    1.0 / f64::from(theta).powf((2 * pair) as f64 / rotary_dim as f64)
}

/// YaRN's per-pair extrapolation weight `rᵢ` ([`RopeScaling::Yarn`]): 1 − the clamped linear
/// ramp between the pairs that turn `beta_fast` and `beta_slow` times over the original
/// context. Other scalings: all ones.
fn yarn_ramp(theta: f32, rotary_dim: usize, scaling: RopeScaling) -> Vec<f64> {
    let half = rotary_dim / 2;
    let RopeScaling::Yarn {
        original_max_position_embeddings,
        beta_fast,
        beta_slow,
        truncate,
        ..
    } = scaling
    else {
        return vec![1.0; half];
    };
    let dim = rotary_dim as f64;
    let original = original_max_position_embeddings as f64;
    // The pair index at which a frequency turns `rotations` times over the original context.
    let pair_of = |rotations: f32| {
        dim * (original / (f64::from(rotations) * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * f64::from(theta).ln())
    };
    let (mut low, mut high) = (pair_of(beta_fast), pair_of(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    (0..half)
        .map(|i| 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0))
        .collect()
}

fn scale_frequency(inv_freq: f64, scaling: RopeScaling) -> f64 {
    match scaling {
        RopeScaling::None | RopeScaling::Yarn { .. } => inv_freq,
        RopeScaling::Linear { factor } => inv_freq / f64::from(factor),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let factor = f64::from(factor);
            let low = f64::from(low_freq_factor);
            let high = f64::from(high_freq_factor);
            let original = original_max_position_embeddings as f64;
            let low_freq_wavelen = original / low;
            let high_freq_wavelen = original / high;
            let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
            if wavelen < high_freq_wavelen {
                inv_freq
            } else if wavelen > low_freq_wavelen {
                inv_freq / factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            }
        }
    }
}

/// Rotates the first `cache.rotary_dim()` dimensions of every head of
/// `x[n_tokens][n_heads][head_dim]` by the angle of that token's position.
pub fn apply_rope(
    x: &mut [f32],
    n_tokens: usize,
    n_heads: usize,
    head_dim: usize,
    positions: &[u32],
    cache: &RopeCache,
    style: RopeStyle,
) -> Result<(), KernelError> {
    if x.len() != n_tokens * n_heads * head_dim {
        return Err(KernelError::LengthMismatch {
            what: "rope input",
            expected: n_tokens * n_heads * head_dim,
            actual: x.len(),
        });
    }
    if positions.len() != n_tokens {
        return Err(KernelError::LengthMismatch {
            what: "rope positions",
            expected: n_tokens,
            actual: positions.len(),
        });
    }
    let rotary_dim = cache.rotary_dim;
    if rotary_dim > head_dim {
        return Err(KernelError::InvalidShape("rotary_dim exceeds head_dim"));
    }
    let half = rotary_dim / 2;
    let mut cos_buffer = [0.0f32; 256];
    let mut sin_buffer = [0.0f32; 256];
    let mut cos_heap = Vec::new();
    let mut sin_heap = Vec::new();
    let (cos, sin): (&mut [f32], &mut [f32]) = if half <= 256 {
        (&mut cos_buffer[..half], &mut sin_buffer[..half])
    } else {
        cos_heap.resize(half, 0.0);
        sin_heap.resize(half, 0.0);
        (&mut cos_heap, &mut sin_heap)
    };
    if head_dim == 0 || n_heads == 0 {
        return Ok(());
    }
    for (token, &position) in x.chunks_exact_mut(n_heads * head_dim).zip(positions) {
        cache.angles(position as usize, cos, sin);
        for head in token.chunks_exact_mut(head_dim) {
            match style {
                RopeStyle::Normal => {
                    for (pair, (&c, &s)) in head[..rotary_dim]
                        .chunks_exact_mut(2)
                        .zip(cos.iter().zip(sin.iter()))
                    {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * c - b * s;
                        pair[1] = a * s + b * c;
                    }
                }
                RopeStyle::Neox => {
                    let (first, second) = head[..rotary_dim].split_at_mut(half);
                    for (((a, b), &c), &s) in
                        first.iter_mut().zip(second).zip(cos.iter()).zip(sin.iter())
                    {
                        let (x0, x1) = (*a, *b);
                        *a = x0 * c - x1 * s;
                        *b = x0 * s + x1 * c;
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_and_neox_pairs() {
        let cache = RopeCache::new(4, 10_000.0, 8, RopeScaling::None).unwrap();
        // Position 1: pair 0 angle 1 rad, pair 1 angle 0.01 rad.
        let mut x = vec![1.0f32, 0.0, 1.0, 0.0];
        apply_rope(&mut x, 1, 1, 4, &[1], &cache, RopeStyle::Normal).unwrap();
        assert!((x[0] - 1.0f32.cos()).abs() < 1e-6);
        assert!((x[1] - 1.0f32.sin()).abs() < 1e-6);
        assert!((x[2] - 0.01f32.cos()).abs() < 1e-6);
        assert!((x[3] - 0.01f32.sin()).abs() < 1e-6);

        let mut y = vec![1.0f32, 1.0, 0.0, 0.0];
        apply_rope(&mut y, 1, 1, 4, &[1], &cache, RopeStyle::Neox).unwrap();
        assert!((y[0] - 1.0f32.cos()).abs() < 1e-6);
        assert!((y[2] - 1.0f32.sin()).abs() < 1e-6);
        assert!((y[1] - 0.01f32.cos()).abs() < 1e-6);
        assert!((y[3] - 0.01f32.sin()).abs() < 1e-6);
    }

    /// gpt-oss's YaRN (64 dims, base 150,000, factor 32 over 4,096 positions, betas 32 and
    /// 1): the ramp runs from pair 8.09 to 17.41 (8 to 18 truncated); fast pairs keep their
    /// frequency, slow ones are divided by the factor, and cos/sin carry the attention factor.
    #[test]
    fn yarn_blends_extrapolated_and_interpolated_frequencies() {
        let yarn = |truncate| RopeScaling::Yarn {
            factor: 32.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.0 + 0.1 * 32f32.ln(),
            truncate,
        };
        let base = |i: usize| 1.0 / 150_000f64.powf(2.0 * i as f64 / 64.0);
        let cache = RopeCache::new(64, 150_000.0, 4, yarn(false)).unwrap();
        let freq = cache.inv_freq();
        for (i, &f) in freq.iter().enumerate().take(9) {
            assert_eq!(f, base(i), "pair {i} extrapolates");
        }
        for (i, &f) in freq.iter().enumerate().skip(18) {
            assert!((f - base(i) / 32.0).abs() < 1e-15, "pair {i} interpolates");
        }
        assert!(freq[12] < base(12) && freq[12] > base(12) / 32.0);
        // Truncated: the ramp's ends are whole pairs, so pair 13 is the exact midpoint.
        let truncated = RopeCache::new(64, 150_000.0, 4, yarn(true)).unwrap();
        let mid = base(13) / 32.0 * 0.5 + base(13) * 0.5;
        assert!((truncated.inv_freq()[13] - mid).abs() < 1e-15);
        assert_ne!(truncated.inv_freq()[12], freq[12]);
        // Position 0 is cos = attention factor, sin = 0.
        let mut x = vec![1.0f32; 64];
        apply_rope(&mut x, 1, 1, 64, &[0], &cache, RopeStyle::Neox).unwrap();
        assert!(x
            .iter()
            .all(|&v| (v - (1.0 + 0.1 * 32f32.ln())).abs() < 1e-6));
        let bad = RopeScaling::Yarn {
            factor: 0.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.0,
            truncate: false,
        };
        assert!(RopeCache::new(64, 150_000.0, 4, bad).is_err());
    }

    #[test]
    fn partial_rotary_leaves_tail_and_position_zero_is_identity() {
        let cache = RopeCache::new(2, 10_000.0, 4, RopeScaling::None).unwrap();
        let mut x = vec![0.3f32, -0.7, 5.0, 6.0, 1.0, 2.0, 3.0, 4.0];
        apply_rope(&mut x, 2, 1, 4, &[0, 3], &cache, RopeStyle::Normal).unwrap();
        assert_eq!(&x[..4], &[0.3, -0.7, 5.0, 6.0]);
        assert_eq!(&x[6..], &[3.0, 4.0]);
        assert!((x[4] - (3.0f32.cos() - 2.0 * 3.0f32.sin())).abs() < 1e-5);
    }

    #[test]
    fn positions_past_table_match_a_larger_table() {
        let small = RopeCache::new(8, 500_000.0, 4, RopeScaling::None).unwrap();
        let large = RopeCache::new(8, 500_000.0, 100, RopeScaling::None).unwrap();
        let base: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
        let mut a = base.clone();
        let mut b = base;
        apply_rope(&mut a, 2, 1, 8, &[50, 99], &small, RopeStyle::Neox).unwrap();
        apply_rope(&mut b, 2, 1, 8, &[50, 99], &large, RopeStyle::Neox).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn scaling_rules() {
        let linear = RopeCache::new(4, 10_000.0, 1, RopeScaling::Linear { factor: 4.0 }).unwrap();
        assert!((linear.inv_freq()[1] - 0.01 / 4.0).abs() < 1e-15);

        // Llama 3.1 parameters with head_dim 128, theta 500000.
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let plain = RopeCache::new(128, 500_000.0, 1, RopeScaling::None).unwrap();
        let llama3 = RopeCache::new(128, 500_000.0, 1, scaling).unwrap();
        for (i, (&p, &s)) in plain.inv_freq().iter().zip(llama3.inv_freq()).enumerate() {
            let wavelen = 2.0 * std::f64::consts::PI / p;
            if wavelen < 8192.0 / 4.0 {
                assert_eq!(p, s, "high-frequency pair {i} unchanged");
            } else if wavelen > 8192.0 {
                assert!(
                    (s - p / 8.0).abs() < 1e-18,
                    "low-frequency pair {i} divided"
                );
            } else {
                assert!(s < p && s > p / 8.0, "pair {i} interpolated");
            }
        }
        // The first pair (wavelength 2π) is unchanged; the last is divided by 8.
        assert_eq!(llama3.inv_freq()[0], 1.0);
        assert!((llama3.inv_freq()[63] - plain.inv_freq()[63] / 8.0).abs() < 1e-18);
    }

    #[test]
    fn frequency_factors_divide_frequencies_and_scale_magnitude() {
        let plain = RopeCache::new(8, 10_000.0, 64, RopeScaling::None).unwrap();
        let factors = [1.0, 2.0, 4.0, 8.0];
        let longrope = RopeCache::with_frequency_factors(8, 10_000.0, 64, &factors, 1.25).unwrap();
        for (i, (&p, &l)) in plain.inv_freq().iter().zip(longrope.inv_freq()).enumerate() {
            assert_eq!(l, p / f64::from(factors[i]), "pair {i}");
        }
        // Position 0 rotates nothing but scales both halves by the magnitude; past the table
        // the same values as inside it.
        let base: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
        let mut x = base.clone();
        apply_rope(&mut x, 2, 1, 8, &[0, 0], &longrope, RopeStyle::Neox).unwrap();
        for (a, b) in x.iter().zip(&base) {
            assert!((a - b * 1.25).abs() < 1e-6);
        }
        let small = RopeCache::with_frequency_factors(8, 10_000.0, 2, &factors, 1.25).unwrap();
        let (mut a, mut b) = (base.clone(), base);
        apply_rope(&mut a, 2, 1, 8, &[30, 63], &small, RopeStyle::Neox).unwrap();
        apply_rope(&mut b, 2, 1, 8, &[30, 63], &longrope, RopeStyle::Neox).unwrap();
        assert_eq!(a, b);
        assert!(RopeCache::with_frequency_factors(8, 10_000.0, 2, &factors[..3], 1.0).is_err());
        assert!(
            RopeCache::with_frequency_factors(8, 10_000.0, 2, &[1.0, 0.0, 1.0, 1.0], 1.0).is_err()
        );
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(RopeCache::new(3, 10_000.0, 4, RopeScaling::None).is_err());
        let cache = RopeCache::new(8, 10_000.0, 4, RopeScaling::None).unwrap();
        let mut x = vec![0.0f32; 4];
        assert!(apply_rope(&mut x, 1, 1, 4, &[0], &cache, RopeStyle::Normal).is_err());
        assert!(apply_rope(&mut x, 1, 1, 4, &[], &cache, RopeStyle::Normal).is_err());
    }
}
