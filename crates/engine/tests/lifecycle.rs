//! Every exit path frees the request's blocks (architecture invariant 4) and is counted once
//! under its own reason, and engine errors reach callers instead of hanging them. (An engine
//! error's finish is tested with a failing executor in `core_loop.rs`.)

#![allow(clippy::panic, clippy::unwrap_used)] // test helpers

mod common;

use common::{config, greedy, prompts, run_all, samples, value, wait_idle};
use tokenmill_engine::{
    Engine, EngineClient, EngineStats, FinishReason, RequestEvent, RequestOutput, RequestStream,
};
use tokenmill_metrics::EngineMetrics;

#[test]
fn five_hundred_requests_with_a_fifth_aborted_leave_no_blocks_held() {
    let mut config = config(256, 256);
    config.max_num_seqs = 32;
    let engine = Engine::start(&config).unwrap();
    let client = engine.client();
    let prompts = prompts(500, 3);
    let mut streams: Vec<_> = prompts
        .iter()
        .map(|p| client.add_request(greedy(p.clone(), 6)).unwrap())
        .collect();
    let mut aborted = 0;
    let mut finished = 0;
    for (i, stream) in streams.drain(..).enumerate() {
        let mut stream = stream;
        if i % 5 == 2 {
            // Abort mid-generation: wait for the first token, then drop the stream.
            match stream.blocking_recv() {
                Some(RequestEvent::Output(_)) | None => {}
                Some(RequestEvent::Rejected(e) | RequestEvent::Error(e)) => {
                    panic!("request {i} failed: {e}")
                }
                Some(RequestEvent::Failed(failure)) => panic!("request {i} failed: {failure:?}"),
            }
            drop(stream);
            aborted += 1;
            continue;
        }
        while let Some(event) = stream.blocking_recv() {
            if let RequestEvent::Output(o) = event {
                if o.finish_reason.is_some() {
                    assert_eq!(o.finish_reason, Some(FinishReason::Length));
                    finished += 1;
                }
            }
        }
    }
    assert_eq!((aborted, finished), (100, 400));
    let stats = wait_idle(&client);
    assert_eq!(stats.num_running + stats.num_waiting, 0);
    assert_eq!(
        stats.kv_cache_usage, 0.0,
        "blocks held outside the prefix cache: {stats:?}"
    );
    assert_eq!(stats.num_free_blocks, stats.num_blocks);
    engine.shutdown();
}

#[test]
fn a_request_that_does_not_fit_the_context_is_rejected() {
    let engine = Engine::start(&config(64, 64)).unwrap();
    let mut stream = engine
        .client()
        .add_request(greedy(vec![500; 80], 4))
        .unwrap();
    match stream.blocking_recv() {
        // The request's fault, not the engine's: servers answer it 400.
        Some(RequestEvent::Rejected(message)) => assert!(message.contains("64"), "{message}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(engine.client().is_alive());
}

/// vLLM's `finished_reason` labels.
const REASONS: [&str; 4] = ["stop", "length", "abort", "error"];

/// `vllm:request_success_total` per reason, in [`REASONS`] order.
fn finished_counts(metrics: &EngineMetrics) -> [f64; 4] {
    let s = samples(&metrics.encode().unwrap());
    REASONS.map(|reason| {
        value(
            &s,
            "vllm:request_success_total",
            Some(("finished_reason", reason)),
        )
    })
}

/// No block held (cached free blocks aside) and each finished counter moved by exactly the
/// one request that ended as `reason`.
fn assert_freed_and_counted_once(
    stats: &EngineStats,
    before: [f64; 4],
    after: [f64; 4],
    reason: &str,
) {
    assert_eq!(
        stats.num_running + stats.num_waiting,
        0,
        "{reason}: {stats:?}"
    );
    assert_eq!(stats.kv_cache_usage, 0.0, "{reason}: {stats:?}");
    assert_eq!(
        stats.num_free_blocks, stats.num_blocks,
        "{reason}: {stats:?}"
    );
    for ((label, was), now) in REASONS.iter().zip(before).zip(after) {
        let expected = was + if *label == reason { 1.0 } else { 0.0 };
        assert_eq!(now, expected, "{reason}: finished_reason={label}");
    }
}

/// Waits for the first delta with tokens, so the request is running and holds blocks.
fn first_tokens(stream: &mut RequestStream) {
    match stream.blocking_recv() {
        Some(RequestEvent::Output(o)) => assert!(!o.new_token_ids.is_empty(), "{o:?}"),
        other => panic!("expected a first delta, got {other:?}"),
    }
}

/// Reads the stream to its final delta.
fn last_output(stream: &mut RequestStream) -> RequestOutput {
    while let Some(event) = stream.blocking_recv() {
        match event {
            RequestEvent::Output(o) if o.finish_reason.is_some() => return o,
            RequestEvent::Output(_) => {}
            RequestEvent::Rejected(e) | RequestEvent::Error(e) => panic!("request failed: {e}"),
            RequestEvent::Failed(failure) => panic!("request failed: {failure:?}"),
        }
    }
    panic!("the stream ended without a final delta")
}

/// Runs `body` and checks it ended exactly one request, as `reason`, leaving no block held.
fn ends_one_as(metrics: &EngineMetrics, client: &EngineClient, reason: &str, body: impl FnOnce()) {
    let before = finished_counts(metrics);
    body();
    let stats = wait_idle(client);
    assert_freed_and_counted_once(&stats, before, finished_counts(metrics), reason);
}

#[test]
fn every_finish_kind_frees_the_blocks_and_is_counted_once() {
    let mut config = config(64, 256);
    config.served_model_name = "tm-test".into();
    let engine = Engine::start(&config).unwrap();
    let metrics = engine.metrics().clone();
    let client = engine.client();
    let prompt = prompts(1, 17).remove(0);

    // Length; its greedy continuation gives the stop token and stop string below.
    let mut reference = Vec::new();
    ends_one_as(&metrics, &client, "length", || {
        reference = run_all(&client, vec![greedy(prompt.clone(), 8)]);
        assert_eq!(reference[0].finish_reason, Some(FinishReason::Length));
    });
    let reference = reference.remove(0);

    ends_one_as(&metrics, &client, "stop", || {
        let mut request = greedy(prompt.clone(), 8);
        let stop_token = reference.token_ids[3];
        request.stop.stop_token_ids = vec![stop_token];
        let mut stream = client.add_request(request).unwrap();
        let last = last_output(&mut stream);
        assert_eq!(last.finish_reason, Some(FinishReason::Stop));
        assert_eq!(
            last.stop_reason,
            Some(tokenmill_engine::StopReason::Token(stop_token))
        );
    });

    ends_one_as(&metrics, &client, "stop", || {
        let chars: Vec<char> = reference.text.chars().collect();
        let middle = chars.len() / 2;
        let stop_string: String = chars[middle..(middle + 2).min(chars.len())]
            .iter()
            .collect();
        let mut request = greedy(prompt.clone(), 8);
        request.stop.stop_strings = vec![stop_string.clone()];
        let mut stream = client.add_request(request).unwrap();
        let last = last_output(&mut stream);
        assert_eq!(last.finish_reason, Some(FinishReason::Stop));
        assert_eq!(
            last.stop_reason,
            Some(tokenmill_engine::StopReason::String(stop_string))
        );
    });

    ends_one_as(&metrics, &client, "abort", || {
        let mut stream = client.add_request(greedy(prompt.clone(), 100)).unwrap();
        first_tokens(&mut stream);
        client.abort(stream.request_id());
        let last = last_output(&mut stream);
        assert_eq!(last.finish_reason, Some(FinishReason::Abort));
    });

    ends_one_as(&metrics, &client, "abort", || {
        let mut stream = client.add_request(greedy(prompt.clone(), 100)).unwrap();
        first_tokens(&mut stream);
        drop(stream);
    });

    // Shutdown with a request in flight: its stream gets the final abort delta, and the
    // engine's last stats show the blocks freed.
    let before = finished_counts(&metrics);
    let mut stream = client.add_request(greedy(prompt, 100)).unwrap();
    first_tokens(&mut stream);
    engine.shutdown();
    let last = last_output(&mut stream);
    assert_eq!(last.finish_reason, Some(FinishReason::Abort));
    assert!(!client.is_alive());
    assert_freed_and_counted_once(&client.stats(), before, finished_counts(&metrics), "abort");
}
