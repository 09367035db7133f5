//! `EngineConfig::otlp_traces_endpoint`: the engine exports one OTLP span per finished request
//! to a local OTLP/HTTP receiver, with the request's real token counts and finish reason.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use common::{config, greedy, prompts, run_all};
use serde_json::Value;
use tokenmill_engine::{Engine, FinishReason};

/// `(path, body)` of each POST the receiver saw.
type Posts = Arc<Mutex<Vec<(String, Value)>>>;

/// Accepts OTLP/HTTP POSTs on 127.0.0.1 and keeps `(path, body)` of each; the body is
/// recorded before the 200 goes out, so once the exporter has flushed, it is here.
fn start_receiver() -> (String, Posts) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let posts = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&posts);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            serve_one(stream, &recorded);
        }
    });
    (endpoint, posts)
}

fn serve_one(mut stream: TcpStream, posts: &Mutex<Vec<(String, Value)>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    let path = request_line.split_whitespace().nth(1).unwrap().to_string();
    let mut content_length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body).unwrap();
    posts
        .lock()
        .unwrap()
        .push((path, serde_json::from_slice(&body).unwrap()));
    let _ =
        stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
}

fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
        .unwrap_or_else(|| panic!("span has no {key}: {span}"))
}

#[test]
fn three_requests_give_three_spans_with_their_token_counts() {
    let (endpoint, posts) = start_receiver();
    let mut config = config(256, 256);
    config.served_model_name = "tm-trace".into();
    config.otlp_traces_endpoint = Some(endpoint);
    let engine = Engine::start(&config).unwrap();
    let client = engine.client();
    let before = SystemTime::now();

    let prompts = prompts(3, 11);
    let requests = prompts.iter().map(|p| greedy(p.clone(), 4)).collect();
    let outputs = run_all(&client, requests);
    for output in &outputs {
        assert_eq!(output.finish_reason, Some(FinishReason::Length));
        assert_eq!(output.token_ids.len(), 4);
    }
    // Shutting down flushes the exporter before the engine thread ends.
    engine.shutdown();
    let after = SystemTime::now();

    let posts = posts.lock().unwrap();
    let spans: Vec<&Value> = posts
        .iter()
        .inspect(|(path, _)| assert_eq!(path, "/v1/traces"))
        .flat_map(|(_, body)| body["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array())
        .flatten()
        .collect();
    assert_eq!(spans.len(), 3, "one span per request: {posts:?}");

    let nanos = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let mut by_prompt_len: BTreeMap<String, usize> = BTreeMap::new();
    for span in &spans {
        assert_eq!(span["name"], "llm_request");
        assert_eq!(span["kind"], 2);
        assert_eq!(
            attribute(span, "gen_ai.request.model")["stringValue"],
            "tm-trace"
        );
        assert_eq!(
            attribute(span, "gen_ai.usage.output_tokens")["intValue"],
            "4"
        );
        assert_eq!(
            attribute(span, "gen_ai.request.max_tokens")["intValue"],
            "4"
        );
        assert_eq!(
            attribute(span, "gen_ai.response.finish_reasons")["arrayValue"]["values"][0]
                ["stringValue"],
            "length"
        );
        let ttft = attribute(span, "gen_ai.latency.time_to_first_token")["doubleValue"]
            .as_f64()
            .unwrap();
        let e2e = attribute(span, "gen_ai.latency.e2e")["doubleValue"]
            .as_f64()
            .unwrap();
        let queue = attribute(span, "gen_ai.latency.time_in_queue")["doubleValue"]
            .as_f64()
            .unwrap();
        assert!(0.0 <= queue && queue <= ttft && ttft <= e2e, "{span}");
        let start: u128 = span["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u128 = span["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        // Requests were built after `before`; the slack covers the monotonic-to-wall mapping.
        assert!(start + 1_000_000_000 >= nanos(before), "{span}");
        assert!(start <= end && end <= nanos(after), "{span}");
        let id = attribute(span, "gen_ai.request.id")["stringValue"]
            .as_str()
            .unwrap()
            .to_string();
        let input: usize = attribute(span, "gen_ai.usage.input_tokens")["intValue"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        by_prompt_len.insert(id, input);
    }
    // Requests are numbered from 1 in submission order.
    let expected: BTreeMap<String, usize> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| ((i + 1).to_string(), p.len()))
        .collect();
    assert_eq!(by_prompt_len, expected);
}
