//! A builder of realistic vLLM `/metrics` dumps for the fixture tests: the exposition that
//! vLLM's Python `prometheus_client` writes (HELP/TYPE lines, `_total` counters with their
//! `_created` gauges, `model_name`/`engine` labels, histogram buckets exactly as listed in
//! vllm-compat.md), plus the process and GC families every vLLM server also exposes.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use tokenmill_triage::Scrape;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
const ITERATION_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
const N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];

/// vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, ... up to the limit.
pub fn one_two_five_buckets(max_value: u32) -> Vec<f64> {
    let mut buckets = Vec::new();
    let mut exponent = 0;
    loop {
        for mantissa in [1.0, 2.0, 5.0] {
            let value = mantissa * 10f64.powi(exponent);
            if value > f64::from(max_value) {
                return buckets;
            }
            buckets.push(value);
        }
        exponent += 1;
    }
}

/// Python's `repr(float)` closely enough for the exposition: `3.0`, `0.001`, `2560.0`.
fn python_float(value: f64) -> String {
    if value == f64::INFINITY {
        "+Inf".to_owned()
    } else if value.fract() == 0.0 && value.abs() < 1e16 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

#[derive(Debug, Clone)]
struct Histogram {
    bounds: Vec<f64>,
    /// Per-bucket (not cumulative) counts; the last entry is the +Inf bucket.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    fn observe(&mut self, value: f64, times: u64) {
        let bucket = self
            .bounds
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(self.bounds.len());
        self.counts[bucket] += times;
        self.sum += value * times as f64;
    }

    fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// One kind of request: how long it queued, prefilled and decoded, and its lengths.
#[derive(Debug, Clone, Copy)]
pub struct RequestShape {
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub queue_s: f64,
    pub prefill_s: f64,
    pub itl_s: f64,
    /// Prompt tokens found in the prefix cache.
    pub cached_prompt_tokens: u32,
    pub finished_reason: &'static str,
}

impl RequestShape {
    /// A short chat turn served promptly.
    pub fn chat() -> Self {
        Self {
            prompt_tokens: 300,
            output_tokens: 150,
            queue_s: 0.002,
            prefill_s: 0.07,
            itl_s: 0.02,
            cached_prompt_tokens: 160,
            finished_reason: "stop",
        }
    }

    fn ttft(&self) -> f64 {
        self.queue_s + self.prefill_s
    }

    fn decode_s(&self) -> f64 {
        self.itl_s * f64::from(self.output_tokens.saturating_sub(1))
    }
}

/// Scheduler gauges at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gauges {
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
}

pub fn gauges(running: f64, waiting: f64, kv_usage: f64) -> Gauges {
    Gauges {
        running,
        waiting,
        kv_usage,
    }
}

/// The metrics of one engine of one model.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    pub model_name: String,
    pub engine: String,
    pub gauges: Gauges,
    pub block_size: u32,
    pub num_gpu_blocks: u32,
    pub prefix_caching: bool,
    prompt_tokens: u64,
    generation_tokens: u64,
    preemptions: u64,
    prefix_queries: u64,
    prefix_hits: u64,
    success: BTreeMap<&'static str, u64>,
    histograms: BTreeMap<&'static str, Histogram>,
    /// `(drafts, draft tokens, accepted tokens)` once the engine speculates.
    spec_decode: Option<(u64, u64, u64)>,
}

const HISTOGRAMS: &[(&str, &str)] = &[
    (
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
    ),
    (
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
    ),
    (
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
    ),
    (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
    ),
    (
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
    ),
    (
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
    ),
    (
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
    ),
    (
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
    ),
    (
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
    ),
    (
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
    ),
    (
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
    ),
    (
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
    ),
    (
        "vllm:request_params_n",
        "Histogram of the n request parameter.",
    ),
];

impl EngineMetrics {
    fn new(model_name: &str, engine: &str, max_model_len: u32) -> Self {
        let lengths = one_two_five_buckets(max_model_len);
        let mut histograms = BTreeMap::new();
        for &(name, _) in HISTOGRAMS {
            let bounds: &[f64] = match name {
                "vllm:iteration_tokens_total" => ITERATION_BUCKETS,
                "vllm:time_to_first_token_seconds" => TTFT_BUCKETS,
                "vllm:inter_token_latency_seconds"
                | "vllm:request_time_per_output_token_seconds" => ITL_BUCKETS,
                "vllm:request_params_n" => N_BUCKETS,
                "vllm:request_prompt_tokens"
                | "vllm:request_generation_tokens"
                | "vllm:request_params_max_tokens" => &lengths,
                _ => REQUEST_BUCKETS,
            };
            histograms.insert(name, Histogram::new(bounds));
        }
        Self {
            model_name: model_name.to_owned(),
            engine: engine.to_owned(),
            gauges: gauges(0.0, 0.0, 0.0),
            block_size: 16,
            num_gpu_blocks: 2048,
            prefix_caching: true,
            prompt_tokens: 0,
            generation_tokens: 0,
            preemptions: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            success: ["abort", "length", "stop"]
                .into_iter()
                .map(|r| (r, 0))
                .collect(),
            histograms,
            spec_decode: None,
        }
    }

    fn observe(&mut self, name: &str, value: f64, times: u64) {
        if let Some(histogram) = self.histograms.get_mut(name) {
            histogram.observe(value, times);
        }
    }

    /// Records `count` finished requests of `shape`, as vLLM's stat logger would.
    pub fn complete(&mut self, count: u64, shape: RequestShape) {
        let output = u64::from(shape.output_tokens);
        self.prompt_tokens += count * u64::from(shape.prompt_tokens);
        self.generation_tokens += count * output;
        if self.prefix_caching {
            self.prefix_queries += count * u64::from(shape.prompt_tokens);
            self.prefix_hits += count * u64::from(shape.cached_prompt_tokens);
        }
        *self.success.entry(shape.finished_reason).or_default() += count;
        let decode = shape.decode_s();
        self.observe("vllm:time_to_first_token_seconds", shape.ttft(), count);
        self.observe(
            "vllm:inter_token_latency_seconds",
            shape.itl_s,
            count * output.saturating_sub(1),
        );
        self.observe(
            "vllm:request_time_per_output_token_seconds",
            shape.itl_s,
            count,
        );
        self.observe(
            "vllm:e2e_request_latency_seconds",
            shape.ttft() + decode,
            count,
        );
        self.observe("vllm:request_queue_time_seconds", shape.queue_s, count);
        self.observe(
            "vllm:request_inference_time_seconds",
            shape.prefill_s + decode,
            count,
        );
        self.observe("vllm:request_prefill_time_seconds", shape.prefill_s, count);
        self.observe("vllm:request_decode_time_seconds", decode, count);
        self.observe(
            "vllm:request_prompt_tokens",
            f64::from(shape.prompt_tokens),
            count,
        );
        self.observe(
            "vllm:request_generation_tokens",
            f64::from(shape.output_tokens),
            count,
        );
        self.observe(
            "vllm:request_params_max_tokens",
            f64::from(shape.output_tokens.max(256)),
            count,
        );
        self.observe("vllm:request_params_n", 1.0, count);
        self.observe(
            "vllm:iteration_tokens_total",
            f64::from(shape.prompt_tokens),
            count,
        );
        self.observe("vllm:iteration_tokens_total", 8.0, count * output);
    }

    pub fn preempt(&mut self, count: u64) {
        self.preemptions += count;
    }

    /// Verifies `drafts` drafts of `draft_tokens` tokens, accepting `accepted` (the
    /// `vllm:spec_decode_*` counters appear from the first call on, as vLLM registers them
    /// only with a speculative config).
    pub fn speculate(&mut self, drafts: u64, draft_tokens: u64, accepted: u64) {
        let (d, t, a) = self.spec_decode.unwrap_or_default();
        self.spec_decode = Some((d + drafts, t + draft_tokens, a + accepted));
    }

    fn labels(&self) -> String {
        format!(
            "model_name=\"{}\",engine=\"{}\"",
            self.model_name, self.engine
        )
    }
}

/// Builds the `/metrics` text of a vLLM server with one or more (model, engine) series.
#[derive(Debug, Clone)]
pub struct MetricsDumpBuilder {
    engines: Vec<EngineMetrics>,
    max_model_len: u32,
    created: f64,
    scrapes: u64,
}

impl MetricsDumpBuilder {
    pub fn new(model_name: &str) -> Self {
        Self::with_max_model_len(model_name, 8192)
    }

    pub fn with_max_model_len(model_name: &str, max_model_len: u32) -> Self {
        Self {
            engines: vec![EngineMetrics::new(model_name, "0", max_model_len)],
            max_model_len,
            created: 1_763_780_000.123,
            scrapes: 0,
        }
    }

    /// Adds another (model, engine) series set.
    pub fn add_engine(mut self, model_name: &str, engine: &str) -> Self {
        self.engines
            .push(EngineMetrics::new(model_name, engine, self.max_model_len));
        self
    }

    /// Sets the KV-cache configuration of every engine.
    pub fn cache_config(
        mut self,
        block_size: u32,
        num_gpu_blocks: u32,
        prefix_caching: bool,
    ) -> Self {
        for engine in &mut self.engines {
            engine.block_size = block_size;
            engine.num_gpu_blocks = num_gpu_blocks;
            engine.prefix_caching = prefix_caching;
        }
        self
    }

    pub fn engine(&mut self, index: usize) -> &mut EngineMetrics {
        &mut self.engines[index]
    }

    /// Finished requests on the first engine.
    pub fn complete(&mut self, count: u64, shape: RequestShape) -> &mut Self {
        self.engines[0].complete(count, shape);
        self
    }

    pub fn set_gauges(&mut self, gauges: Gauges) -> &mut Self {
        self.engines[0].gauges = gauges;
        self
    }

    pub fn render(&mut self) -> String {
        self.scrapes += 1;
        let mut out = String::new();
        self.render_process(&mut out);
        self.render_gauge(
            &mut out,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            |e| e.gauges.running,
        );
        self.render_gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            |e| e.gauges.waiting,
        );
        self.render_gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            |e| e.gauges.kv_usage,
        );
        self.render_counter(
            &mut out,
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            |e| e.prefix_queries,
        );
        self.render_counter(
            &mut out,
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            |e| e.prefix_hits,
        );
        self.render_counter(
            &mut out,
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            |e| e.preemptions,
        );
        self.render_counter(
            &mut out,
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            |e| e.prompt_tokens,
        );
        self.render_counter(
            &mut out,
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            |e| e.generation_tokens,
        );
        self.render_success(&mut out);
        if self.engines.iter().any(|e| e.spec_decode.is_some()) {
            for (name, help, index) in [
                (
                    "vllm:spec_decode_num_drafts",
                    "Number of spec decoding drafts.",
                    0,
                ),
                (
                    "vllm:spec_decode_num_draft_tokens",
                    "Number of draft tokens.",
                    1,
                ),
                (
                    "vllm:spec_decode_num_accepted_tokens",
                    "Number of accepted tokens.",
                    2,
                ),
            ] {
                self.render_counter(&mut out, name, help, |e| {
                    e.spec_decode
                        .map_or(0, |counts| [counts.0, counts.1, counts.2][index])
                });
            }
        }
        for &(name, help) in HISTOGRAMS {
            self.render_histogram(&mut out, name, help);
        }
        self.render_cache_config(&mut out);
        out
    }

    fn render_process(&self, out: &mut String) {
        let scrapes = self.scrapes as f64;
        let _ = write!(
            out,
            "# HELP python_gc_objects_collected_total Objects collected during gc\n\
             # TYPE python_gc_objects_collected_total counter\n\
             python_gc_objects_collected_total{{generation=\"0\"}} {}\n\
             python_gc_objects_collected_total{{generation=\"1\"}} 1204.0\n\
             python_gc_objects_collected_total{{generation=\"2\"}} 93.0\n\
             # HELP python_info Python platform information\n\
             # TYPE python_info gauge\n\
             python_info{{implementation=\"CPython\",major=\"3\",minor=\"12\",patchlevel=\"3\",version=\"3.12.3\"}} 1.0\n\
             # HELP process_virtual_memory_bytes Virtual memory size in bytes.\n\
             # TYPE process_virtual_memory_bytes gauge\n\
             process_virtual_memory_bytes 5.1253248e+010\n\
             # HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
             # TYPE process_cpu_seconds_total counter\n\
             process_cpu_seconds_total {}\n\
             # HELP process_open_fds Number of open file descriptors.\n\
             # TYPE process_open_fds gauge\n\
             process_open_fds 71.0\n\
             # HELP http_requests_total Total number of requests by method, status and handler.\n\
             # TYPE http_requests_total counter\n\
             http_requests_total{{handler=\"/v1/chat/completions\",method=\"POST\",status=\"2xx\"}} 42.0\n\
             # HELP http_requests_created Total number of requests by method, status and handler.\n\
             # TYPE http_requests_created gauge\n\
             http_requests_created{{handler=\"/v1/chat/completions\",method=\"POST\",status=\"2xx\"}} 1.7637800017e+09\n",
            python_float(13_000.0 + scrapes * 17.0),
            python_float(120.5 + scrapes),
        );
    }

    fn render_gauge(
        &self,
        out: &mut String,
        name: &str,
        help: &str,
        value: impl Fn(&EngineMetrics) -> f64,
    ) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for engine in &self.engines {
            let _ = writeln!(
                out,
                "{name}{{{}}} {}",
                engine.labels(),
                python_float(value(engine))
            );
        }
    }

    fn render_counter(
        &self,
        out: &mut String,
        name: &str,
        help: &str,
        value: impl Fn(&EngineMetrics) -> u64,
    ) {
        let _ = writeln!(
            out,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter"
        );
        for engine in &self.engines {
            let _ = writeln!(
                out,
                "{name}_total{{{}}} {}",
                engine.labels(),
                python_float(value(engine) as f64)
            );
        }
        let _ = writeln!(
            out,
            "# HELP {name}_created {help}\n# TYPE {name}_created gauge"
        );
        for engine in &self.engines {
            let _ = writeln!(
                out,
                "{name}_created{{{}}} {}",
                engine.labels(),
                python_float(self.created)
            );
        }
    }

    fn render_success(&self, out: &mut String) {
        let name = "vllm:request_success";
        let _ = writeln!(out, "# HELP {name}_total Count of successfully processed requests.\n# TYPE {name}_total counter");
        for engine in &self.engines {
            for (reason, count) in &engine.success {
                let _ = writeln!(
                    out,
                    "{name}_total{{{},finished_reason=\"{reason}\"}} {}",
                    engine.labels(),
                    python_float(*count as f64)
                );
            }
        }
    }

    fn render_histogram(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for engine in &self.engines {
            let histogram = &engine.histograms[name];
            let labels = engine.labels();
            let mut cumulative = 0;
            for (index, count) in histogram.counts.iter().enumerate() {
                cumulative += count;
                let bound = histogram
                    .bounds
                    .get(index)
                    .copied()
                    .unwrap_or(f64::INFINITY);
                let _ = writeln!(
                    out,
                    "{name}_bucket{{{labels},le=\"{}\"}} {}",
                    python_float(bound),
                    python_float(cumulative as f64)
                );
            }
            let _ = writeln!(
                out,
                "{name}_count{{{labels}}} {}",
                python_float(histogram.count() as f64)
            );
            let _ = writeln!(
                out,
                "{name}_sum{{{labels}}} {}",
                python_float(histogram.sum)
            );
        }
        let _ = writeln!(
            out,
            "# HELP {name}_created {help}\n# TYPE {name}_created gauge"
        );
        for engine in &self.engines {
            let _ = writeln!(
                out,
                "{name}_created{{{}}} {}",
                engine.labels(),
                python_float(self.created)
            );
        }
    }

    fn render_cache_config(&self, out: &mut String) {
        let name = "vllm:cache_config_info";
        let _ = writeln!(
            out,
            "# HELP {name} Information of the LLMEngine CacheConfig\n# TYPE {name} gauge"
        );
        for engine in &self.engines {
            let _ = writeln!(
                out,
                "{name}{{block_size=\"{}\",cache_dtype=\"auto\",calculate_kv_scales=\"False\",\
                 cpu_offload_gb=\"0\",enable_prefix_caching=\"{}\",engine=\"{}\",\
                 gpu_memory_utilization=\"0.9\",is_attention_free=\"False\",\
                 num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",num_gpu_blocks_override=\"None\",\
                 prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\",swap_space=\"4\",\
                 swap_space_bytes=\"4294967296\"}} 1.0",
                engine.block_size,
                if engine.prefix_caching {
                    "True"
                } else {
                    "False"
                },
                engine.engine,
                engine.num_gpu_blocks,
            );
        }
    }
}

/// One observation window: the scrape at its start, those in between, the one at its end.
pub struct WindowDumps {
    pub before: String,
    pub samples: Vec<String>,
    pub after: String,
    pub elapsed: Duration,
}

impl WindowDumps {
    pub fn parse(&self) -> (Scrape, Vec<Scrape>, Scrape) {
        let parse = |text: &str| Scrape::parse(text).expect("builder output parses");
        (
            parse(&self.before),
            self.samples.iter().map(|text| parse(text)).collect(),
            parse(&self.after),
        )
    }

    pub fn diagnose(
        &self,
        config: &tokenmill_triage::TriageConfig,
    ) -> tokenmill_triage::TriageReport {
        let (before, samples, after) = self.parse();
        tokenmill_triage::diagnose(&before, &after, &samples, self.elapsed, config)
    }
}

/// Plays a window on the first engine: one scrape per entry of `gauges` (the first is the
/// window's start, the last its end), with `per_interval` requests of `shape` finishing and
/// `preemptions_per_interval` preemptions between consecutive scrapes.
pub fn play_window(
    builder: &mut MetricsDumpBuilder,
    window: Duration,
    gauges: &[Gauges],
    per_interval: u64,
    shape: RequestShape,
    preemptions_per_interval: u64,
) -> WindowDumps {
    assert!(
        gauges.len() >= 2,
        "a window needs a start and an end scrape"
    );
    builder.set_gauges(gauges[0]);
    let before = builder.render();
    let mut scrapes = Vec::new();
    for &point in &gauges[1..] {
        builder.complete(per_interval, shape);
        builder.engine(0).preempt(preemptions_per_interval);
        builder.set_gauges(point);
        scrapes.push(builder.render());
    }
    let after = scrapes.pop().expect("at least one scrape after the start");
    WindowDumps {
        before,
        samples: scrapes,
        after,
        elapsed: window,
    }
}
