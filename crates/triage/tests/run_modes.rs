//! `run`: offline over files in a temp dir, and live over HTTP against a local server that
//! answers `/metrics` with successive dumps.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::{gauges, play_window, MetricsDumpBuilder, RequestShape};
use tokenmill_triage::{Pathology, TriageArgs, TriageError, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    triage: TriageArgs,
}

fn args(argv: &[&str]) -> TriageArgs {
    let mut full = vec!["tokenmill-triage"];
    full.extend_from_slice(argv);
    Cli::try_parse_from(full).expect("arguments parse").triage
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("tokenmill-triage-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn thrashing_window() -> common::WindowDumps {
    let mut server = MetricsDumpBuilder::new("m");
    server.complete(500, RequestShape::chat());
    let thrashing = RequestShape {
        queue_s: 2.0,
        ..RequestShape::chat()
    };
    let samples = [
        gauges(60.0, 12.0, 0.97),
        gauges(64.0, 15.0, 0.99),
        gauges(64.0, 18.0, 1.0),
    ];
    play_window(
        &mut server,
        Duration::from_secs(30),
        &samples,
        20,
        thrashing,
        4,
    )
}

#[tokio::test]
async fn offline_mode_reads_saved_scrapes() {
    let dir = TempDir::new("offline");
    let dumps = thrashing_window();
    let before = dir.write("before.prom", &dumps.before);
    let middle = dir.write("middle.prom", &dumps.samples[0]);
    let after = dir.write("after.prom", &dumps.after);

    let report = tokenmill_triage::run(args(&[
        "--from",
        &before,
        "--to",
        &after,
        "--elapsed",
        "30s",
        "--sample",
        &middle,
    ]))
    .await
    .unwrap();
    assert!(
        report.pathology(Pathology::KvCacheThrashing).is_some(),
        "{report}"
    );
    assert_eq!(report.metrics.gauge_sample_count, 3);
    assert_eq!(report.metrics.window_seconds, 30.0);
    assert!(report.target.as_deref().unwrap().contains("before.prom"));

    let json: serde_json::Value = serde_json::from_str(&report.to_json().unwrap()).unwrap();
    assert_eq!(json["schema_version"], 1);
    assert_eq!(json["overall"], "problem");
    assert_eq!(json["pathologies"][0]["pathology"], "kv_cache_thrashing");
    assert_eq!(json["steps"].as_array().unwrap().len(), 5);
    assert_eq!(json["steps"][2]["step"], "kv_cache");
    assert!(json["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|rec| rec["flag"] == "--max-num-seqs" && rec["direction"] == "decrease"));
    assert_eq!(json["metrics"]["preemptions"], 8.0);
}

#[tokio::test]
async fn offline_mode_reports_bad_input() {
    let dir = TempDir::new("bad-input");
    let good = dir.write("good.prom", &thrashing_window().after);
    let broken = dir.write("broken.prom", "vllm:num_requests_running{engine=\"0\" 1\n");
    let foreign = dir.write("foreign.prom", "process_open_fds 12\n");

    let error = tokenmill_triage::run(args(&[
        "--from",
        &good,
        "--to",
        &broken,
        "--elapsed",
        "30s",
    ]))
    .await
    .unwrap_err();
    assert!(matches!(error, TriageError::Parse { .. }), "{error}");
    assert!(error.to_string().contains("line 1"), "{error}");

    let error = tokenmill_triage::run(args(&[
        "--from",
        &foreign,
        "--to",
        &foreign,
        "--elapsed",
        "30s",
    ]))
    .await
    .unwrap_err();
    assert!(matches!(error, TriageError::NoVllmMetrics), "{error}");

    let error = tokenmill_triage::run(args(&[
        "--from",
        &good,
        "--to",
        &good,
        "--elapsed",
        "30s",
        "--model-name",
        "other",
    ]))
    .await
    .unwrap_err();
    assert!(matches!(error, TriageError::UnknownModel { .. }), "{error}");

    let missing = Path::new(&dir.0).join("missing.prom").display().to_string();
    let error = tokenmill_triage::run(args(&[
        "--from",
        &missing,
        "--to",
        &good,
        "--elapsed",
        "30s",
    ]))
    .await
    .unwrap_err();
    assert!(matches!(error, TriageError::Read { .. }), "{error}");
}

/// Serves `dumps` in order, one per connection, on 127.0.0.1; answers 401 to requests without
/// `Authorization: Bearer <key>`. Returns the base URL and the count of requests served.
async fn serve_dumps(dumps: Vec<String>, key: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&served);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(read) => request.extend_from_slice(&buffer[..read]),
                }
            }
            let head = String::from_utf8_lossy(&request).to_ascii_lowercase();
            let authorised = head.contains(&format!("authorization: bearer {key}"));
            let response = if !head.starts_with("get /metrics ") {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_owned()
            } else if !authorised {
                "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_owned()
            } else {
                let index = counter.fetch_add(1, Ordering::SeqCst).min(dumps.len() - 1);
                let body = &dumps[index];
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            };
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (format!("http://{address}"), served)
}

#[tokio::test]
async fn live_mode_scrapes_across_the_window() {
    let dumps = thrashing_window();
    let mut sequence = vec![dumps.before.clone()];
    sequence.extend(dumps.samples.iter().cloned());
    sequence.push(dumps.after.clone());
    let (url, served) = serve_dumps(sequence, "secret").await;

    let report = tokenmill_triage::run(args(&[
        "--url",
        &url,
        "--window",
        "200ms",
        "--samples",
        "3",
        "--api-key",
        "secret",
    ]))
    .await
    .unwrap();
    assert_eq!(
        served.load(Ordering::SeqCst),
        3,
        "start, one in between, end"
    );
    assert_eq!(report.metrics.gauge_sample_count, 3);
    assert!(report.metrics.window_seconds >= 0.2);
    assert_eq!(
        report.target.as_deref(),
        Some(format!("{url}/metrics").as_str())
    );
    assert!(
        report.pathology(Pathology::KvCacheThrashing).is_some(),
        "{report}"
    );
    assert_eq!(report.overall, Verdict::Problem);

    let error = tokenmill_triage::run(args(&["--url", &url, "--window", "10ms", "--samples", "2"]))
        .await
        .unwrap_err();
    assert!(
        matches!(error, TriageError::Status { status: 401, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("--api-key"), "{error}");
}
