//! Criterion benches for the compute layer:
//! - `matmul_576x1536`: every dtype on every kernel path the host has (`TYPE/path`, e.g.
//!   `Q4_K/avx512`, next to `Q4_K/scalar`) at batch n = 1, 4, 16, 64, 256 (compute; throughput
//!   in FLOP, shown by criterion as "elem/s" = FLOP/s);
//! - `matmul_stream`: batch-1 products with weights far larger than the last-level cache (the
//!   default model's 49152x576 Q8_0 output head, and an 84 MB Q4_1 matrix), throughput in weight
//!   bytes: memory bandwidth, what bounds single-stream decode;
//! - `paged_attention_decode` at context 128, 512, 1024, 2048 and `paged_attention_prefill`
//!   (64 query rows at context 512) and `paged_attention_decode_batch32` (32 sequences decoding
//!   at context 256, like the server), in FLOP, over an f32 KV cache; `paged_attention_kv_*`
//!   repeat the 512-context decode and the batch-32 decode over f16, bf16 and fp8 caches
//!   (the per-tile decode cost).
//!
//! The machine's peaks to compare against: `tokenmill bench speed` probes the f32 FMA peak and the
//! memory-read bandwidth and prints them. Run: `cargo bench -p tokenmill-kernels` (long);
//! `--no-run` just builds; a filter such as `-- matmul_stream` runs one group.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokenmill_kernels::{
    encode_float_row, f32_to_f16, paged_attention, quantize_row_mxfp4, quantize_row_q4_0,
    quantize_row_q4_1, quantize_row_q5_0, quantize_row_q5_1, quantize_row_q8_0, AttentionParams,
    AttentionSeq, CpuFeatures, DType, KernelPath, KvCacheBuffer, KvCacheDType, MatmulScratch,
    QMatrix, ThreadPool,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn weight_bytes(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = dtype.row_bytes(cols).unwrap_or(0);
    let mut bytes = vec![0u8; rows * row_bytes];
    for row in bytes.chunks_exact_mut(row_bytes) {
        let values = rng.values(cols);
        let encoded = match dtype {
            DType::Q8_0 => quantize_row_q8_0(&values, row),
            DType::Q4_0 => quantize_row_q4_0(&values, row),
            DType::Q4_1 => quantize_row_q4_1(&values, row),
            DType::Q5_0 => quantize_row_q5_0(&values, row),
            DType::Q5_1 => quantize_row_q5_1(&values, row),
            DType::MXFP4 => quantize_row_mxfp4(&values, row),
            DType::F32 | DType::F16 | DType::BF16 => encode_float_row(dtype, &values, row),
            // K-quants and IQ4: random bytes with a small f16 scale (and K-quant min).
            _ => {
                for (b, v) in row.iter_mut().zip(&values) {
                    *b = (v * 127.0) as i8 as u8;
                }
                let scale_offset = if dtype == DType::Q6_K { 208 } else { 0 };
                for block in row.chunks_exact_mut(dtype.block_bytes()) {
                    let d = f32_to_f16(0.01).to_le_bytes();
                    block[scale_offset..scale_offset + 2].copy_from_slice(&d);
                    if matches!(dtype, DType::Q4_K | DType::Q5_K) {
                        block[2..4].copy_from_slice(&d);
                    }
                }
                Ok(())
            }
        };
        if encoded.is_err() {
            return Vec::new();
        }
    }
    bytes
}

fn bench_matmul(c: &mut Criterion) {
    let pool = ThreadPool::default();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (rows, cols) = (576usize, 1536usize);
    let mut group = c.benchmark_group("matmul_576x1536");
    group.sample_size(20);
    for dtype in [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q5_1,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
        DType::Q4_K,
        DType::Q6_K,
        DType::Q5_K,
        DType::F32,
        DType::F16,
    ] {
        let bytes = weight_bytes(&mut rng, dtype, rows, cols);
        let Ok(matrix) = QMatrix::from_bytes(dtype, rows, cols, &bytes) else {
            continue;
        };
        let mut scratch = MatmulScratch::new();
        for n in [1usize, 4, 16, 64, 256] {
            let x = rng.values(n * cols);
            let mut out = vec![0.0f32; n * rows];
            group.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
            // Every kernel path this host has (and TOKENMILL_KERNELS leaves), next to scalar.
            for path in KernelPath::ALL {
                if !path.missing(CpuFeatures::get()).is_empty() {
                    continue;
                }
                let id = BenchmarkId::new(format!("{}/{}", dtype.name(), path.env_value()), n);
                group.bench_with_input(id, &n, |b, &n| {
                    b.iter(|| matrix.matmul_on(path, &pool, &x, n, &mut out, &mut scratch))
                });
            }
        }
    }
    group.finish();
}

fn bench_matmul_stream(c: &mut Criterion) {
    let pool = ThreadPool::default();
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let mut group = c.benchmark_group("matmul_stream");
    group.sample_size(10);
    for (dtype, rows, cols) in [
        (DType::Q8_0, 49152usize, 576usize),
        (DType::Q4_1, 32768, 4096),
    ] {
        let bytes = weight_bytes(&mut rng, dtype, rows, cols);
        let Ok(matrix) = QMatrix::from_bytes(dtype, rows, cols, &bytes) else {
            continue;
        };
        let x = rng.values(cols);
        let mut out = vec![0.0f32; rows];
        let mut scratch = MatmulScratch::new();
        group.throughput(Throughput::Bytes(matrix.storage_bytes() as u64));
        let id = format!("{}_{rows}x{cols}", dtype.name());
        group.bench_function(BenchmarkId::new(id, 1), |b| {
            b.iter(|| matrix.matmul(&pool, &x, 1, &mut out, &mut scratch))
        });
    }
    group.finish();
}

fn bench_attention(c: &mut Criterion) {
    let pool = ThreadPool::default();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let params = AttentionParams {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        scale: 0.125,
        sliding_window: None,
    };
    for (name, batch, query_len, contexts) in [
        (
            "paged_attention_decode",
            1usize,
            1usize,
            &[128usize, 512, 1024, 2048][..],
        ),
        ("paged_attention_prefill", 1, 64, &[512][..]),
        ("paged_attention_decode_batch32", 32, 1, &[256][..]),
    ] {
        attention_group(
            c,
            &pool,
            &mut rng,
            &params,
            name,
            (batch, query_len, KvCacheDType::F32),
            contexts,
        );
    }
    for dtype in [
        KvCacheDType::F16,
        KvCacheDType::BF16,
        KvCacheDType::Fp8E4m3,
        KvCacheDType::Fp8E5m2,
    ] {
        for (name, batch, contexts) in [
            ("paged_attention_kv_decode", 1usize, &[512usize][..]),
            ("paged_attention_kv_decode_batch32", 32, &[256][..]),
        ] {
            let name = format!("{name}_{dtype}");
            attention_group(
                c,
                &pool,
                &mut rng,
                &params,
                &name,
                (batch, 1, dtype),
                contexts,
            );
        }
    }
}

/// `shape` is (sequences, query rows each, KV cache type).
fn attention_group(
    c: &mut Criterion,
    pool: &ThreadPool,
    rng: &mut Rng,
    params: &AttentionParams,
    name: &str,
    shape: (usize, usize, KvCacheDType),
    contexts: &[usize],
) {
    let (batch, query_len, dtype) = shape;
    let mut group = c.benchmark_group(name);
    group.sample_size(20);
    for &context in contexts {
        let num_blocks = context / params.block_size;
        let cache_len =
            batch * num_blocks * params.block_size * params.num_kv_heads * params.head_dim;
        let k_cache = KvCacheBuffer::from_f32(dtype, &rng.values(cache_len));
        let v_cache = KvCacheBuffer::from_f32(dtype, &rng.values(cache_len));
        // Blocks in reverse order, so the tables are not the identity.
        let block_tables: Vec<u32> = (0..(batch * num_blocks) as u32).rev().collect();
        let seqs: Vec<AttentionSeq> = (0..batch)
            .map(|i| AttentionSeq {
                query_start: i * query_len,
                query_len,
                context_len: context,
                block_table_start: i * num_blocks,
                num_blocks,
            })
            .collect();
        let q = rng.values(batch * query_len * params.num_heads * params.head_dim);
        let mut out = vec![0.0f32; q.len()];
        // Two multiply-adds (score and value) per visible key, head and dimension.
        let visible: usize = batch
            * (0..query_len)
                .map(|r| context - query_len + r + 1)
                .sum::<usize>();
        group.throughput(Throughput::Elements(
            (4 * visible * params.num_heads * params.head_dim) as u64,
        ));
        group.bench_with_input(BenchmarkId::from_parameter(context), &context, |b, _| {
            b.iter(|| {
                paged_attention(
                    pool,
                    params,
                    &q,
                    k_cache.as_slice(),
                    v_cache.as_slice(),
                    &seqs,
                    &block_tables,
                    &mut out,
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_matmul, bench_matmul_stream, bench_attention);
criterion_main!(benches);
