//! Criterion benches: matmul per dtype at n = 1, 8, 64 for a 576x1536 weight, and paged
//! attention at context 128 and 1024. Throughput is reported in FLOP (as "elements").
//! Run: `cargo bench -p tokenmill-kernels` (long); `--no-run` just builds.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokenmill_kernels::{
    encode_float_row, f32_to_f16, paged_attention, quantize_row_q4_0, quantize_row_q4_1,
    quantize_row_q8_0, AttentionParams, AttentionSeq, DType, MatmulScratch, QMatrix, ThreadPool,
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
            DType::F32 | DType::F16 | DType::BF16 => encode_float_row(dtype, &values, row),
            _ => {
                for (b, v) in row.iter_mut().zip(&values) {
                    *b = (v * 127.0) as i8 as u8;
                }
                let scale_offset = if dtype == DType::Q6_K { 208 } else { 0 };
                for block in row.chunks_exact_mut(dtype.block_bytes()) {
                    let d = f32_to_f16(0.01).to_le_bytes();
                    block[scale_offset..scale_offset + 2].copy_from_slice(&d);
                    if dtype != DType::Q6_K {
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
        for n in [1usize, 8, 64] {
            let x = rng.values(n * cols);
            let mut out = vec![0.0f32; n * rows];
            group.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
            group.bench_with_input(BenchmarkId::new(dtype.name(), n), &n, |b, &n| {
                b.iter(|| matrix.matmul(&pool, &x, n, &mut out, &mut scratch))
            });
        }
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
    };
    let mut group = c.benchmark_group("paged_attention_decode");
    group.sample_size(20);
    for context in [128usize, 1024] {
        let num_blocks = context / params.block_size;
        let cache_len = num_blocks * params.block_size * params.num_kv_heads * params.head_dim;
        let k_cache = rng.values(cache_len);
        let v_cache = rng.values(cache_len);
        // Blocks in reverse order, so the table is not the identity.
        let block_tables: Vec<u32> = (0..num_blocks as u32).rev().collect();
        let seqs = [AttentionSeq {
            query_start: 0,
            query_len: 1,
            context_len: context,
            block_table_start: 0,
            num_blocks,
        }];
        let q = rng.values(params.num_heads * params.head_dim);
        let mut out = vec![0.0f32; q.len()];
        group.throughput(Throughput::Elements(
            (4 * context * params.num_heads * params.head_dim) as u64,
        ));
        group.bench_with_input(BenchmarkId::from_parameter(context), &context, |b, _| {
            b.iter(|| {
                paged_attention(
                    &pool,
                    &params,
                    &q,
                    &k_cache,
                    &v_cache,
                    &seqs,
                    &block_tables,
                    &mut out,
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_matmul, bench_attention);
criterion_main!(benches);
