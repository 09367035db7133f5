//! Quick throughput check of the matmul kernels (not a criterion bench: one short timing loop
//! per case). Run: `cargo run --release -p tokenmill-kernels --example matmul_speed [threads]
//! [type|all] [batch sizes, comma-separated]`; `TOKENMILL_AMX=0` keeps AMX hosts on the AVX2
//! kernels, for comparing the two.

use std::time::Instant;

use tokenmill_kernels::{
    encode_float_row, quantize_row_q4_0, quantize_row_q4_1, quantize_row_q5_0, quantize_row_q5_1,
    quantize_row_q8_0, DType, MatmulScratch, QMatrix, ThreadPool,
};

fn random_values(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

fn build(
    dtype: DType,
    rows: usize,
    cols: usize,
    seed: &mut u64,
) -> Result<QMatrix, Box<dyn std::error::Error>> {
    let values = random_values(rows * cols, seed);
    let row_bytes = dtype.row_bytes(cols)?;
    let mut bytes = vec![0u8; rows * row_bytes];
    for (src, dst) in values
        .chunks_exact(cols)
        .zip(bytes.chunks_exact_mut(row_bytes))
    {
        match dtype {
            DType::Q8_0 => quantize_row_q8_0(src, dst)?,
            DType::Q4_0 => quantize_row_q4_0(src, dst)?,
            DType::Q4_1 => quantize_row_q4_1(src, dst)?,
            DType::Q5_0 => quantize_row_q5_0(src, dst)?,
            DType::Q5_1 => quantize_row_q5_1(src, dst)?,
            DType::F32 | DType::F16 | DType::BF16 => encode_float_row(dtype, src, dst)?,
            _ => {
                // K-quants and IQ4: random bytes with a small finite f16 scale at the right
                // offset (and K-quant min).
                for (i, b) in dst.iter_mut().enumerate() {
                    *b = (src[i % cols] * 127.0) as i8 as u8;
                }
                for block in dst.chunks_exact_mut(dtype.block_bytes()) {
                    let offset = if dtype == DType::Q6_K { 208 } else { 0 };
                    block[offset..offset + 2].copy_from_slice(&0x2000u16.to_le_bytes());
                    if matches!(dtype, DType::Q4_K | DType::Q5_K) {
                        block[2..4].copy_from_slice(&0x2000u16.to_le_bytes());
                    }
                }
            }
        }
    }
    Ok(QMatrix::from_bytes(dtype, rows, cols, &bytes)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let filter = std::env::args().nth(2).filter(|f| f != "all");
    let batches: Vec<usize> = match std::env::args().nth(3) {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 8, 64],
    };
    let pool = ThreadPool::new(threads);
    let mut scratch = MatmulScratch::new();
    let mut seed = 0x1234_5678_9abc_def0u64;
    println!(
        "threads={threads} cpu: {} amx={}",
        tokenmill_kernels::CpuFeatures::get(),
        tokenmill_kernels::amx_enabled()
    );
    let shapes = [
        (1536usize, 576usize),
        (576, 1536),
        (2048, 2048),
        (49152, 576),
    ];
    for dtype in [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q5_1,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::Q4_K,
        DType::Q6_K,
        DType::Q5_K,
        DType::F32,
    ] {
        if filter.as_deref().is_some_and(|f| f != dtype.name()) {
            continue;
        }
        for &(rows, cols) in &shapes {
            if cols % dtype.block_size() != 0 {
                continue;
            }
            let matrix = build(dtype, rows, cols, &mut seed)?;
            for &n in &batches {
                if rows > 10_000 && (n == 8 || n > 64) {
                    continue;
                }
                let x = random_values(n * cols, &mut seed);
                let mut out = vec![0.0f32; n * rows];
                matrix.matmul(&pool, &x, n, &mut out, &mut scratch)?;
                let flops_per_call = 2.0 * (rows * cols * n) as f64;
                // The machine is shared: take the best of many short windows, which filters
                // out preemption by other processes.
                let iterations = ((2e8 / flops_per_call) as usize).clamp(1, 200);
                let mut seconds = f64::INFINITY;
                for _ in 0..15 {
                    let start = Instant::now();
                    for _ in 0..iterations {
                        matrix.matmul(&pool, &x, n, &mut out, &mut scratch)?;
                    }
                    seconds = seconds.min(start.elapsed().as_secs_f64() / iterations as f64);
                }
                println!(
                    "{:>5} {rows:>6}x{cols:<5} n={n:<3} {:>9.1} us  {:>7.1} GFLOP/s  {:>6.1} GB/s weights",
                    dtype.name(),
                    seconds * 1e6,
                    flops_per_call / seconds / 1e9,
                    matrix.storage_bytes() as f64 / seconds / 1e9,
                );
            }
        }
    }
    Ok(())
}
