//! Quick throughput check of the matmul kernels per weight type, kernel path (every path this
//! host has, `KernelPath`, plus `QMatrix::matmul`'s own choice) and batch size
//! (default n = 1, 4, 16, 64, 256; not a criterion bench: best of a few short timing windows per
//! case). Run: `cargo run --release -p tokenmill-kernels --example matmul_speed [threads]
//! [TYPE|all] [ROWSxCOLS] [batch sizes, comma-separated]`. The last column is `QMatrix::matmul`
//! itself: AMX tiles from 8 rows (10 for Q4_1/Q5_1, 16 for Q5_K/Q6_K, 32 for Q4_K: `matmul::amx::min_rows`), where this process
//! may use them (`TOKENMILL_AMX=0` turns them off), the AVX-512 VNNI row sweeps over unpacked
//! tiles from 5 rows (`matmul::vnni_tiles`), else the best `KernelPath`. `MATMUL_SPEED_PATHS=matmul` (or a comma-separated
//! list of path names as printed, and/or `matmul`) times only those columns.

use std::time::Instant;

use tokenmill_kernels::{
    amx_enabled, encode_float_row, quantize_row_mxfp4, quantize_row_q4_0, quantize_row_q4_1,
    quantize_row_q5_0, quantize_row_q5_1, quantize_row_q8_0, CpuFeatures, DType, KernelPath,
    MatmulScratch, QMatrix, ThreadPool,
};

mod common;

use common::random_values;

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
            DType::MXFP4 => quantize_row_mxfp4(src, dst)?,
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

/// One timed column: a forced kernel path, or `QMatrix::matmul`'s own choice (AMX when on).
#[derive(Clone, Copy)]
enum Runner {
    Path(KernelPath),
    Default,
}

impl Runner {
    fn run(
        self,
        matrix: &QMatrix,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut MatmulScratch,
    ) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Runner::Path(path) => matrix.matmul_on(path, pool, x, n, out, scratch)?,
            Runner::Default => matrix.matmul(pool, x, n, out, scratch)?,
        }
        Ok(())
    }
}

/// Seconds per call of each runner in `paths`: the best of several short
/// windows, the paths taking turns inside each window so that load from other processes
/// (the machine is shared) hits them alike; the minimum filters out preemption.
fn time_paths(
    matrix: &QMatrix,
    paths: &[Runner],
    pool: &ThreadPool,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    // Short windows (about 2 ms) have a fair chance to run unpreempted on a loaded machine;
    // each path gets about 0.3 s of them (at least 3).
    let mut iterations = Vec::new();
    let mut windows = 3;
    for &path in paths {
        let start = Instant::now();
        path.run(matrix, pool, x, n, out, scratch)?;
        let once = start.elapsed().as_secs_f64().max(1e-7);
        let count = ((0.002 / once) as usize).clamp(1, 1000);
        iterations.push(count);
        windows = windows.max(((0.3 / (once * count as f64)) as usize).min(60));
    }
    let mut best = vec![f64::INFINITY; paths.len()];
    for window in 0..windows {
        for ((&path, &count), best) in paths.iter().zip(&iterations).zip(best.iter_mut()) {
            // Slow paths (scalar) stop after their 0.3 s.
            if window >= 3 && *best * count as f64 * window as f64 > 0.3 {
                continue;
            }
            let start = Instant::now();
            for _ in 0..count {
                path.run(matrix, pool, x, n, out, scratch)?;
            }
            *best = best.min(start.elapsed().as_secs_f64() / count as f64);
        }
    }
    Ok(best)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let filter = args.next().filter(|f| f != "all");
    let (rows, cols) = match args.next() {
        Some(shape) => {
            let (r, c) = shape.split_once('x').ok_or("shape is ROWSxCOLS")?;
            (r.parse()?, c.parse()?)
        }
        None => (1536usize, 1536usize),
    };
    let batches: Vec<usize> = match args.next() {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 4, 16, 64, 256],
    };
    let pool = ThreadPool::new(threads);
    let mut scratch = MatmulScratch::new();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let cpu = CpuFeatures::get();
    let wanted = std::env::var("MATMUL_SPEED_PATHS").ok();
    let wants = |name: &str| {
        wanted
            .as_deref()
            .is_none_or(|list| list.split(',').any(|w| w.eq_ignore_ascii_case(name)))
    };
    let paths: Vec<KernelPath> = KernelPath::ALL
        .into_iter()
        .filter(|path| wants(&path.to_string()))
        .filter(|path| {
            let missing = path.missing(cpu);
            if !missing.is_empty() {
                println!("# {path}: skipped, this host lacks {}", missing.join(" "));
            }
            missing.is_empty()
        })
        .collect();
    let own = wants("matmul");
    println!("# {} amx={}", cpu.summary(), amx_enabled());
    println!("# threads={threads} weights {rows}x{cols}; per path: us per call, GFLOP/s");
    print!("{:<7}{:>5}", "type", "n");
    for path in &paths {
        print!("{:>26}", path.to_string());
    }
    if own {
        print!("{:>26}", "matmul (its own choice)");
    }
    println!();
    let mut runners: Vec<Runner> = paths.iter().map(|&path| Runner::Path(path)).collect();
    if own {
        runners.push(Runner::Default);
    }
    for dtype in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::F32,
        DType::F16,
    ] {
        if filter
            .as_deref()
            .is_some_and(|f| !f.eq_ignore_ascii_case(dtype.name()))
        {
            continue;
        }
        if cols % dtype.block_size() != 0 {
            println!(
                "# {}: {cols} columns are no whole number of blocks",
                dtype.name()
            );
            continue;
        }
        let matrix = build(dtype, rows, cols, &mut seed)?;
        for &n in &batches {
            let x = random_values(n * cols, &mut seed);
            let mut out = vec![0.0f32; n * rows];
            let flops = 2.0 * (rows * cols * n) as f64;
            print!("{:<7}{n:>5}", dtype.name());
            let times = time_paths(&matrix, &runners, &pool, &x, n, &mut out, &mut scratch)?;
            for seconds in times {
                print!(
                    "{:>15.1} us {:>6.1} GF",
                    seconds * 1e6,
                    flops / seconds / 1e9
                );
            }
            println!();
        }
    }
    Ok(())
}
