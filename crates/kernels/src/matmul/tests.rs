use super::*;
use crate::cpu::KernelPath;
use crate::dtype::f32_to_f16;
use crate::quant::QK;
use crate::test_util::{random_weights, Rng};

/// Bound on |kernel - f32 reference| for one output element: int8 activation quantization moves
/// each x by at most half a step (`amax_block / 254`), so the dot moves by at most
/// `Σ |w| · amax_block / 254`; f32 accumulation adds a relative `1e-5 · Σ |w·x|`.
fn tolerance(dtype: DType, weights: &[f32], x: &[f32]) -> f64 {
    let magnitude: f64 = weights
        .iter()
        .zip(x)
        .map(|(&w, &v)| f64::from(w).abs() * f64::from(v).abs())
        .sum();
    let quantization: f64 = if dtype.is_quantized() {
        weights
            .chunks(QK)
            .zip(x.chunks(QK))
            .map(|(w, xb)| {
                let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let w_abs: f64 = w.iter().map(|&v| f64::from(v).abs()).sum();
                w_abs * f64::from(amax) / 254.0
            })
            .sum()
    } else {
        0.0
    };
    quantization * 1.001 + 1e-5 * magnitude + 1e-6
}

/// The types held in the interleaved layout, whose scalar twin is bitwise equal to SIMD.
const INTERLEAVED: [DType; 8] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::MXFP4,
];

/// Every kernel path this process may run, scalar first; prints the ones skipped because the
/// host lacks them (or `TOKENMILL_KERNELS` narrowed them away).
fn isas() -> Vec<Isa> {
    let mut isas = Vec::new();
    for path in KernelPath::ALL {
        match Isa::for_path(path) {
            Some(isa) => isas.push(isa),
            None => eprintln!("matmul tests: {path} path skipped: this host lacks it (or TOKENMILL_KERNELS excludes it)"),
        }
    }
    isas
}

/// The SIMD paths of [`isas`].
fn simd_isas() -> Vec<Isa> {
    isas()
        .into_iter()
        .filter(|&isa| isa != Isa::Scalar)
        .collect()
}

/// All eleven quantized weight types.
pub(super) const QUANTIZED: [DType; 11] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::MXFP4,
];

/// `matrix · x` on `isa` as bit patterns (the output prefilled with NaN, so an element a
/// kernel skips shows).
pub(super) fn isa_bits(
    isa: Isa,
    matrix: &QMatrix,
    x: &[f32],
    n: usize,
    pool: &ThreadPool,
) -> Vec<u32> {
    let mut out = vec![f32::NAN; n * matrix.out_features()];
    let mut scratch = MatmulScratch::new();
    matrix
        .matmul_with_isa(isa, pool, x, n, &mut out, &mut scratch)
        .unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

/// `matrix · x` through the public [`QMatrix::matmul`] (its own choice of path) as bits.
pub(super) fn public_bits(matrix: &QMatrix, x: &[f32], n: usize, pool: &ThreadPool) -> Vec<u32> {
    let mut out = vec![f32::NAN; n * matrix.out_features()];
    matrix
        .matmul(pool, x, n, &mut out, &mut MatmulScratch::new())
        .unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

/// `matrix · x` on the tile kernel `kernel` as bits (output prefilled with NaN).
#[cfg(target_arch = "x86_64")]
pub(super) fn tile_bits(
    kernel: TileKernel,
    matrix: &QMatrix,
    x: &[f32],
    n: usize,
    pool: &ThreadPool,
) -> Vec<u32> {
    let weights = matrix.amx_weights().expect("a group layout");
    let mut out = vec![f32::NAN; n * matrix.out_features()];
    let mut scratch = MatmulScratch::new();
    matrix
        .matmul_tiles(kernel, weights, pool, x, n, &mut out, &mut scratch)
        .unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

/// For a few group-layout types: `kernel`'s rows of an `n`-row batch (`rows × cols` weights,
/// random from `seed`) are the same bits on one thread and on three, in the sub-batches
/// `parts` (start, length: rows landing in other tiles, sweeps and positions), and alone on
/// the group kernels (rows `singles`).
#[cfg(target_arch = "x86_64")]
pub(super) fn assert_tile_rows_batch_invariant(
    kernel: TileKernel,
    seed: u64,
    (rows, cols, n): (usize, usize, usize),
    parts: &[(usize, usize)],
    singles: &[usize],
) {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut rng = Rng::new(seed);
    for dtype in [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q5_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::MXFP4,
    ] {
        let bytes = random_weights(&mut rng, dtype, rows, cols);
        let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
        let x = rng.vec(n * cols, -2.0, 2.0);
        let full = tile_bits(kernel, &matrix, &x, n, &pools[0]);
        let threads = tile_bits(kernel, &matrix, &x, n, &pools[1]);
        assert_same_bits(&threads, &full, &format!("{dtype} threads"));
        for &(start, len) in parts {
            let part = tile_bits(
                kernel,
                &matrix,
                &x[start * cols..(start + len) * cols],
                len,
                &pools[1],
            );
            let want = &full[start * rows..(start + len) * rows];
            assert_same_bits(&part, want, &format!("{dtype} rows {start}+{len}"));
        }
        for &i in singles {
            let single = isa_bits(
                Isa::detect(),
                &matrix,
                &x[i * cols..(i + 1) * cols],
                1,
                &pools[0],
            );
            let want = &full[i * rows..(i + 1) * rows];
            assert_same_bits(&single, want, &format!("{dtype} row {i} alone"));
        }
    }
}

/// Asserts bitwise equality, naming the first differing element (not dumping both).
pub(super) fn assert_same_bits(got: &[u32], want: &[u32], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{context}: element {i} differs: {} vs {}",
            f32::from_bits(got[i]),
            f32::from_bits(want[i])
        );
    }
}

/// Random weights of `dtype` with every level at its extreme (each block's f16 or E8M0 scale
/// and min kept, K-quant scales at their maximum): the largest integer dots the type can give.
pub(super) fn extreme_weights(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes = random_weights(rng, dtype, rows, cols);
    let (keep, fill) = match dtype {
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => (0..4, 0xff),
        DType::Q8_0 => (0..2, 0x80),
        DType::Q6_K => (208..210, 0x00),
        // Level 12 in both nibbles (biased to 140, the largest VNNI weight byte).
        DType::MXFP4 => (0..1, 0x77),
        _ => (0..2, 0x00),
    };
    for block in bytes.chunks_exact_mut(dtype.block_bytes()) {
        for (i, byte) in block.iter_mut().enumerate() {
            if !keep.contains(&i) {
                *byte = fill;
            }
        }
        if dtype == DType::Q6_K {
            block[192..208].fill(0x80);
        }
    }
    bytes
}

#[test]
fn every_isa_is_bitwise_equal_to_scalar_for_every_quantized_type() {
    // Batch sizes 1..=17 hit every tile remainder, 70 several full tiles; 37 and 9 rows leave
    // a padded last group and (AVX-512) a lone last group of a pair; widths of one and
    // several blocks. Each path must equal the scalar twin bit for bit.
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(41);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let simd = simd_isas();
    for dtype in QUANTIZED {
        let block = dtype.block_size().max(QK);
        for (rows, cols) in [(37usize, block), (9, 3 * block), (24, 256 * 3)] {
            if cols % dtype.block_size() != 0 {
                continue;
            }
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
            for n in (1..=17).chain([70]) {
                let x = rng.vec(n * cols, -2.5, 2.5);
                let mut scalar = vec![f32::NAN; n * rows];
                matrix
                    .matmul_with_isa(
                        Isa::Scalar,
                        &pool,
                        &x,
                        n,
                        &mut scalar,
                        &mut MatmulScratch::new(),
                    )
                    .unwrap();
                for &isa in &simd {
                    let mut out = vec![f32::NAN; n * rows];
                    matrix
                        .matmul_with_isa(isa, &pool, &x, n, &mut out, &mut MatmulScratch::new())
                        .unwrap();
                    assert_eq!(
                        bits(&scalar),
                        bits(&out),
                        "{dtype} {isa:?} {rows}x{cols} n={n}: differs from scalar"
                    );
                }
            }
        }
    }
}

#[test]
fn repacked_quantized_weights_take_the_files_bytes() {
    // Whole groups of rows: every repacked layout holds exactly the GGUF bytes (the last group
    // of a row count that is not a multiple of eight is padded with zero rows).
    let mut rng = Rng::new(43);
    for dtype in QUANTIZED {
        let (rows, cols) = (16, 2 * 256);
        let bytes = random_weights(&mut rng, dtype, rows, cols);
        let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
        assert_eq!(bytes.len(), rows * dtype.row_bytes(cols).unwrap());
        assert_eq!(matrix.storage_bytes(), bytes.len(), "{dtype}");
    }
}

#[test]
fn kernel_paths_are_chosen_and_forced_from_the_features() {
    let cpu = CpuFeatures::get();
    assert_eq!(KernelPath::from(&CpuFeatures::NONE), KernelPath::Scalar);
    for path in KernelPath::ALL {
        let available = Isa::for_path(path).is_some();
        assert_eq!(available, path.missing(cpu).is_empty(), "{path}");
        let matrix = QMatrix::from_bytes(DType::Q8_0, 1, 32, &[0u8; 34]).unwrap();
        let result = matrix.matmul_on(
            path,
            &ThreadPool::new(1),
            &[0.0; 32],
            1,
            &mut [0.0],
            &mut MatmulScratch::new(),
        );
        assert_eq!(result.is_ok(), available, "{path}");
        if !available {
            eprintln!("kernel paths: {path} skipped: this host lacks it (or TOKENMILL_KERNELS excludes it)");
        }
    }
    let best = KernelPath::from(cpu);
    assert_eq!(Isa::detect(), Isa::for_path(best).unwrap());
    assert!(cpu.summary().contains(&format!("(kernels: {best}")));
}

#[test]
fn matmul_matches_reference_for_every_dtype_and_isa() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(7);
    let mut scratch = MatmulScratch::new();
    for dtype in DType::ALL {
        let block = dtype.block_size().max(32);
        // Odd row counts and batch sizes exercise the tile remainders.
        for &(rows, cols, n) in &[
            (13usize, block, 1usize),
            (37, block * 3, 6),
            (5, block * 2, 9),
        ] {
            let cols = if dtype.is_quantized() { cols } else { cols + 3 };
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
            let x = rng.vec(n * cols, -2.0, 2.0);
            let reference = reference_matmul(dtype, rows, cols, &bytes, &x, n).unwrap();
            let mut weights = vec![0.0f32; rows * cols];
            dequantize(dtype, &bytes, &mut weights).unwrap();
            let mut per_isa = Vec::new();
            for isa in isas() {
                let mut out = vec![f32::NAN; n * rows];
                matrix
                    .matmul_with_isa(isa, &pool, &x, n, &mut out, &mut scratch)
                    .unwrap();
                for i in 0..n {
                    for j in 0..rows {
                        let got = f64::from(out[i * rows + j]);
                        let want = f64::from(reference[i * rows + j]);
                        let bound = tolerance(
                            dtype,
                            &weights[j * cols..(j + 1) * cols],
                            &x[i * cols..(i + 1) * cols],
                        );
                        assert!(
                            (got - want).abs() <= bound,
                            "{dtype} {isa:?} rows={rows} cols={cols} n={n} [{i},{j}]: {got} vs {want} (bound {bound})"
                        );
                    }
                }
                per_isa.push(out);
            }
            // The quantized layouts' scalar twins follow the SIMD order exactly; the f32
            // path's accumulation order differs.
            if let [scalar, simds @ ..] = per_isa.as_slice() {
                for simd in simds {
                    if dtype.is_quantized() {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(scalar), bits(simd), "{dtype} scalar vs SIMD");
                    }
                    for (a, b) in scalar.iter().zip(simd) {
                        assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                            "{dtype}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn interleaved_twins_are_bitwise_equal_for_every_batch_size() {
    // Every batch size hits another mix of the 4/3/2/1-row tiles; 17 rows of weights leave a
    // padded last group. Each result must also be within the dequantized reference's bound.
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(19);
    for simd in simd_isas() {
        for dtype in INTERLEAVED {
            let block = dtype.block_size();
            for cols in [block, 2 * block, 5 * block] {
                let rows = 17;
                let bytes = random_weights(&mut rng, dtype, rows, cols);
                let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
                let mut weights = vec![0.0f32; rows * cols];
                dequantize(dtype, &bytes, &mut weights).unwrap();
                for n in [1usize, 3, 4, 5, 17] {
                    let x = rng.vec(n * cols, -3.0, 3.0);
                    let reference = reference_matmul(dtype, rows, cols, &bytes, &x, n).unwrap();
                    let mut outputs = Vec::new();
                    for isa in [Isa::Scalar, simd] {
                        let mut out = vec![f32::NAN; n * rows];
                        matrix
                            .matmul_with_isa(isa, &pool, &x, n, &mut out, &mut MatmulScratch::new())
                            .unwrap();
                        outputs.push(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                        for (index, (&got, &want)) in out.iter().zip(&reference).enumerate() {
                            let (i, j) = (index / rows, index % rows);
                            let bound = tolerance(
                                dtype,
                                &weights[j * cols..(j + 1) * cols],
                                &x[i * cols..(i + 1) * cols],
                            );
                            assert!(
                                (f64::from(got) - f64::from(want)).abs() <= bound,
                                "{dtype} {isa:?} cols={cols} n={n} [{i},{j}]: {got} vs {want}"
                            );
                        }
                    }
                    assert_eq!(
                        outputs[0], outputs[1],
                        "{dtype} {simd:?} cols={cols} n={n}: scalar vs SIMD"
                    );
                }
            }
        }
    }
}

#[test]
fn row_results_do_not_depend_on_batch_or_threads() {
    let mut rng = Rng::new(11);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for dtype in DType::ALL {
        let cols = dtype.block_size().max(32) * 2;
        let rows = 45;
        let bytes = random_weights(&mut rng, dtype, rows, cols);
        let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
        let n = 13;
        let x = rng.vec(n * cols, -1.0, 1.0);
        for isa in isas() {
            let mut scratch = MatmulScratch::new();
            let mut batched = vec![0.0f32; n * rows];
            matrix
                .matmul_with_isa(isa, &pools[1], &x, n, &mut batched, &mut scratch)
                .unwrap();
            for pool in &pools {
                let mut again = vec![0.0f32; n * rows];
                matrix
                    .matmul_with_isa(isa, pool, &x, n, &mut again, &mut scratch)
                    .unwrap();
                assert_eq!(
                    batched.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    again.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{dtype} {isa:?} threads={}",
                    pool.num_threads()
                );
                for i in [0usize, 5, 12] {
                    let mut single = vec![0.0f32; rows];
                    matrix
                        .matmul_with_isa(
                            isa,
                            pool,
                            &x[i * cols..(i + 1) * cols],
                            1,
                            &mut single,
                            &mut scratch,
                        )
                        .unwrap();
                    for j in 0..rows {
                        assert_eq!(
                            single[j].to_bits(),
                            batched[i * rows + j].to_bits(),
                            "{dtype} {isa:?} row {i} col {j}: n=1 differs from n=13"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn row_to_f32_equals_dequantize() {
    let mut rng = Rng::new(3);
    for dtype in DType::ALL {
        let cols = dtype.block_size().max(32) * 2;
        let rows = 4;
        let bytes = random_weights(&mut rng, dtype, rows, cols);
        let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
        let mut all = vec![0.0f32; rows * cols];
        dequantize(dtype, &bytes, &mut all).unwrap();
        let mut row = vec![0.0f32; cols];
        for r in 0..rows {
            matrix.row_to_f32(r, &mut row).unwrap();
            assert_eq!(row, all[r * cols..(r + 1) * cols], "{dtype} row {r}");
        }
        assert!(matrix.row_to_f32(rows, &mut row).is_err());
    }
}

#[test]
fn known_q8_0_product() {
    // One Q8_0 row with d = 1 and q = 1..=32, times x = all 127s: the activation scale is
    // exactly 1 (also in f16) and Σ 127·q = 67056 is exact.
    let mut bytes = vec![0u8; 34];
    bytes[0..2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
    for j in 0..32 {
        bytes[2 + j] = (j as u8) + 1;
    }
    let matrix = QMatrix::from_bytes(DType::Q8_0, 1, 32, &bytes).unwrap();
    let pool = ThreadPool::new(2);
    let mut out = [0.0f32];
    matrix
        .matmul(&pool, &[127.0; 32], 1, &mut out, &mut MatmulScratch::new())
        .unwrap();
    assert_eq!(out[0], 67056.0);
}

#[test]
fn shape_errors() {
    let matrix = QMatrix::from_f32(2, 3, &[0.0; 6]).unwrap();
    let pool = ThreadPool::new(1);
    let mut scratch = MatmulScratch::new();
    let mut out = [0.0f32; 2];
    assert!(matrix
        .matmul(&pool, &[0.0; 4], 1, &mut out, &mut scratch)
        .is_err());
    assert!(matrix
        .matmul(&pool, &[0.0; 3], 1, &mut out[..1], &mut scratch)
        .is_err());
    assert!(QMatrix::from_bytes(DType::Q4_1, 2, 32, &[0u8; 39]).is_err());
    assert!(QMatrix::from_bytes(DType::Q4_K, 1, 32, &[0u8; 144]).is_err());
    assert!(QMatrix::from_bytes(DType::IQ4_XS, 1, 32, &[0u8; 136]).is_err());
    assert!(QMatrix::from_bytes(DType::MXFP4, 1, 32, &[0u8; 18]).is_err());
}

#[test]
fn public_types_are_thread_safe() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<QMatrix>();
    assert_send_sync::<MatmulScratch>();
    assert_send_sync::<ThreadPool>();
    assert_send_sync::<crate::RopeCache>();
}

#[test]
fn extreme_4bit_products_do_not_saturate() {
    // Nibbles of 15 against activations of ±127 are the largest i16 partial sums the
    // interleaved kernel accumulates (8 × 2 · 15 · 127 = 30 480 per lane).
    let pool = ThreadPool::new(2);
    let (rows, cols) = (9usize, 64usize);
    let one = f32_to_f16(1.0).to_le_bytes();
    let zero = f32_to_f16(0.0).to_le_bytes();
    for (dtype, expected_weight) in [(DType::Q4_1, 15.0f32), (DType::Q4_0, 7.0)] {
        let mut bytes = Vec::new();
        for _ in 0..rows * cols / QK {
            bytes.extend_from_slice(&one);
            if dtype == DType::Q4_1 {
                bytes.extend_from_slice(&zero);
            }
            bytes.extend_from_slice(&[0xff; QK / 2]);
        }
        let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
        for sign in [1.0f32, -1.0] {
            let x = vec![127.0 * sign; 5 * cols];
            for isa in isas() {
                let mut out = vec![0.0f32; 5 * rows];
                let mut scratch = MatmulScratch::new();
                matrix
                    .matmul_with_isa(isa, &pool, &x, 5, &mut out, &mut scratch)
                    .unwrap();
                let want = expected_weight * 127.0 * sign * cols as f32;
                assert!(out.iter().all(|&v| v == want), "{dtype} {isa:?}: {out:?}");
            }
        }
    }
}

#[test]
fn extreme_5bit_and_iq4_products_do_not_saturate() {
    // Q5: quants of 31 against ±127 are the largest i16 partial sums the kernel keeps before
    // widening (4 × 2 · 31 · 127 = 31 496); Q5_0's 0 is its largest magnitude (-16). IQ4: the
    // level -127 (nibble 0) against ±127 is the sign transfer's largest pair (2 · 127 · 127).
    let pool = ThreadPool::new(2);
    let (rows, cols) = (9usize, 256usize);
    let one = f32_to_f16(1.0).to_le_bytes();
    let cases: [(DType, &[u8], u8, f32); 5] = [
        (DType::Q5_1, &[0, 0, 0xff, 0xff, 0xff, 0xff], 0xff, 31.0),
        (DType::Q5_0, &[0xff, 0xff, 0xff, 0xff], 0xff, 15.0),
        (DType::Q5_0, &[0, 0, 0, 0], 0x00, -16.0),
        (DType::IQ4_NL, &[], 0x00, -127.0),
        // d = 1, every ls = 33 (scales_h 0b10 per sub-block, scales_l nibbles 1): dl = 1.
        (
            DType::IQ4_XS,
            &[0xaa, 0xaa, 0x11, 0x11, 0x11, 0x11],
            0x00,
            -127.0,
        ),
    ];
    for (dtype, header, quants, expected_weight) in cases {
        let mut block = one.to_vec();
        block.extend_from_slice(header);
        block.resize(dtype.block_bytes(), quants);
        let bytes = block.repeat(rows * cols / dtype.block_size());
        let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
        let mut weights = vec![0.0f32; cols];
        matrix.row_to_f32(rows - 1, &mut weights).unwrap();
        assert!(
            weights.iter().all(|&w| w == expected_weight),
            "{dtype}: {weights:?}"
        );
        for sign in [1.0f32, -1.0] {
            let x = vec![127.0 * sign; 5 * cols];
            for isa in isas() {
                let mut out = vec![0.0f32; 5 * rows];
                let mut scratch = MatmulScratch::new();
                matrix
                    .matmul_with_isa(isa, &pool, &x, 5, &mut out, &mut scratch)
                    .unwrap();
                let want = expected_weight * 127.0 * sign * cols as f32;
                assert!(out.iter().all(|&v| v == want), "{dtype} {isa:?}: {out:?}");
            }
        }
    }
}

#[test]
fn extreme_mxfp4_products_do_not_saturate() {
    // Levels ±12 (nibbles 7 and 15) at scale 1 (e = 128) against ±127: the largest pair sums
    // the AVX2 kernel keeps in i16 over a whole block (8 × 2 · 12 · 127 = 24 384).
    let pool = ThreadPool::new(2);
    let (rows, cols) = (9usize, 256usize);
    for (quants, expected_weight) in [(0x77u8, 12.0f32), (0xff, -12.0)] {
        let mut block = vec![128u8];
        block.resize(DType::MXFP4.block_bytes(), quants);
        let bytes = block.repeat(rows * cols / QK);
        let matrix = QMatrix::from_bytes(DType::MXFP4, rows, cols, &bytes).unwrap();
        let mut weights = vec![0.0f32; cols];
        matrix.row_to_f32(rows - 1, &mut weights).unwrap();
        assert!(weights.iter().all(|&w| w == expected_weight), "{weights:?}");
        for sign in [1.0f32, -1.0] {
            let x = vec![127.0 * sign; 5 * cols];
            for isa in isas() {
                let mut out = vec![0.0f32; 5 * rows];
                matrix
                    .matmul_with_isa(isa, &pool, &x, 5, &mut out, &mut MatmulScratch::new())
                    .unwrap();
                let want = expected_weight * 127.0 * sign * cols as f32;
                assert!(out.iter().all(|&v| v == want), "{isa:?}: {out:?}");
            }
        }
    }
}

#[test]
fn mxfp4_scales_at_the_ends_of_the_range_agree_on_every_path() {
    // Rows whose blocks take the smallest scale bytes (0 and 1: subnormal scales; 2: the
    // smallest normal; 3), so `d_w · d_x` is an f32 subnormal, rounded in every path alike;
    // and rows of the largest ones (127 and 128 beside 253, 254 and 255, where 12 · 2^127
    // overflows as a dequantized weight but not in the kernel's `d_w · d_x · dot` for
    // activations near 2^-20). Every path (and, through `matmul`, the AVX-512 row sweeps and
    // AMX where the host has them) must give the scalar twin's bits; the small scales also
    // stay within the reference's bound.
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(29);
    for (scales, x_max) in [
        (&[0u8, 1, 2, 3][..], 2.0f32),
        (&[127, 128, 253, 254, 255], 1e-6),
    ] {
        let (rows, cols) = (19usize, 2 * scales.len() * QK);
        let mut bytes = Vec::with_capacity(rows * DType::MXFP4.row_bytes(cols).unwrap());
        for _ in 0..rows {
            for &e in scales.iter().chain(scales) {
                bytes.push(e);
                bytes.extend((0..QK / 2).map(|_| rng.next_u64() as u8));
            }
        }
        let matrix = QMatrix::from_bytes(DType::MXFP4, rows, cols, &bytes).unwrap();
        let mut weights = vec![0.0f32; rows * cols];
        dequantize(DType::MXFP4, &bytes, &mut weights).unwrap();
        for n in [1usize, 6, 17] {
            let x = rng.vec(n * cols, -x_max, x_max);
            let context = format!("scales {scales:?} n={n}");
            let scalar = isa_bits(Isa::Scalar, &matrix, &x, n, &pool);
            assert!(
                scalar.iter().all(|&b| f32::from_bits(b).is_finite()),
                "{context}: finite"
            );
            for isa in simd_isas() {
                let got = isa_bits(isa, &matrix, &x, n, &pool);
                assert_same_bits(&got, &scalar, &format!("{context} {isa:?}"));
            }
            let public = public_bits(&matrix, &x, n, &pool);
            assert_same_bits(&public, &scalar, &format!("{context} matmul"));
            if scales[0] == 0 {
                let reference = reference_matmul(DType::MXFP4, rows, cols, &bytes, &x, n).unwrap();
                for (index, (&got, &want)) in scalar.iter().zip(&reference).enumerate() {
                    let (i, j) = (index / rows, index % rows);
                    let got = f32::from_bits(got);
                    let bound = tolerance(
                        DType::MXFP4,
                        &weights[j * cols..(j + 1) * cols],
                        &x[i * cols..(i + 1) * cols],
                    );
                    assert!(
                        (f64::from(got) - f64::from(want)).abs() <= bound,
                        "{context} [{i},{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn extreme_q8_0_products_do_not_saturate() {
    // -128 (never written by GGML's quantizer, but legal in a file) against ±127: the sign
    // transfer turns it into 128 · ∓127, the largest pair sum `maddubs` produces here.
    let pool = ThreadPool::new(2);
    let (rows, cols) = (11usize, 96usize);
    let mut bytes = Vec::new();
    for block in 0..rows * cols / QK {
        bytes.extend_from_slice(&f32_to_f16(1.0).to_le_bytes());
        let quant: i8 = if block % 2 == 0 { -128 } else { 127 };
        bytes.extend_from_slice(&[quant as u8; QK]);
    }
    let matrix = QMatrix::from_bytes(DType::Q8_0, rows, cols, &bytes).unwrap();
    let mut reference_row = vec![0.0f32; cols];
    for sign in [1.0f32, -1.0] {
        let x = vec![127.0 * sign; 3 * cols];
        for isa in isas() {
            let mut out = vec![0.0f32; 3 * rows];
            matrix
                .matmul_with_isa(isa, &pool, &x, 3, &mut out, &mut MatmulScratch::new())
                .unwrap();
            for j in 0..rows {
                matrix.row_to_f32(j, &mut reference_row).unwrap();
                let want: f32 = reference_row.iter().map(|w| w * 127.0 * sign).sum();
                for i in 0..3 {
                    assert_eq!(out[i * rows + j], want, "{isa:?} [{i},{j}]");
                }
            }
        }
    }
}

#[test]
fn k_quant_twins_agree_bitwise_for_every_batch_size() {
    // Row counts that leave a partial group; batch sizes that hit every tile remainder.
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(19);
    let mut scratch = MatmulScratch::new();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for dtype in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
        for (rows, cols) in [(19usize, 256usize), (8, 512), (13, 1280), (21, 2048)] {
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
            let mut weights = vec![0.0f32; rows * cols];
            dequantize(dtype, &bytes, &mut weights).unwrap();
            for n in [1usize, 3, 4, 5, 17] {
                let x = rng.vec(n * cols, -2.0, 2.0);
                let reference = reference_matmul(dtype, rows, cols, &bytes, &x, n).unwrap();
                let mut per_isa = Vec::new();
                for isa in isas() {
                    let mut out = vec![f32::NAN; n * rows];
                    matrix
                        .matmul_with_isa(isa, &pool, &x, n, &mut out, &mut scratch)
                        .unwrap();
                    for i in 0..n {
                        let row = &x[i * cols..(i + 1) * cols];
                        let mut alone = vec![f32::NAN; rows];
                        matrix
                            .matmul_with_isa(isa, &pool, row, 1, &mut alone, &mut scratch)
                            .unwrap();
                        assert_eq!(
                            bits(&alone),
                            bits(&out[i * rows..(i + 1) * rows]),
                            "{dtype} {isa:?} {rows}x{cols}: row {i} alone differs from n={n}"
                        );
                        for j in 0..rows {
                            let got = f64::from(out[i * rows + j]);
                            let want = f64::from(reference[i * rows + j]);
                            let bound = tolerance(dtype, &weights[j * cols..(j + 1) * cols], row);
                            assert!(
                                (got - want).abs() <= bound,
                                "{dtype} {isa:?} {rows}x{cols} n={n} [{i},{j}]: {got} vs {want}"
                            );
                        }
                    }
                    per_isa.push(out);
                }
                if let [scalar, simds @ ..] = per_isa.as_slice() {
                    for simd in simds {
                        assert_eq!(bits(scalar), bits(simd), "{dtype} {rows}x{cols} n={n}");
                    }
                }
            }
        }
    }
}

#[test]
fn extreme_k_quant_products_do_not_saturate() {
    // The largest integer partial sums each K-quant kernel forms: all-ones nibbles (and fifth
    // bits) under scale 63 for Q4_K/Q5_K, q = 0 (w = -32) under scale -128 for Q6_K, against
    // activations of ±127 (d_x = 1 exactly). Every product and sum is an exact f32 integer.
    let pool = ThreadPool::new(2);
    let (rows, cols) = (9usize, 512usize);
    let one = f32_to_f16(1.0).to_le_bytes();
    for dtype in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
        let mut block = vec![0u8; dtype.block_bytes()];
        match dtype {
            DType::Q6_K => {
                block[192..208].fill(0x80);
                block[208..210].copy_from_slice(&one);
            }
            _ => {
                block[0..2].copy_from_slice(&one);
                // Scale 63, min 0 for all eight sub-blocks in GGML's 6-bit packing.
                block[4..8].fill(0xff);
                block[12..16].fill(0x0f);
                // Q4_K's nibbles, or Q5_K's fifth bits and nibbles.
                block[16..].fill(0xff);
            }
        }
        let bytes = block.repeat(rows * cols / 256);
        let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
        let mut weight_row = vec![0.0f32; cols];
        for sign in [1.0f32, -1.0] {
            let x = vec![127.0 * sign; 5 * cols];
            for isa in isas() {
                let mut out = vec![0.0f32; 5 * rows];
                matrix
                    .matmul_with_isa(isa, &pool, &x, 5, &mut out, &mut MatmulScratch::new())
                    .unwrap();
                for j in 0..rows {
                    matrix.row_to_f32(j, &mut weight_row).unwrap();
                    let want: f64 = weight_row
                        .iter()
                        .map(|&w| f64::from(w) * 127.0 * f64::from(sign))
                        .sum();
                    for i in 0..5 {
                        let got = f64::from(out[i * rows + j]);
                        assert_eq!(got, want, "{dtype} {isa:?} [{i},{j}]");
                    }
                }
            }
        }
    }
}

/// Random 16-bit patterns of `dtype` (F16 or BF16) with every finite class (normals,
/// subnormals, zeros of both signs) but no inf/NaN.
fn random_half_bytes(rng: &mut Rng, dtype: DType, count: usize) -> Vec<u8> {
    let exponent_mask: u16 = if dtype == DType::BF16 { 0x7f80 } else { 0x7c00 };
    (0..count)
        .flat_map(|_| {
            let mut bits = rng.next_u64() as u16;
            if bits & exponent_mask == exponent_mask {
                bits &= !0x4000; // clear the top exponent bit: finite
            }
            bits.to_le_bytes()
        })
        .collect()
}

#[test]
fn float_twins_are_bitwise_equal_and_16_bit_weights_equal_their_widened_f32() {
    // F16/BF16 stay 16-bit and widen inside the kernel; the result must be the f32 path's on
    // the widened values, and the scalar twin must follow the SIMD order lane for lane.
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(23);
    for simd in simd_isas() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for cols in [7usize, 16, 67, 256] {
                let rows = 13;
                let bytes = match dtype {
                    DType::F32 => rng
                        .vec(rows * cols, -2.0, 2.0)
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect(),
                    _ => random_half_bytes(&mut rng, dtype, rows * cols),
                };
                let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
                let mut widened = vec![0.0f32; rows * cols];
                dequantize(dtype, &bytes, &mut widened).unwrap();
                let as_f32 = QMatrix::from_f32(rows, cols, &widened).unwrap();
                assert_eq!(
                    matrix.storage_bytes(),
                    rows * cols * dtype.row_bytes(1).unwrap()
                );
                let mut row = vec![0.0f32; cols];
                matrix.row_to_f32(rows - 1, &mut row).unwrap();
                assert_eq!(row, widened[(rows - 1) * cols..]);
                for n in [1usize, 3, 4, 5, 17] {
                    // Small activations keep products of large f16 weights finite.
                    let x = rng.vec(n * cols, -1e-3, 1e-3);
                    let mut outputs = Vec::new();
                    for (isa, m) in [(Isa::Scalar, &matrix), (simd, &matrix), (simd, &as_f32)] {
                        let mut out = vec![f32::NAN; n * rows];
                        m.matmul_with_isa(isa, &pool, &x, n, &mut out, &mut MatmulScratch::new())
                            .unwrap();
                        assert!(out.iter().all(|v| v.is_finite()), "{dtype} cols={cols}");
                        outputs.push(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                    }
                    assert_eq!(
                        outputs[0], outputs[1],
                        "{dtype} {simd:?} cols={cols} n={n}: scalar vs SIMD"
                    );
                    assert_eq!(
                        outputs[1], outputs[2],
                        "{dtype} {simd:?} cols={cols} n={n}: 16-bit vs widened"
                    );
                }
            }
        }
    }
}

#[test]
fn untransposed_adds_are_twins_and_match_a_reference_row_by_row() {
    // `out += x · W` (W as stored): SIMD equals the scalar twin bit for bit, a row's result
    // does not depend on the rows beside it, and 16-bit weights equal their widened f32.
    let mut rng = Rng::new(31);
    let simd = Isa::detect();
    if simd == Isa::Scalar {
        eprintln!("untransposed twins: SIMD path skipped, this CPU runs the scalar kernel only");
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (k, columns) in [(1usize, 5usize), (16, 8), (16, 67), (3, 1536)] {
            let bytes: Vec<u8> = match dtype {
                DType::F32 => rng
                    .vec(k * columns, -2.0, 2.0)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                _ => random_half_bytes(&mut rng, dtype, k * columns),
            };
            let matrix = QMatrix::from_bytes(dtype, k, columns, &bytes).unwrap();
            let mut widened = vec![0.0f32; k * columns];
            dequantize(dtype, &bytes, &mut widened).unwrap();
            let as_f32 = QMatrix::from_f32(k, columns, &widened).unwrap();
            let n = 3;
            let x = rng.vec(n * k, -1e-3, 1e-3);
            let start = rng.vec(n * columns, -1.0, 1.0);
            let mut outputs = Vec::new();
            for (isa, m) in [(Isa::Scalar, &matrix), (simd, &matrix), (simd, &as_f32)] {
                let mut out = start.clone();
                m.add_untransposed_with_isa(isa, &x, n, &mut out).unwrap();
                outputs.push(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            }
            let what = format!("{dtype} k={k} columns={columns}");
            assert_eq!(outputs[0], outputs[1], "{what}: scalar vs SIMD");
            assert_eq!(outputs[1], outputs[2], "{what}: 16-bit vs widened");
            for i in 0..n {
                let mut alone = start[i * columns..(i + 1) * columns].to_vec();
                matrix
                    .add_untransposed_with_isa(simd, &x[i * k..(i + 1) * k], 1, &mut alone)
                    .unwrap();
                let bits: Vec<u32> = alone.iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    bits,
                    outputs[1][i * columns..(i + 1) * columns],
                    "{what}: row {i}"
                );
                for (c, &value) in alone.iter().enumerate() {
                    let terms: Vec<f64> = (0..k)
                        .map(|j| f64::from(x[i * k + j]) * f64::from(widened[j * columns + c]))
                        .collect();
                    let base = f64::from(start[i * columns + c]);
                    let exact = base + terms.iter().sum::<f64>();
                    // k + 1 f32 roundings, each within 2^-24 of the running magnitude.
                    let magnitude = base.abs() + terms.iter().map(|t| t.abs()).sum::<f64>();
                    let bound = (k as f64 + 1.0) * magnitude * 2f64.powi(-23);
                    assert!(
                        (f64::from(value) - exact).abs() <= bound,
                        "{what}: ({i}, {c})"
                    );
                }
            }
        }
    }
    let quantized = QMatrix::from_bytes(DType::Q8_0, 1, 32, &[0u8; 34]).unwrap();
    assert!(matches!(
        quantized.add_untransposed(&[1.0], 1, &mut [0.0; 32]),
        Err(KernelError::UnsupportedDType { .. })
    ));
    let matrix = QMatrix::from_f32(2, 3, &[0.0; 6]).unwrap();
    assert!(matches!(
        matrix.add_untransposed(&[1.0], 1, &mut [0.0; 3]),
        Err(KernelError::LengthMismatch { .. })
    ));
}

#[test]
fn segments_equal_one_matmul_per_segment_bitwise() {
    // Segment sizes around the AMX thresholds (16 rows, 32 for Q4_K) and the row tile (4),
    // and empty segments; several matrices per type, pools of one to three threads.
    let mut rng = Rng::new(23);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let layouts: [&[usize]; 4] = [
        &[0, 1, 4, 8, 8, 17, 19, 24, 24, 41],
        &[0, 2, 35, 50, 66],
        &[0, 0, 1, 2, 5, 5, 7],
        &[0, 3],
    ];
    for dtype in DType::ALL {
        let cols = 256;
        let rows = 40;
        let matrices: Vec<QMatrix> = (0..3)
            .map(|_| {
                let bytes = random_weights(&mut rng, dtype, rows, cols);
                QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap()
            })
            .collect();
        let weight = |s: usize| &matrices[s % matrices.len()];
        for starts in layouts {
            let n = starts[starts.len() - 1];
            let x = rng.vec(n * cols, -1.0, 1.0);
            let mut scratch = MatmulScratch::new();
            let mut want = vec![0.0f32; n * rows];
            for (s, pair) in starts.windows(2).enumerate() {
                let r = pair[0]..pair[1];
                weight(s)
                    .matmul(
                        &pools[1],
                        &x[r.start * cols..r.end * cols],
                        r.len(),
                        &mut want[r.start * rows..r.end * rows],
                        &mut scratch,
                    )
                    .unwrap();
            }
            for pool in &pools {
                let mut got = vec![-7.0f32; n * rows];
                let segments = Segments {
                    starts,
                    weight: &weight,
                };
                QMatrix::matmul_segments(pool, segments, &x, &mut got, &mut scratch).unwrap();
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{dtype} starts {starts:?} threads={}",
                    pool.num_threads()
                );
            }
        }
    }
}

#[test]
fn segment_errors() {
    let pool = ThreadPool::new(1);
    let a = QMatrix::from_f32(2, 32, &[0.5; 64]).unwrap();
    let b = QMatrix::from_f32(3, 32, &[0.5; 96]).unwrap();
    let x = vec![1.0f32; 4 * 32];
    let mut scratch = MatmulScratch::new();
    let mixed = |s: usize| if s == 0 { &a } else { &b };
    let same = |_: usize| &a;
    fn run<'w, F: Fn(usize) -> &'w QMatrix + Sync>(
        pool: &ThreadPool,
        starts: &[usize],
        weight: &F,
        x: &[f32],
        len: usize,
        scratch: &mut MatmulScratch,
    ) -> Result<Vec<f32>, KernelError> {
        let mut out = vec![0.0f32; len];
        let n = starts.last().copied().unwrap_or(0);
        let segments = Segments { starts, weight };
        QMatrix::matmul_segments(pool, segments, &x[..n * 32], &mut out, scratch).map(|()| out)
    }
    assert!(
        run(&pool, &[0, 2, 4], &mixed, &x, 8, &mut scratch).is_err(),
        "mixed shapes"
    );
    assert!(
        run(&pool, &[0, 3, 2, 4], &same, &x, 8, &mut scratch).is_err(),
        "decreasing starts"
    );
    assert!(
        run(&pool, &[0, 2, 4], &same, &x, 6, &mut scratch).is_err(),
        "output too short"
    );
    assert!(run(&pool, &[0], &same, &x, 0, &mut scratch)
        .unwrap()
        .is_empty());
    assert_eq!(
        run(&pool, &[0, 1, 1, 2], &same, &x, 4, &mut scratch).unwrap(),
        [16.0; 4]
    );
}
