//! The diagnosis thresholds, each with the source it comes from. Article files live in the
//! steering repo under `shared/seeds/`: 000 is "5 steps to triage vLLM performance" (Red Hat
//! Developers, 2026), 002 is "vLLM v1 Performance Profiling: Finding and Fixing Bottlenecks in
//! Production" (its pathology section).

/// Default TTFT objective when `--slo-ttft` is not given, in seconds.
/// 002, "Latency Targets by Use Case": interactive chat TTFT target < 500 ms.
pub const DEFAULT_TTFT_TARGET_SECONDS: f64 = 0.5;

/// Default inter-token latency objective when `--slo-itl` is not given, in seconds.
/// 002, "Latency Targets by Use Case": interactive chat TBT target < 50 ms.
pub const DEFAULT_ITL_TARGET_SECONDS: f64 = 0.05;

/// End-to-end latency objective, in seconds.
/// 002, "Latency Targets by Use Case": interactive chat E2E target < 10 s.
pub const DEFAULT_E2E_TARGET_SECONDS: f64 = 10.0;

/// Waiting requests above this at every sample = saturation.
/// 000, step 2: "If num_requests_waiting is consistently above zero, the time requests spend
/// in the queue leads to higher TTFT."
pub const SATURATION_WAITING: f64 = 0.0;

/// Mean KV-cache usage at or above this over the window = memory pressure.
/// 000, step 2: a healthy server has "zero requests waiting, and the KV cache utilization is
/// below 90%"; 002 colours the KV panel yellow at 0.9.
pub const KV_PRESSURE_USAGE: f64 = 0.90;

/// Mean KV-cache usage at or above this over the window = critical.
/// 002, alert rules: `KVCacheNearFull: vllm_kv_cache_utilization > 0.95` (severity critical).
pub const KV_CRITICAL_USAGE: f64 = 0.95;

/// Any preemption in the window is a problem.
/// 000, step 3: total preemptions "indicates severe memory thrashing ... If this counter is
/// climbing, reduce --max-num-seqs".
pub const PREEMPTIONS_PROBLEM: f64 = 0.0;

/// KV capacity below this many concurrent p95-sized requests is too small.
/// 000, step 3, start-up capacity: "Maximum concurrency for 10,000 tokens per request: 1.83x"
/// — "the server will struggle with more than two users at a time".
pub const MIN_CONCURRENCY_AT_P95: f64 = 2.0;

/// Safety factor of KV capacity when sizing `--max-num-seqs` after thrashing.
/// 002, pathology 1 diagnostic script: `safe_max_seqs = int(total_blocks * 0.85 / blocks_per_seq)`.
pub const KV_SAFE_FRACTION: f64 = 0.85;

/// Prompts longer than this at p95 make TTFT prefill-bound.
/// 000, step 4: "processing a 1,000-token prompt (prefill) is parallel and typically takes less
/// than a second" — longer prompts push TTFT past the interactive target by themselves.
pub const LONG_PROMPT_TOKENS: f64 = 1000.0;

/// Outputs longer than this at p95 make E2E decode-bound.
/// 000, step 4: "generating 1,000 tokens (decode) ... could take anywhere from 10 to 100+ seconds".
pub const LONG_OUTPUT_TOKENS: f64 = 1000.0;

/// Mean running requests below this (with no queue) = under-utilised batch.
/// 002, pathology 3: `gpu_utilization < 0.50 AND batch_size_p50 < 8 AND queue_depth < 5`.
pub const UNDERUSED_RUNNING: f64 = 8.0;

/// Peak KV usage below this (with no queue) = memory mostly idle; the KV analogue of 002's
/// `gpu_utilization < 0.50` in pathology 3.
pub const UNDERUSED_KV_USAGE: f64 = 0.50;

/// KV usage above this while nothing runs or waits = blocks held by no request.
/// ARCHITECTURE.md invariant 4: "at idle the KV usage reads 0 apart from cached free blocks"
/// (cached free blocks are free in vLLM's usage too); 002, pathology 4: blocks "not being freed
/// for completed or failed requests". The detector also tolerates one block's worth of usage.
pub const LEAK_IDLE_USAGE: f64 = 0.0;

/// A steady KV-usage rise of at least this (absolute fraction) over the window at constant load
/// while requests complete = suspected leak.
/// 002, pathology 4: "gpu_memory_usage steadily increasing AND requests_completed_total
/// increasing normally". Five points of usage is well above sampling noise.
pub const LEAK_MIN_RISE: f64 = 0.05;

/// Prefix-cache hit rate below this with caching enabled = misses.
/// 002, pathology 5: `prefix_cache_hit_rate < 0.1 AND enable_prefix_caching = true`.
pub const PREFIX_MISS_HIT_RATE: f64 = 0.10;

/// Prompts need at least this many full KV blocks at p50 for a shared prefix to be cacheable:
/// prefix caching shares whole blocks only (vLLM's hash chain is per full block, DESIGN.md), so
/// shorter prompts cannot hit however they are structured.
pub const PREFIX_MIN_PROMPT_BLOCKS: f64 = 2.0;

/// Share of requests finishing by `length` above which outputs are being cut by max_tokens.
/// vllm-compat.md: `request_success` carries `finished_reason` = stop | length | abort.
/// Half is the point where truncation is the norm, not the exception.
pub const TRUNCATED_OUTPUT_SHARE: f64 = 0.5;

/// Draft acceptance rate below which speculative decoding is reported as not paying.
/// vLLM's `SpecDecoding metrics` line reports the same ratio ("Avg Draft acceptance rate").
/// With n-gram or suffix drafts a verification that accepts under a third of its drafts
/// averages well under one extra token per step, while every rejected row is computed anyway.
pub const SPEC_POOR_ACCEPTANCE: f64 = 0.30;

/// Drafted tokens a window needs before its acceptance rate is judged (a few requests'
/// worth; fewer is noise).
pub const SPEC_MIN_DRAFT_TOKENS: f64 = 200.0;
