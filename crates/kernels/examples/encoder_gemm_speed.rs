//! Throughput of the encoder GEMMs, f32 [`PanelMatrix`] against bf16 [`Bf16PanelMatrix`] and
//! (where AMX is usable) [`Int8PairMatrix`], on
//! all-MiniLM-L6-v2's shapes (QKV 384→1152, output 384→384, MLP up 384→1536, down 1536→384),
//! alternating the two per shape, best of a few runs each. Kernels are this process's
//! (`TOKENMILL_KERNELS=avx2|scalar` narrows both; `TOKENMILL_VDPBF16PS=1` times the bf16
//! `vdpbf16ps` kernel).
//! Run: `cargo run --release -p tokenmill-kernels --example encoder_gemm_speed [threads]
//! [rows]` (defaults 2 and 2048).

use std::time::Instant;

use tokenmill_kernels::{Bf16PanelMatrix, CpuFeatures, Int8PairMatrix, PanelMatrix, ThreadPool};

mod common;

use common::random_values;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map_or(Ok(2), |v| v.parse())?;
    let n: usize = args.next().map_or(Ok(2048), |v| v.parse())?;
    let pool = ThreadPool::new(threads);
    println!("{}", CpuFeatures::get().summary());
    println!("{threads} threads, {n} rows; GFLOP/s (best of 5), bf16/f32 ratio");
    let mut seed = 0x1234_5678_9abc_def0u64;
    for (name, inputs, outputs) in [
        ("qkv 384->1152", 384, 1152),
        ("out 384->384", 384, 384),
        ("up 384->1536", 384, 1536),
        ("down 1536->384", 1536, 384),
    ] {
        let weights = random_values(inputs * outputs, &mut seed);
        let bias = random_values(outputs, &mut seed);
        let x = random_values(n * inputs, &mut seed);
        let f32_matrix = PanelMatrix::from_rows(outputs, inputs, &weights)?;
        let bf16_matrix = Bf16PanelMatrix::from_rows(outputs, inputs, &weights)?;
        let pair_matrix = Int8PairMatrix::supported()
            .then(|| Int8PairMatrix::from_rows(outputs, inputs, &weights))
            .transpose()?;
        let mut out = vec![0.0f32; n * outputs];
        let flops = 2.0 * (n * inputs * outputs) as f64;
        let (mut best_f32, mut best_bf16, mut best_pair) = (f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..5 {
            let start = Instant::now();
            f32_matrix.matmul(&pool, &x, n, Some(&bias), &mut out)?;
            best_f32 = best_f32.min(start.elapsed().as_secs_f64());
            let start = Instant::now();
            bf16_matrix.matmul(&pool, &x, n, Some(&bias), &mut out)?;
            best_bf16 = best_bf16.min(start.elapsed().as_secs_f64());
            if let Some(matrix) = &pair_matrix {
                let start = Instant::now();
                matrix.matmul(&pool, &x, n, Some(&bias), &mut out)?;
                best_pair = best_pair.min(start.elapsed().as_secs_f64());
            }
        }
        let pair = if pair_matrix.is_some() {
            format!(
                "  int8-pair {:7.1}  ratio {:.2}x",
                flops / best_pair / 1e9,
                best_f32 / best_pair
            )
        } else {
            "  int8-pair (no AMX)".to_string()
        };
        println!(
            "{name:16} f32 {:7.1}  bf16 {:7.1}  ratio {:.2}x{pair}",
            flops / best_f32 / 1e9,
            flops / best_bf16 / 1e9,
            best_f32 / best_bf16
        );
    }
    Ok(())
}
