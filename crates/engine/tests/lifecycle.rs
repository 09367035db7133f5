//! Every exit path frees the request's blocks (architecture invariant 4), and engine errors
//! reach callers instead of hanging them.

mod common;

use common::{config, greedy, prompts, wait_idle};
use tokenmill_engine::{Engine, FinishReason, RequestEvent};

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
                Some(RequestEvent::Error(e)) => panic!("request {i} failed: {e}"),
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
fn a_request_that_does_not_fit_the_context_gets_an_error_event() {
    let engine = Engine::start(&config(64, 64)).unwrap();
    let mut stream = engine
        .client()
        .add_request(greedy(vec![500; 80], 4))
        .unwrap();
    match stream.blocking_recv() {
        Some(RequestEvent::Error(message)) => assert!(message.contains("64"), "{message}"),
        other => panic!("expected an error event, got {other:?}"),
    }
    assert!(engine.client().is_alive());
}
