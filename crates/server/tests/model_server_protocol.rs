//! Conformance with the Gateway API Inference Extension's model-server protocol (proposal
//! 003) and what llm-d's scorers read: `/metrics` is parsed as the endpoint picker parses it
//! (Prometheus text, one family per `# TYPE`, looked up by exact name, gauge values and label
//! values read from the family's sample), over a live in-process server. Renaming a metric,
//! changing its type or renaming a label the picker reads fails here; the mapping is documented
//! in deploy/README.md.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use common::{json_request, TestApp, MODEL_NAME};
use serde_json::json;
use tokenmill_triage::exposition::{MetricType, Sample, Scrape};

/// The gauges the picker's scorers read: TotalQueuedRequests, TotalRunningRequests and
/// KVCacheUtilization in the protocol's terms.
const QUEUED: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// The optional BlockSize and NumGPUBlocks, read from this info gauge's labels.
const CACHE_CONFIG: &str = "vllm:cache_config_info";
/// The LoRA affinity gauge; pending until tokenmill serves adapters, checked if present.
const LORA: &str = "vllm:lora_requests_info";
const LORA_LABELS: [&str; 3] = ["max_lora", "running_lora_adapters", "waiting_lora_adapters"];

/// What the picker takes from one scrape.
#[derive(Debug, Clone, PartialEq)]
struct PickerReading {
    queued: f64,
    running: f64,
    kv_usage: f64,
    block_size: usize,
    num_gpu_blocks: usize,
}

/// Reads a `/metrics` body as the endpoint picker does, or says which part of the protocol it
/// breaks. Every engine series must carry `model_name` and `engine`, as vLLM's do.
fn read_as_endpoint_picker(text: &str) -> Result<PickerReading, String> {
    check_families_are_contiguous(text)?;
    let scrape = Scrape::parse(text).map_err(|err| format!("not Prometheus text: {err}"))?;
    let queued = gauge_value(&scrape, QUEUED)?;
    let running = gauge_value(&scrape, RUNNING)?;
    let kv_usage = gauge_value(&scrape, KV_USAGE)?;
    if !(0.0..=1.0).contains(&kv_usage) {
        return Err(format!("{KV_USAGE} is a fraction, read {kv_usage}"));
    }
    let info = gauge_sample(&scrape, CACHE_CONFIG)?;
    let label_number = |label: &str| -> Result<usize, String> {
        let value = info
            .labels
            .get(label)
            .ok_or_else(|| format!("{CACHE_CONFIG} has no `{label}` label"))?;
        value
            .parse()
            .map_err(|_| format!("{CACHE_CONFIG}{{{label}={value:?}}} is not an integer"))
    };
    let reading = PickerReading {
        queued,
        running,
        kv_usage,
        block_size: label_number("block_size")?,
        num_gpu_blocks: label_number("num_gpu_blocks")?,
    };
    if scrape.family(LORA).is_some() {
        let lora = gauge_sample(&scrape, LORA)?;
        for label in LORA_LABELS {
            if lora.labels.get(label).is_none() {
                return Err(format!("{LORA} has no `{label}` label"));
            }
        }
    }
    Ok(reading)
}

/// The picker's Go parser rejects a family declared twice or split by another family; the
/// triage parser is lenient there, so the layout is checked on the raw lines.
fn check_families_are_contiguous(text: &str) -> Result<(), String> {
    let mut closed: HashSet<&str> = HashSet::new();
    let mut current: Option<&str> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_whitespace().next().unwrap_or_default();
            if let Some(previous) = current.replace(name) {
                closed.insert(previous);
            }
            if closed.contains(name) {
                return Err(format!("{name} is declared twice"));
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let sample = line.split(['{', ' ']).next().unwrap_or_default();
            if closed.contains(sample) {
                return Err(format!("a {sample} sample outside its family"));
            }
        }
    }
    Ok(())
}

/// The one sample of gauge family `name` (exact name, no suffix) with the engine labels.
fn gauge_sample<'a>(scrape: &'a Scrape, name: &str) -> Result<&'a Sample, String> {
    let family = scrape
        .family(name)
        .ok_or_else(|| format!("no `# TYPE {name}` family"))?;
    if family.kind != MetricType::Gauge {
        return Err(format!(
            "{name} is {:?}, the protocol says gauge",
            family.kind
        ));
    }
    let samples: Vec<&Sample> = family.samples.iter().filter(|s| s.name == name).collect();
    let [sample] = samples.as_slice() else {
        return Err(format!("{name}: {} samples, expected one", samples.len()));
    };
    for (label, expected) in [("model_name", MODEL_NAME), ("engine", "0")] {
        if sample.labels.get(label) != Some(expected) {
            return Err(format!("{name} lacks {label}={expected:?}: {sample:?}"));
        }
    }
    Ok(sample)
}

fn gauge_value(scrape: &Scrape, name: &str) -> Result<f64, String> {
    let value = gauge_sample(scrape, name)?.value;
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(format!("{name} reads {value}"))
    }
}

/// Scrapes until `accept` holds for the reading (the gauges move once per engine step).
async fn scrape_until(
    app: &TestApp,
    what: &str,
    accept: impl Fn(&PickerReading) -> bool,
) -> PickerReading {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, text) = app.get("/metrics").await;
        assert_eq!(status, StatusCode::OK);
        let reading = read_as_endpoint_picker(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        if accept(&reading) {
            return reading;
        }
        assert!(Instant::now() < deadline, "never saw {what}: {reading:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_picker_reads_every_protocol_metric_of_an_idle_server() {
    let app = TestApp::start();
    // The inference API half of the protocol: completions and chat under the served name.
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}],
                   "max_tokens": 1}),
        ),
    ] {
        let (status, body) = app.post_json(path, &body).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let stats = app.wait_idle().await;
    let reading = scrape_until(&app, "an idle engine", |r| r.running == 0.0).await;
    assert_eq!(
        reading,
        PickerReading {
            queued: 0.0,
            running: 0.0,
            kv_usage: 0.0,
            block_size: 16,
            num_gpu_blocks: stats.num_blocks,
        }
    );
    let (_, text) = app.get("/metrics").await;
    let scrape = Scrape::parse(&text).unwrap();
    assert_eq!(
        gauge_sample(&scrape, CACHE_CONFIG).unwrap().value,
        1.0,
        "an info gauge reads 1"
    );
}

/// The gauges mean what the scorers assume: with one sequence slot, a second request queues
/// behind the first, both are counted, the first holds KV blocks, and all return to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_running_and_kv_gauges_follow_the_engine() {
    let app = TestApp::with_engine_config(|engine| engine.max_num_seqs = 1, |_| {});
    let body = json!({"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": true,
                      "stream": true});
    // The streams are held unread; the engine generates into their channels meanwhile.
    let first = app
        .send(json_request(Method::POST, "/v1/completions", &body, None))
        .await;
    let second = app
        .send(json_request(Method::POST, "/v1/completions", &body, None))
        .await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);
    let busy = scrape_until(&app, "one running and one queued", |r| {
        r.running == 1.0 && r.queued == 1.0
    })
    .await;
    assert!(
        busy.kv_usage > 0.0,
        "a running request holds blocks: {busy:?}"
    );
    drop((first, second));
    app.wait_idle().await;
    scrape_until(&app, "the gauges back at zero", |r| {
        r.running == 0.0 && r.queued == 0.0 && r.kv_usage == 0.0
    })
    .await;
}

/// The reader is not vacuous: each way a future change could break the picker is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_retyped_or_relabelled_metrics_break_the_reading() {
    let app = TestApp::start();
    let (_, text) = app.get("/metrics").await;
    read_as_endpoint_picker(&text).expect("the real scrape conforms");
    let lora = "# TYPE vllm:lora_requests_info gauge\n\
                vllm:lora_requests_info{model_name=\"tm-test\",engine=\"0\",max_lora=\"1\",\
                running_lora_adapters=\"\"} 1.0\n";
    let broken = [
        ("renamed", text.replace(QUEUED, "vllm:num_requests_queued")),
        (
            "retyped",
            text.replace(
                &format!("# TYPE {RUNNING} gauge"),
                &format!("# TYPE {RUNNING} counter"),
            ),
        ),
        (
            "label renamed",
            text.replace("block_size=", "tokens_per_block="),
        ),
        (
            "engine label dropped",
            text.replace("engine=\"0\"", "replica=\"0\""),
        ),
        (
            "not a number",
            text.replace("num_gpu_blocks=\"", "num_gpu_blocks=\"x"),
        ),
        (
            "family split",
            format!("{text}{KV_USAGE}{{model_name=\"{MODEL_NAME}\",engine=\"0\"}} 0.5\n"),
        ),
        ("incomplete LoRA gauge", format!("{text}{lora}")),
    ];
    for (case, text) in broken {
        assert!(
            read_as_endpoint_picker(&text).is_err(),
            "{case}: still read as conforming"
        );
    }
}
