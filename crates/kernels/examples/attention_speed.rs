//! Decode attention as a model runs it: one query row per sequence attending over `layers`
//! separate caches (one per layer, so the K/V come from memory, not from L2 as in the criterion
//! bench), SmolLM2-135M's head shape (9 query heads, 3 kv heads, head_dim 64, blocks of 16).
//! Prints milliseconds per decode step (all layers) and the K/V bytes read per second.
//! Run: `cargo run --release -p tokenmill-kernels --example attention_speed [threads]
//! [context,...] [batch] [f16|bf16|f32|fp8_e4m3|fp8_e5m2] [layers] [kv heads] [rows]`; `rows`
//! query rows per sequence (default 1; k + 1 for a speculative verification of k drafts, the
//! last rows of the context).

use std::time::Instant;

use tokenmill_kernels::{
    paged_attention, AttentionParams, AttentionSeq, KvCacheBuffer, KvCacheDType, ThreadPool,
};

mod common;

use common::random_values;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let contexts: Vec<usize> = args
        .next()
        .map(|a| a.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![512, 4096]);
    let batch: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let dtype = match args.next().as_deref() {
        Some("f32") => KvCacheDType::F32,
        Some("bf16") => KvCacheDType::BF16,
        Some("fp8_e4m3") => KvCacheDType::Fp8E4m3,
        Some("fp8_e5m2") => KvCacheDType::Fp8E5m2,
        _ => KvCacheDType::F16,
    };
    let layers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(30);
    let kv_heads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let rows: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let params = AttentionParams {
        num_heads: 3 * kv_heads,
        num_kv_heads: kv_heads,
        head_dim: 64,
        block_size: 16,
        scale: 0.125,
        sliding_window: None,
    };
    let pool = ThreadPool::new(threads);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let kv_dim = params.num_kv_heads * params.head_dim;
    println!("threads {threads}, batch {batch}, {rows} query rows each, {layers} layers, kv cache {dtype}");
    for context in contexts {
        let num_blocks = context.div_ceil(params.block_size);
        let cache_len = batch * num_blocks * params.block_size * kv_dim;
        // Per layer: its own K and V (values drawn once and reused: only the addresses matter).
        let k_values = random_values(cache_len, &mut seed);
        let v_values = random_values(cache_len, &mut seed);
        let caches: Vec<(KvCacheBuffer, KvCacheBuffer)> = (0..layers)
            .map(|_| {
                (
                    KvCacheBuffer::from_f32(dtype, &k_values),
                    KvCacheBuffer::from_f32(dtype, &v_values),
                )
            })
            .collect();
        // Interleave the sequences' blocks, as a server's allocator hands them out.
        let block_tables: Vec<u32> = (0..batch)
            .flat_map(|s| (0..num_blocks).map(move |b| (b * batch + s) as u32))
            .collect();
        let seqs: Vec<AttentionSeq> = (0..batch)
            .map(|i| AttentionSeq {
                query_start: i * rows,
                query_len: rows,
                context_len: context,
                block_table_start: i * num_blocks,
                num_blocks,
            })
            .collect();
        let q = random_values(batch * rows * params.num_heads * params.head_dim, &mut seed);
        let mut out = vec![0.0f32; q.len()];
        let mut step = || -> Result<(), Box<dyn std::error::Error>> {
            for (k, v) in &caches {
                paged_attention(
                    &pool,
                    &params,
                    &q,
                    k.as_slice(),
                    v.as_slice(),
                    &seqs,
                    &block_tables,
                    &mut out,
                )?;
            }
            Ok(())
        };
        let start = Instant::now();
        step()?;
        // At least 15 timed steps, and about half a second of them.
        let steps = ((0.5 / start.elapsed().as_secs_f64().max(1e-6)) as usize).clamp(15, 100_000);
        let mut best = f64::INFINITY;
        for _ in 0..steps {
            let start = Instant::now();
            step()?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        let bytes = 2 * layers * batch * context * kv_dim * dtype.element_bytes();
        println!(
            "context {context:>6}: {:7.3} ms/step, {:6.2} GB/s of K/V, {:5.1} ns per key and kv head, {:5.2} ns per key and query head",
            best * 1e3,
            bytes as f64 / best / 1e9,
            best * 1e9 / (layers * batch * context * params.num_kv_heads) as f64,
            best * 1e9 / (layers * batch * rows * context * params.num_heads) as f64,
        );
    }
    Ok(())
}
