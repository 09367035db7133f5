//! Shared by the kernel speed examples.

/// `n` values in `[-1, 1)` from a xorshift generator advanced in `seed` (deterministic inputs,
/// not a statistical source).
pub fn random_values(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}
