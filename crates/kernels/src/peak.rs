//! Machine-peak probes for benchmark reports (`tokenmill bench speed`): the f32 FMA throughput
//! of a register-resident loop, and the streaming read bandwidth of main memory. Neither is
//! used by the forward pass; they give measured figures a ceiling to be read against.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::cpu::CpuFeatures;

/// Independent accumulator registers of the FMA loop: enough to cover FMA latency (4-5
/// cycles) times two FMA pipes on current x86 cores, few enough to stay in 16 registers.
const ACCUMULATORS: usize = 12;
/// Loop iterations between clock reads.
const ITERATIONS_PER_CHUNK: usize = 1 << 16;
/// The recurrence `acc = acc * A + B` converges to `B / (1 - A)`: no overflow, no denormals.
const A: f32 = 0.999_9;
const B: f32 = 1.0e-3;

/// Measures the f32 FMA peak in GFLOP/s (an FMA counts as two FLOPs) with `threads` threads
/// each running a register-resident FMA loop for about `duration`. Uses AVX2+FMA when the CPU
/// has them, else a scalar multiply-add loop (whose figure is then the scalar peak).
pub fn fma_peak_gflops(threads: usize, duration: Duration) -> f64 {
    let threads = threads.max(1);
    let kernel = FmaKernel::detect();
    let started = Instant::now();
    let iterations: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (1..threads)
            .map(|index| scope.spawn(move || run_fma_for(kernel, duration, index as f32)))
            .collect();
        let own = run_fma_for(kernel, duration, 0.0);
        own + workers
            .into_iter()
            .map(|worker| worker.join().unwrap_or(0))
            .sum::<usize>()
    });
    let seconds = started.elapsed().as_secs_f64();
    iterations as f64 * kernel.flops_per_iteration() as f64 / seconds / 1e9
}

/// Measures the streaming read bandwidth in GB/s (1e9 bytes per second): `threads` threads sum
/// disjoint parts of a `bytes`-sized buffer, pass after pass for about `duration` (at least
/// two passes); the fastest pass counts. The buffer is written once first so that every page
/// is backed by its own memory, and it is a `WeightBuf` like the
/// repacked weights (huge pages where the OS grants them), so a decode's weight GB/s compares
/// with a peak read the same way. Returns 0 if the buffer cannot be sized.
pub fn read_bandwidth_gbs(threads: usize, bytes: usize, duration: Duration) -> f64 {
    let threads = threads.max(1);
    let words = (bytes / 8).max(threads * 64);
    let Ok(mut buffer) = crate::weight_buf::WeightBuf::<u64>::zeroed(words) else {
        return 0.0;
    };
    for (i, word) in buffer.iter_mut().enumerate() {
        *word = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    let part = words.div_ceil(threads);
    let started = Instant::now();
    let mut best = f64::INFINITY;
    let mut passes = 0;
    while passes < 2 || started.elapsed() < duration {
        let pass_started = Instant::now();
        let total = std::thread::scope(|scope| {
            let mut parts = buffer.chunks(part);
            let own = parts.next().unwrap_or(&[]);
            let workers: Vec<_> = parts
                .map(|chunk| scope.spawn(move || sum_words(chunk)))
                .collect();
            let mut total = sum_words(own);
            for worker in workers {
                total = total.wrapping_add(worker.join().unwrap_or(0));
            }
            total
        });
        black_box(total);
        best = best.min(pass_started.elapsed().as_secs_f64());
        passes += 1;
    }
    (words * 8) as f64 / best / 1e9
}

/// Wrapping sum of `words` with eight independent lanes (vectorizes to packed adds).
fn sum_words(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &word) in lanes.iter_mut().zip(chunk) {
            *lane = lane.wrapping_add(word);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |acc, &word| acc.wrapping_add(word));
    lanes.iter().fold(tail, |acc, &lane| acc.wrapping_add(lane))
}

fn run_fma_for(kernel: FmaKernel, duration: Duration, seed: f32) -> usize {
    let started = Instant::now();
    let mut iterations = 0;
    let mut sink = 0.0f32;
    while iterations == 0 || started.elapsed() < duration {
        sink += kernel.run(ITERATIONS_PER_CHUNK, black_box(seed));
        iterations += ITERATIONS_PER_CHUNK;
    }
    black_box(sink);
    iterations
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FmaKernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl From<&CpuFeatures> for FmaKernel {
    fn from(features: &CpuFeatures) -> FmaKernel {
        #[cfg(target_arch = "x86_64")]
        {
            let usable = features.usable();
            if usable.avx2 && usable.fma {
                return FmaKernel::Avx2;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = features;
        FmaKernel::Scalar
    }
}

impl FmaKernel {
    /// The path for this process's [`CpuFeatures`].
    fn detect() -> FmaKernel {
        FmaKernel::from(CpuFeatures::get())
    }

    /// FLOPs of one loop iteration: one multiply-add (2 FLOPs) per lane per accumulator.
    fn flops_per_iteration(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            FmaKernel::Avx2 => 2 * 8 * ACCUMULATORS,
            FmaKernel::Scalar => 2 * ACCUMULATORS,
        }
    }

    /// Runs `iterations` steps of the recurrence on every accumulator lane (all starting at
    /// `seed`) and returns the sum of all lanes.
    fn run(self, iterations: usize, seed: f32) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and FMA.
            FmaKernel::Avx2 => unsafe { avx2::fma_loop(iterations, seed) },
            FmaKernel::Scalar => scalar_fma_loop(iterations, seed),
        }
    }
}

/// The portable loop: `ACCUMULATORS` independent scalar multiply-adds per iteration.
fn scalar_fma_loop(iterations: usize, seed: f32) -> f32 {
    let mut acc = [seed; ACCUMULATORS];
    for _ in 0..iterations {
        for value in &mut acc {
            *value = *value * A + B;
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{A, ACCUMULATORS, B};

    /// `ACCUMULATORS` × 8 lanes of `acc = fma(acc, A, B)`, all lanes starting at `seed`;
    /// returns the sum of all lanes (accumulator by accumulator, lanes in order).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn fma_loop(iterations: usize, seed: f32) -> f32 {
        let a = _mm256_set1_ps(A);
        let b = _mm256_set1_ps(B);
        let mut acc = [_mm256_set1_ps(seed); ACCUMULATORS];
        for _ in 0..iterations {
            for value in &mut acc {
                *value = _mm256_fmadd_ps(*value, a, b);
            }
        }
        let mut total = 0.0f32;
        for value in acc {
            let mut lanes = [0.0f32; 8];
            // SAFETY: `lanes` holds exactly the 8 f32 an unaligned 256-bit store writes.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), value) };
            total += lanes.iter().sum::<f32>();
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar recurrence with a fused multiply-add, exactly what each AVX2 lane computes.
    fn fused_reference(iterations: usize, seed: f32) -> f32 {
        let mut value = seed;
        for _ in 0..iterations {
            value = value.mul_add(A, B);
        }
        value
    }

    #[test]
    fn the_simd_loop_computes_the_fused_recurrence_on_every_lane() {
        let kernel = FmaKernel::detect();
        for (iterations, seed) in [(0, 1.5f32), (1, 0.25), (1000, -3.0), (70_000, 2.0)] {
            let lane = fused_reference(iterations, seed);
            let expected = match kernel {
                #[cfg(target_arch = "x86_64")]
                FmaKernel::Avx2 => {
                    let mut total = 0.0f32;
                    for _ in 0..ACCUMULATORS {
                        total += [lane; 8].iter().sum::<f32>();
                    }
                    total
                }
                FmaKernel::Scalar => scalar_fma_loop(iterations, seed),
            };
            assert_eq!(
                kernel.run(iterations, seed),
                expected,
                "{iterations} {seed}"
            );
        }
        // Scalar and fused agree within rounding, so the recurrence itself is the same.
        let scalar = scalar_fma_loop(1000, -3.0) / ACCUMULATORS as f32;
        assert!((scalar - fused_reference(1000, -3.0)).abs() < 1e-4);
    }

    #[test]
    fn the_sum_covers_every_word_including_the_tail() {
        let words: Vec<u64> = (1..=1001).collect();
        assert_eq!(sum_words(&words), 1001 * 1002 / 2);
        assert_eq!(sum_words(&[]), 0);
        assert_eq!(sum_words(&[u64::MAX, 2]), 1);
    }

    #[test]
    fn probes_report_finite_positive_figures() {
        let gflops = fma_peak_gflops(2, Duration::from_millis(20));
        assert!(gflops.is_finite() && gflops > 0.0, "{gflops}");
        let gbs = read_bandwidth_gbs(2, 4 << 20, Duration::from_millis(20));
        assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
        // Degenerate inputs still measure something.
        assert!(read_bandwidth_gbs(0, 0, Duration::ZERO) > 0.0);
    }
}
