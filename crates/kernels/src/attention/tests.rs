//! Tests of paged attention: against the f64 reference, the scalar twin, and batch invariance.

use super::*;
use crate::test_util::Rng;
use crate::{KvCacheBuffer, KvCacheDType};

#[derive(Clone)]
struct Batch {
    params: AttentionParams,
    /// The type the caches are stored in when the batch runs (`k_cache`/`v_cache` are
    /// encoded into it first).
    dtype: KvCacheDType,
    q: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
    seqs: Vec<AttentionSeq>,
    block_tables: Vec<u32>,
    /// Per query head, an attention sink's logit.
    sinks: Option<Vec<f32>>,
}

/// Random sequences with shuffled (non-contiguous) block tables; each entry of
/// `(query_len, context_len)` becomes one sequence.
fn random_batch(rng: &mut Rng, params: AttentionParams, shapes: &[(usize, usize)]) -> Batch {
    let kv_dim = params.num_kv_heads * params.head_dim;
    let blocks_needed: usize = shapes
        .iter()
        .map(|&(_, context)| context.div_ceil(params.block_size) + 1)
        .sum();
    let num_cache_blocks = blocks_needed + 3;
    let mut free: Vec<u32> = (0..num_cache_blocks as u32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.below(i + 1));
    }
    let cache_len = num_cache_blocks * params.block_size * kv_dim;
    let k_cache = rng.vec(cache_len, -1.0, 1.0);
    let v_cache = rng.vec(cache_len, -1.0, 1.0);
    let mut seqs = Vec::new();
    let mut block_tables = Vec::new();
    let mut rows = 0;
    for &(query_len, context_len) in shapes {
        // One spare block beyond the context, as a scheduler that pre-allocates would leave.
        let num_blocks = context_len.div_ceil(params.block_size) + 1;
        seqs.push(AttentionSeq {
            query_start: rows,
            query_len,
            context_len,
            block_table_start: block_tables.len(),
            num_blocks,
        });
        for _ in 0..num_blocks {
            block_tables.push(free.pop().unwrap());
        }
        rows += query_len;
    }
    let q = rng.vec(rows * params.num_heads * params.head_dim, -1.0, 1.0);
    Batch {
        params,
        dtype: KvCacheDType::F32,
        q,
        k_cache,
        v_cache,
        seqs,
        block_tables,
        sinks: None,
    }
}

fn run(pool: &ThreadPool, batch: &Batch) -> Vec<f32> {
    run_with(VectorOps::detect(), pool, batch)
}

fn run_with(kernels: VectorOps, pool: &ThreadPool, batch: &Batch) -> Vec<f32> {
    let mut out = vec![f32::NAN; batch.q.len()];
    let k_cache = KvCacheBuffer::from_f32(batch.dtype, &batch.k_cache);
    let v_cache = KvCacheBuffer::from_f32(batch.dtype, &batch.v_cache);
    attention_with(
        kernels,
        pool,
        &batch.params,
        batch.sinks.as_deref(),
        &batch.q,
        k_cache.as_slice(),
        v_cache.as_slice(),
        &batch.seqs,
        &batch.block_tables,
        &mut out,
    )
    .unwrap();
    out
}

/// The naive reference over the values the batch's cache type stores.
fn reference(batch: &Batch) -> Vec<f32> {
    let mut expected = vec![f32::NAN; batch.q.len()];
    reference_attention_with_sinks(
        &batch.params,
        batch.sinks.as_deref(),
        &batch.q,
        &KvCacheBuffer::from_f32(batch.dtype, &batch.k_cache).to_f32(),
        &KvCacheBuffer::from_f32(batch.dtype, &batch.v_cache).to_f32(),
        &batch.seqs,
        &batch.block_tables,
        &mut expected,
    )
    .unwrap();
    expected
}

fn params(
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
) -> AttentionParams {
    AttentionParams {
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window: None,
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn close(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(a, b)| (a - b).abs() <= 1e-5 + 1e-4 * b.abs())
}

/// (num_heads, num_kv_heads, head_dim, block_size): GQA ratios 1, 3, 4 and 6, head sizes
/// with and without 8-lane tails, blocks smaller than, equal to and larger than a tile.
const CONFIGS: [(usize, usize, usize, usize); 10] = [
    (9, 3, 64, 16),
    (8, 2, 128, 16),
    (4, 4, 48, 16),
    (6, 2, 80, 7),
    (5, 5, 17, 4),
    (6, 1, 8, 3),
    (4, 2, 33, 16),
    (8, 2, 64, 40),
    (3, 1, 256, 32),
    (2, 2, 5, 1),
];

#[test]
fn matches_reference_on_mixed_batches() {
    let mut rng = Rng::new(5);
    let pool = ThreadPool::new(2);
    for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
        let params = params(num_heads, num_kv_heads, head_dim, block_size);
        // Prefill from scratch, decode, a chunked-prefill continuation, a long prefill
        // crossing many blocks, and decodes just before, at and after a block boundary.
        let shapes = [
            (37, 37),
            (1, 50),
            (20, 45),
            (1, 1),
            (70, 70),
            (1, 2 * block_size - 1),
            (1, 2 * block_size),
            (1, 2 * block_size + 1),
        ];
        let batch = random_batch(&mut rng, params, &shapes);
        let expected = reference(&batch);
        let scalar = run_with(VectorOps::Scalar, &pool, &batch);
        for kernels in VectorOps::available() {
            let out = run_with(kernels, &pool, &batch);
            for (i, (a, b)) in out.iter().zip(&expected).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                    "{params:?} {kernels:?} element {i}: {a} vs {b}"
                );
            }
            // The SIMD path is bitwise its scalar twin.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&scalar), "{params:?} {kernels:?}");
        }
    }
}

#[test]
fn leaves_padding_rows_untouched() {
    let mut rng = Rng::new(6);
    let params = params(9, 3, 64, 16);
    let mut batch = random_batch(&mut rng, params, &[(3, 20), (1, 33)]);
    let q_dim = params.num_heads * params.head_dim;
    // Two padding rows between the sequences and one after them.
    let mut q = batch.q[..3 * q_dim].to_vec();
    q.extend(rng.vec(2 * q_dim, -1.0, 1.0));
    q.extend_from_slice(&batch.q[3 * q_dim..]);
    q.extend(rng.vec(q_dim, -1.0, 1.0));
    batch.q = q;
    batch.seqs[1].query_start = 5;
    let out = run(&ThreadPool::new(2), &batch);
    let expected = reference(&batch);
    for (row, (got, want)) in out.chunks(q_dim).zip(expected.chunks(q_dim)).enumerate() {
        if [3, 4, 6].contains(&row) {
            assert!(got.iter().all(|v| v.is_nan()), "padding row {row} written");
        } else {
            assert!(close(got, want), "row {row}");
        }
    }
}

/// Rows `rows` of one sequence of `batch` as a batch of their own (the context ending at
/// the last of them), as a decode step or a prefill chunk would present them.
fn rows_alone(batch: &Batch, seq: &AttentionSeq, rows: std::ops::Range<usize>) -> Batch {
    let q_dim = batch.params.num_heads * batch.params.head_dim;
    let first = seq.query_start + rows.start;
    Batch {
        params: batch.params,
        dtype: batch.dtype,
        q: batch.q[first * q_dim..(seq.query_start + rows.end) * q_dim].to_vec(),
        k_cache: batch.k_cache.clone(),
        v_cache: batch.v_cache.clone(),
        seqs: vec![AttentionSeq {
            query_start: 0,
            query_len: rows.len(),
            context_len: seq.context_len - seq.query_len + rows.end,
            ..*seq
        }],
        block_tables: batch.block_tables.clone(),
        sinks: batch.sinks.clone(),
    }
}

#[test]
fn rows_are_bitwise_independent_of_batch_chunking_and_threads() {
    check_batch_invariance(KvCacheDType::F32, None, false);
}

#[test]
fn sliding_window_rows_are_bitwise_independent_of_batching() {
    for window in [1, 5, 16, 23] {
        check_batch_invariance(KvCacheDType::F32, Some(window), false);
    }
    check_batch_invariance(KvCacheDType::F16, Some(9), false);
}

/// Windows of one key, inside one tile, across tiles and blocks, and longer than every
/// context: each query sees keys `(p - w, p]` on both vector paths; a window longer than
/// the context changes nothing, bit for bit.
#[test]
fn sliding_window_matches_reference_and_scalar_twin() {
    let mut rng = Rng::new(21);
    let pool = ThreadPool::new(2);
    for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
        let full = params(num_heads, num_kv_heads, head_dim, block_size);
        let shapes = [
            (37, 37),
            (1, 50),
            (20, 45),
            (1, 1),
            (70, 70),
            (3, 2 * block_size + 1),
        ];
        let mut batch = random_batch(&mut rng, full, &shapes);
        let unwindowed = run(&pool, &batch);
        for window in [1, 2, 7, 16, 17, 33, 70, 1000] {
            batch.params.sliding_window = Some(window);
            let expected = reference(&batch);
            // The tile kernels' vector twins agree with the scalar ones to rounding (the
            // vector exp differs in the last bits), so both are held to the reference.
            for kernels in VectorOps::available() {
                let got = run_with(kernels, &pool, &batch);
                assert!(
                    close(&got, &expected),
                    "{full:?} {kernels:?} window {window}"
                );
            }
            let detected = run(&pool, &batch);
            if window == 1000 {
                assert_eq!(
                    bits(&detected),
                    bits(&unwindowed),
                    "{full:?} window {window}"
                );
            }
        }
        if block_size > 1 {
            // A window really narrows what a late query sees.
            batch.params.sliding_window = Some(2);
            assert!(!close(&run(&pool, &batch), &unwindowed), "{full:?}");
        }
    }
    let zero = AttentionParams {
        sliding_window: Some(0),
        ..params(2, 2, 4, 4)
    };
    let batch = random_batch(&mut rng, zero, &[(1, 1)]);
    let mut out = vec![0.0; batch.q.len()];
    assert!(paged_attention(
        &pool,
        &zero,
        &batch.q,
        (&batch.k_cache).into(),
        (&batch.v_cache).into(),
        &batch.seqs,
        &batch.block_tables,
        &mut out
    )
    .is_err());
}

#[test]
fn rows_are_bitwise_independent_of_batching_for_every_cache_type() {
    for dtype in [
        KvCacheDType::F16,
        KvCacheDType::BF16,
        KvCacheDType::Fp8E4m3,
        KvCacheDType::Fp8E5m2,
    ] {
        check_batch_invariance(dtype, None, false);
    }
}

/// gpt-oss's attention sinks: close to the f64 reference (whose softmax has the sink's
/// logit in it), bitwise the scalar twin on every path the host has, and batch invariant
/// (the sink is merged after every segment, also when a long context is split over tasks).
#[test]
fn attention_sinks_match_reference_scalar_twin_and_batching() {
    let mut rng = Rng::new(17);
    let pool = ThreadPool::new(2);
    for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
        let params = params(num_heads, num_kv_heads, head_dim, block_size);
        let shapes = [(37, 37), (1, 50), (20, 45), (1, 1), (1, 300), (5, 270)];
        let mut batch = random_batch(&mut rng, params, &shapes);
        // Sinks below, near and above the scores' range.
        batch.sinks = Some(rng.vec(num_heads, -3.0, 4.0));
        let plain = run_with(
            VectorOps::Scalar,
            &pool,
            &Batch {
                sinks: None,
                ..batch.clone()
            },
        );
        let expected = reference(&batch);
        let scalar = run_with(VectorOps::Scalar, &pool, &batch);
        assert!(close(&scalar, &expected), "{params:?} scalar");
        assert_ne!(
            bits(&plain),
            bits(&scalar),
            "{params:?}: the sinks changed nothing"
        );
        for kernels in VectorOps::available() {
            let out = run_with(kernels, &pool, &batch);
            assert!(close(&out, &expected), "{params:?} {kernels:?}");
            assert_eq!(bits(&out), bits(&scalar), "{params:?} {kernels:?}");
        }
    }
    check_batch_invariance(KvCacheDType::F32, None, true);
    check_batch_invariance(KvCacheDType::F16, Some(20), true);
}

/// A sink far above every score takes almost all the weight: the output goes to zero.
#[test]
fn a_dominant_sink_silences_the_head() {
    let mut rng = Rng::new(18);
    let params = params(4, 2, 16, 16);
    let mut batch = random_batch(&mut rng, params, &[(3, 20)]);
    batch.sinks = Some(vec![60.0, 0.0, 60.0, 0.0]);
    let out = run(&ThreadPool::new(1), &batch);
    for row in out.chunks(4 * 16) {
        assert!(
            row[..16].iter().all(|v| v.abs() < 1e-20),
            "{:?}",
            &row[..16]
        );
        assert!(row[16..32].iter().any(|v| v.abs() > 1e-3));
    }
}

/// Each sequence alone (any thread count), each row as a decode step, and uneven prefill
/// chunks give bitwise what the whole mixed batch gives, over a `dtype` cache.
fn check_batch_invariance(dtype: KvCacheDType, sliding_window: Option<usize>, sinks: bool) {
    let mut rng = Rng::new(9);
    let pools: Vec<ThreadPool> = [1, 2, 3, 8].into_iter().map(ThreadPool::new).collect();
    for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
        let params = AttentionParams {
            sliding_window,
            ..params(num_heads, num_kv_heads, head_dim, block_size)
        };
        let q_dim = num_heads * head_dim;
        // Short and long contexts: a long decode, a long verification-sized chunk and a prefill
        // crossing several segments split their keys over tasks when alone.
        let shapes = [
            (40, 40),
            (1, 77),
            (5, 30),
            (19, 50),
            (1, 300),
            (5, 270),
            (150, 150),
        ];
        let mut batch = random_batch(&mut rng, params, &shapes);
        batch.dtype = dtype;
        if sinks {
            batch.sinks = Some(rng.vec(num_heads, -3.0, 4.0));
        }
        let together = run(&pools[1], &batch);
        assert!(close(&together, &reference(&batch)), "{params:?} {dtype}");
        for (index, seq) in batch.seqs.iter().enumerate() {
            let expected = &together[seq.query_start * q_dim..][..seq.query_len * q_dim];
            // The whole sequence alone, with any thread count.
            let alone = rows_alone(&batch, seq, 0..seq.query_len);
            for pool in &pools {
                assert_eq!(
                    bits(&run(pool, &alone)),
                    bits(expected),
                    "{params:?} {dtype} sequence {index} alone, {} threads",
                    pool.num_threads()
                );
            }
            // Every row as a one-token decode step.
            for row in 0..seq.query_len {
                let decode = rows_alone(&batch, seq, row..row + 1);
                let pool = &pools[row % pools.len()];
                assert_eq!(
                    bits(&run(pool, &decode)),
                    bits(&expected[row * q_dim..(row + 1) * q_dim]),
                    "{params:?} {dtype} sequence {index} row {row} as a decode step"
                );
            }
            // The rows prefilled in uneven chunks, as chunked prefill would.
            let mut chunked = Vec::new();
            let mut start = 0;
            for size in [3, 13, 1, 17].into_iter().cycle() {
                if start >= seq.query_len {
                    break;
                }
                let end = (start + size).min(seq.query_len);
                chunked.extend(run(&pools[0], &rows_alone(&batch, seq, start..end)));
                start = end;
            }
            assert_eq!(
                bits(&chunked),
                bits(expected),
                "{params:?} {dtype} sequence {index} chunked"
            );
        }
    }
}

/// Decoding is exact, so attention over a reduced-precision cache is bitwise attention
/// over an f32 cache holding the decoded values, with either vector path.
#[test]
fn reduced_precision_caches_attend_exactly_like_f32_caches_of_their_values() {
    let mut rng = Rng::new(12);
    let pool = ThreadPool::new(2);
    for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
        let params = params(num_heads, num_kv_heads, head_dim, block_size);
        let shapes = [(37, 37), (1, 50), (20, 45), (1, 2 * block_size + 1)];
        let mut batch = random_batch(&mut rng, params, &shapes);
        // Beyond fp8 E4M3's range, so saturation is part of what is compared.
        batch
            .k_cache
            .iter_mut()
            .step_by(97)
            .for_each(|v| *v *= 900.0);
        for dtype in KvCacheDType::ALL {
            let stored = Batch {
                dtype,
                ..batch.clone()
            };
            let decoded = Batch {
                dtype: KvCacheDType::F32,
                k_cache: KvCacheBuffer::from_f32(dtype, &batch.k_cache).to_f32(),
                v_cache: KvCacheBuffer::from_f32(dtype, &batch.v_cache).to_f32(),
                ..batch.clone()
            };
            for kernels in VectorOps::available() {
                let got = run_with(kernels, &pool, &stored);
                assert!(got.iter().all(|v| v.is_finite()), "{params:?} {dtype}");
                assert_eq!(
                    bits(&got),
                    bits(&run_with(kernels, &pool, &decoded)),
                    "{params:?} {dtype} {kernels:?}"
                );
            }
            assert!(
                close(&run(&pool, &stored), &reference(&stored)),
                "{params:?} {dtype}"
            );
        }
    }
}

#[test]
fn write_kv_encodes_into_the_cache_type() {
    let kv_dim = 9;
    let mut rng = Rng::new(3);
    let k: Vec<f32> = rng.vec(2 * kv_dim, -600.0, 600.0);
    let v: Vec<f32> = rng.vec(2 * kv_dim, -1.0, 1.0);
    for dtype in KvCacheDType::ALL {
        let mut k_cache = KvCacheBuffer::zeros(dtype, 3 * kv_dim);
        let mut v_cache = KvCacheBuffer::zeros(dtype, 3 * kv_dim);
        write_kv(
            &k,
            &v,
            &[2, PADDING_SLOT],
            kv_dim,
            k_cache.as_slice_mut(),
            v_cache.as_slice_mut(),
        )
        .unwrap();
        let (keys, values) = (k_cache.to_f32(), v_cache.to_f32());
        assert!(keys[..2 * kv_dim].iter().all(|&x| x == 0.0), "{dtype}");
        for i in 0..kv_dim {
            assert_eq!(keys[2 * kv_dim + i], dtype.round(k[i]), "{dtype}");
            assert_eq!(values[2 * kv_dim + i], dtype.round(v[i]), "{dtype}");
        }
        let mut other = KvCacheBuffer::zeros(KvCacheDType::F32, 3 * kv_dim);
        assert!(
            write_kv(
                &k,
                &v,
                &[0, 1],
                kv_dim,
                k_cache.as_slice_mut(),
                other.as_slice_mut()
            )
            .is_err()
                == (dtype != KvCacheDType::F32)
        );
    }
}

#[test]
fn plans_cover_every_pair_once() {
    for (num_heads, num_kv_heads, head_dim) in [
        (9, 3, 64),
        (8, 2, 128),
        (32, 1, 256),
        (4, 4, 48),
        (2, 1, 8192),
    ] {
        for window in [None, Some(200)] {
            let p = AttentionParams {
                sliding_window: window,
                ..params(num_heads, num_kv_heads, head_dim, 16)
            };
            let group = num_heads / num_kv_heads;
            // (query_len, context_len): prefills, decodes and verification rows at long contexts.
            for lens in [
                &[(1usize, 1usize)][..],
                &[(1, 1), (1, 1), (1, 1), (1, 1)],
                &[(70, 70), (1, 1), (5, 5)],
                &[(512, 512)],
                &[(1, 1000)],
                &[(5, 700), (1, 129)],
            ] {
                let seqs: Vec<AttentionSeq> = lens
                    .iter()
                    .map(|&(query_len, context_len)| AttentionSeq {
                        query_start: 0,
                        query_len,
                        context_len,
                        block_table_start: 0,
                        num_blocks: 0,
                    })
                    .collect();
                for threads in [1, 2, 16] {
                    let plan = Plan::new(&p, &seqs, threads);
                    for seq in &seqs {
                        let segments = p.segments(seq);
                        let mut seen = vec![0u32; seq.query_len * num_heads * segments.len()];
                        for local in 0..plan.tasks_per_seq(seq) {
                            let work = plan.task(seq, local);
                            assert!(
                                work.kv_heads.len() * work.heads.len() * work.rows.len()
                                    <= MAX_PAIRS
                            );
                            assert!(!work.heads.is_empty() && !work.rows.is_empty());
                            assert!(!work.segments.is_empty());
                            assert!(
                                segments.start <= work.segments.start
                                    && work.segments.end <= segments.end
                            );
                            // A task that does not cover all segments stores them for the merge.
                            assert!(work.segments == segments || plan.splits(seq));
                            assert!(work.kv_heads.end <= num_kv_heads);
                            assert!(work.heads.end <= group);
                            for head in work.query_heads(group) {
                                for row in work.rows.clone() {
                                    for segment in work.segments.clone() {
                                        let pair = row * num_heads + head;
                                        seen[pair * segments.len() + segment - segments.start] += 1;
                                    }
                                }
                            }
                        }
                        assert!(seen.iter().all(|&n| n == 1), "{p:?} {lens:?} {threads}");
                    }
                    let unsplit = Plan::new(&p, &seqs, 1);
                    if threads == 2
                        && lens == [(1, 1000)]
                        && unsplit.tasks_per_seq(&seqs[0]) < 2 * threads
                    {
                        // A long decode too small to keep the threads busy is split by keys,
                        // not by heads.
                        assert!(plan.splits(&seqs[0]), "{p:?} {plan:?}");
                        assert_eq!(plan.parts, unsplit.parts, "{p:?} {plan:?}");
                    }
                }
            }
        }
    }
}

/// A verification step too small for the threads is split by its rows (equal tasks over the
/// whole context, no merge pass); a decode step by its keys, the larger key ranges first so
/// the pool's hand-out of the heaviest task first balances the threads.
#[test]
fn plans_split_verification_rows_before_keys() {
    let p = params(9, 3, 64, 16);
    let seq = |query_len: usize, context_len: usize| AttentionSeq {
        query_start: 0,
        query_len,
        context_len,
        block_table_start: 0,
        num_blocks: 0,
    };
    for query_len in [8, 16] {
        let verify = seq(query_len, 350 + query_len);
        let plan = Plan::new(&p, &[verify], 2);
        assert!(!plan.splits(&verify), "{plan:?}");
        let tasks = plan.tasks_per_seq(&verify);
        assert!(tasks >= 2 * MIN_TASKS_PER_THREAD, "{plan:?}");
        for local in 0..tasks {
            let work = plan.task(&verify, local);
            assert_eq!(work.rows.len(), query_len / 2, "{work:?}");
            assert_eq!(work.segments, p.segments(&verify), "{work:?}");
        }
    }
    // One or three rows: a row split would leave tasks of one or two rows; keys are split
    // instead (five segments into four ranges: 2, 1, 1, 1).
    for (query_len, context_len) in [(1, 600), (3, 603)] {
        let small = seq(query_len, context_len);
        let plan = Plan::new(&p, &[small], 2);
        assert!(plan.splits(&small), "{plan:?}");
        let sizes: Vec<usize> = (0..plan.tasks_per_seq(&small))
            .map(|local| {
                let work = plan.task(&small, local);
                assert_eq!(work.rows.len(), query_len, "{work:?}");
                work.segments.len()
            })
            .collect();
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
        assert!(sizes[0] > *sizes.last().unwrap_or(&0), "{sizes:?}");
    }
}

#[test]
fn write_kv_scatters_by_slot() {
    let kv_dim = 3;
    let k: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let v: Vec<f32> = (0..6).map(|v| -(v as f32)).collect();
    let mut k_cache = vec![0.0f32; 4 * kv_dim];
    let mut v_cache = vec![0.0f32; 4 * kv_dim];
    write_kv(
        &k,
        &v,
        &[3, 1],
        kv_dim,
        (&mut k_cache).into(),
        (&mut v_cache).into(),
    )
    .unwrap();
    assert_eq!(&k_cache[9..12], &[0.0, 1.0, 2.0]);
    assert_eq!(&k_cache[3..6], &[3.0, 4.0, 5.0]);
    assert_eq!(&v_cache[3..6], &[-3.0, -4.0, -5.0]);
    assert!(write_kv(
        &k,
        &v,
        &[3, 4],
        kv_dim,
        (&mut k_cache).into(),
        (&mut v_cache).into()
    )
    .is_err());
    write_kv(
        &k,
        &v,
        &[PADDING_SLOT, 0],
        kv_dim,
        (&mut k_cache).into(),
        (&mut v_cache).into(),
    )
    .unwrap();
    assert_eq!(&k_cache[0..3], &[3.0, 4.0, 5.0]);
}

#[test]
fn rejects_bad_batches() {
    let params = AttentionParams {
        num_heads: 4,
        num_kv_heads: 3,
        head_dim: 4,
        block_size: 2,
        scale: 1.0,
        sliding_window: None,
    };
    let pool = ThreadPool::new(1);
    let q = vec![0.0f32; 16];
    let cache = vec![0.0f32; 2 * 2 * 3 * 4];
    let mut out = vec![0.0f32; 16];
    assert!(paged_attention(
        &pool,
        &params,
        &q,
        (&cache).into(),
        (&cache).into(),
        &[],
        &[],
        &mut out
    )
    .is_err());
    let params = AttentionParams {
        num_kv_heads: 2,
        ..params
    };
    let cache = vec![0.0f32; 2 * 2 * 2 * 4];
    let seq = AttentionSeq {
        query_start: 0,
        query_len: 1,
        context_len: 5,
        block_table_start: 0,
        num_blocks: 2,
    };
    assert!(paged_attention(
        &pool,
        &params,
        &q,
        (&cache).into(),
        (&cache).into(),
        &[seq],
        &[0, 1],
        &mut out
    )
    .is_err());
    let seq = AttentionSeq {
        context_len: 3,
        ..seq
    };
    assert!(paged_attention(
        &pool,
        &params,
        &q,
        (&cache).into(),
        (&cache).into(),
        &[seq],
        &[0, 7],
        &mut out
    )
    .is_err());
    paged_attention(
        &pool,
        &params,
        &q,
        (&cache).into(),
        (&cache).into(),
        &[seq],
        &[0, 1],
        &mut out,
    )
    .unwrap();
}
