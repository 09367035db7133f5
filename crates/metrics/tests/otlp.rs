//! The OTLP exporter against a local receiver: it POSTs OTLP/HTTP JSON to `/v1/traces` with
//! one span per recorded request and the GenAI attributes, flushes on shutdown, and drops
//! (and counts) spans instead of blocking when the collector is slow.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;
use tokenmill_metrics::{
    FinishedReason, FinishedRequestMetrics, OtlpConfig, OtlpExportStats, OtlpTraceExporter,
    RequestSpan,
};

/// One POST the receiver saw.
#[derive(Debug, Clone)]
struct Post {
    path: String,
    content_type: String,
    body: Value,
}

/// A tiny OTLP/HTTP receiver: records each POST (before answering 200), and optionally holds
/// every answer until the test releases it.
struct Collector {
    endpoint: String,
    posts: Arc<Mutex<Vec<Post>>>,
    /// One message per POST received, sent before the answer.
    arrived: Receiver<()>,
}

fn start_receiver(gate: Option<Receiver<()>>) -> Collector {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let posts = Arc::new(Mutex::new(Vec::new()));
    let (arrived_tx, arrived) = channel();
    let recorded = Arc::clone(&posts);
    let gate = gate.map(|gate| Arc::new(Mutex::new(gate)));
    std::thread::spawn(move || {
        // A thread per connection, so a held answer never hides a later POST.
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (recorded, arrived_tx, gate) =
                (Arc::clone(&recorded), arrived_tx.clone(), gate.clone());
            std::thread::spawn(move || serve_one(stream, &recorded, &arrived_tx, gate.as_deref()));
        }
    });
    Collector {
        endpoint,
        posts,
        arrived,
    }
}

fn serve_one(
    mut stream: TcpStream,
    posts: &Mutex<Vec<Post>>,
    arrived: &Sender<()>,
    gate: Option<&Mutex<Receiver<()>>>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    let mut parts = request_line.split_whitespace();
    assert_eq!(parts.next(), Some("POST"), "{request_line}");
    let path = parts.next().unwrap().to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = headers["content-length"].parse().unwrap();
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    posts.lock().unwrap().push(Post {
        path,
        content_type: headers.get("content-type").cloned().unwrap_or_default(),
        body: serde_json::from_slice(&body).unwrap(),
    });
    let _ = arrived.send(());
    if let Some(gate) = gate {
        let _ = gate.lock().unwrap().recv();
    }
    let _ = stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    );
}

fn span(request_id: u64, reason: FinishedReason, prompt: u64, generated: u64) -> RequestSpan {
    let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    RequestSpan {
        request_id,
        start,
        end: start + Duration::from_millis(250),
        time_to_first_token: Some(0.05),
        finished: FinishedRequestMetrics {
            finish_reason: reason,
            num_prompt_tokens: prompt,
            num_generation_tokens: generated,
            max_tokens_param: Some(generated as u32),
            n_param: 1,
            e2e_latency: 0.25,
            queue_time: 0.01,
            prefill_time: 0.04,
            decode_time: 0.2,
            inference_time: 0.24,
            mean_time_per_output_token: Some(0.02),
        },
    }
}

/// `key` → OTLP `AnyValue` of a span's attributes.
fn attributes(span: &Value) -> BTreeMap<String, Value> {
    span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["key"].as_str().unwrap().to_string(), a["value"].clone()))
        .collect()
}

/// Every span of every POST.
fn all_spans(posts: &[Post]) -> Vec<Value> {
    posts
        .iter()
        .flat_map(|post| {
            post.body["resourceSpans"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|rs| rs["scopeSpans"].as_array().unwrap().clone())
                .flat_map(|ss| ss["spans"].as_array().unwrap().clone())
        })
        .collect()
}

#[test]
fn spans_are_posted_as_otlp_json_with_the_genai_attributes() {
    let receiver = start_receiver(None);
    let exporter =
        OtlpTraceExporter::start(OtlpConfig::new(&receiver.endpoint, "tm-model")).unwrap();
    exporter.record(span(1, FinishedReason::Length, 12, 5));
    exporter.record(span(2, FinishedReason::Stop, 7, 3));
    exporter.record(span(3, FinishedReason::Abort, 9, 1));
    let stats = exporter.shutdown();
    assert_eq!(
        stats,
        OtlpExportStats {
            exported: 3,
            dropped: 0,
            failed: 0
        }
    );

    let posts = receiver.posts.lock().unwrap().clone();
    assert!(!posts.is_empty());
    for post in &posts {
        assert_eq!(post.path, "/v1/traces");
        assert_eq!(post.content_type, "application/json");
        let resource = &post.body["resourceSpans"][0]["resource"]["attributes"][0];
        assert_eq!(resource["key"], "service.name");
        assert_eq!(resource["value"]["stringValue"], "tokenmill");
    }
    let spans = all_spans(&posts);
    assert_eq!(spans.len(), 3);
    let mut trace_ids = Vec::new();
    for (expected_id, (reason, prompt, generated)) in [
        ("1", ("length", 12, 5)),
        ("2", ("stop", 7, 3)),
        ("3", ("abort", 9, 1)),
    ] {
        let span = spans
            .iter()
            .find(|s| attributes(s)["gen_ai.request.id"]["stringValue"] == expected_id)
            .unwrap_or_else(|| panic!("no span for request {expected_id}"));
        assert_eq!(span["name"], "llm_request");
        assert_eq!(span["kind"], 2);
        let trace_id = span["traceId"].as_str().unwrap();
        let span_id = span["spanId"].as_str().unwrap();
        assert_eq!(trace_id.len(), 32);
        assert_eq!(span_id.len(), 16);
        assert!(trace_id.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(span_id.chars().all(|c| c.is_ascii_hexdigit()));
        trace_ids.push(trace_id.to_string());
        assert_eq!(span["startTimeUnixNano"], "1700000000000000000");
        assert_eq!(span["endTimeUnixNano"], "1700000000250000000");
        assert!(span.get("status").is_none());

        let attrs = attributes(span);
        assert_eq!(attrs["gen_ai.request.model"]["stringValue"], "tm-model");
        assert_eq!(attrs["gen_ai.response.model"]["stringValue"], "tm-model");
        assert_eq!(
            attrs["gen_ai.usage.input_tokens"]["intValue"],
            prompt.to_string()
        );
        assert_eq!(
            attrs["gen_ai.usage.output_tokens"]["intValue"],
            generated.to_string()
        );
        assert_eq!(
            attrs["gen_ai.request.max_tokens"]["intValue"],
            generated.to_string()
        );
        assert_eq!(
            attrs["gen_ai.response.finish_reasons"]["arrayValue"]["values"][0]["stringValue"],
            reason
        );
        for (key, value) in [
            ("gen_ai.latency.time_to_first_token", 0.05),
            ("gen_ai.latency.time_in_queue", 0.01),
            ("gen_ai.latency.e2e", 0.25),
            ("gen_ai.latency.time_in_model_prefill", 0.04),
            ("gen_ai.latency.time_in_model_decode", 0.2),
        ] {
            assert_eq!(attrs[key]["doubleValue"].as_f64(), Some(value), "{key}");
        }
    }
    trace_ids.sort();
    trace_ids.dedup();
    assert_eq!(trace_ids.len(), 3, "each request is its own trace");
}

#[test]
fn a_full_endpoint_path_is_used_as_is_and_partial_batches_flush_on_time() {
    let receiver = start_receiver(None);
    let mut config = OtlpConfig::new(format!("{}/v1/traces", receiver.endpoint), "m");
    config.flush_interval = Duration::from_millis(50);
    let exporter = OtlpTraceExporter::start(config).unwrap();
    exporter.record(span(1, FinishedReason::Stop, 1, 1));
    // The exporter is still alive: only the flush interval can have sent this batch.
    receiver
        .arrived
        .recv_timeout(Duration::from_secs(10))
        .expect("the partial batch was flushed on time");
    assert_eq!(receiver.posts.lock().unwrap()[0].path, "/v1/traces");
    assert_eq!(exporter.shutdown().exported, 1);
}

#[test]
fn a_slow_collector_makes_the_exporter_drop_and_count_spans_not_block() {
    let (release, gate) = channel();
    let receiver = start_receiver(Some(gate));
    let mut config = OtlpConfig::new(&receiver.endpoint, "m");
    config.queue_capacity = 2;
    config.max_batch = 1;
    let exporter = OtlpTraceExporter::start(config).unwrap();

    // The worker takes span 1 and waits on the held POST, so the queue holds exactly two.
    exporter.record(span(1, FinishedReason::Stop, 1, 1));
    receiver
        .arrived
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    let started = std::time::Instant::now();
    for id in 2..=5 {
        exporter.record(span(id, FinishedReason::Stop, 1, 1));
    }
    assert!(started.elapsed() < Duration::from_secs(1), "record blocked");
    assert_eq!(exporter.stats().dropped, 2);

    for _ in 0..3 {
        release.send(()).unwrap();
    }
    let stats = exporter.shutdown();
    assert_eq!(
        stats,
        OtlpExportStats {
            exported: 3,
            dropped: 2,
            failed: 0
        }
    );
    let spans = all_spans(&receiver.posts.lock().unwrap());
    let ids: Vec<&str> = spans
        .iter()
        .map(|s| {
            s["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["key"] == "gen_ai.request.id")
                .unwrap()["value"]["stringValue"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, ["1", "2", "3"]);
}

#[test]
fn an_unreachable_collector_counts_failed_spans_and_still_shuts_down() {
    // Bind then drop: nothing listens on this port any more.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = OtlpConfig::new(format!("http://127.0.0.1:{port}"), "m");
    config.max_batch = 1;
    let exporter = OtlpTraceExporter::start(config).unwrap();
    for id in 1..=3 {
        exporter.record(span(id, FinishedReason::Stop, 1, 1));
    }
    let stats = exporter.shutdown();
    assert_eq!(stats.exported, 0);
    assert_eq!(stats.failed, 3);
}

#[test]
fn a_hanging_collector_gets_no_more_posts_once_shutdown_began() {
    // The gate is never opened: every POST hangs until the client times out.
    let (_never_released, gate) = channel();
    let receiver = start_receiver(Some(gate));
    let mut config = OtlpConfig::new(&receiver.endpoint, "m");
    config.max_batch = 1;
    config.timeout = Duration::from_secs(2);
    let exporter = OtlpTraceExporter::start(config).unwrap();
    exporter.record(span(1, FinishedReason::Stop, 1, 1));
    receiver
        .arrived
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    exporter.record(span(2, FinishedReason::Stop, 1, 1));
    exporter.record(span(3, FinishedReason::Stop, 1, 1));
    // Shutdown starts while POST 1 hangs; after it times out, spans 2 and 3 are given up
    // without a connection each, so shutdown costs one timeout, not three.
    let stats = exporter.shutdown();
    assert_eq!(stats.exported, 0);
    assert_eq!(stats.failed, 3);
    assert_eq!(receiver.posts.lock().unwrap().len(), 1);
}

#[test]
fn a_non_http_endpoint_is_refused() {
    assert!(OtlpTraceExporter::start(OtlpConfig::new("localhost:4318", "m")).is_err());
}
