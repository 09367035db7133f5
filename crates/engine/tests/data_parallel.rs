//! `data_parallel_size` 2 over the real model: requests spread over both engines, greedy
//! output is what one engine gives, a repeated prefix returns to the engine that cached it,
//! and an abort reaches the engine that owns the request.

mod common;

use common::{config, greedy, run_all, wait_idle};
use tokenmill_engine::{Engine, EngineConfig, FinishReason, RequestEvent};

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| 300 + seed * 97 + i * 5).collect()
}

fn dp_config(ranks: usize) -> EngineConfig {
    let mut engine_config = config(32, 128);
    engine_config.num_threads = Some(2);
    engine_config.log_stats_interval = None;
    engine_config.data_parallel_size = ranks;
    engine_config
}

#[test]
#[allow(clippy::unwrap_used)]
fn two_engines_share_the_work_and_answer_as_one_does() {
    let prompts: Vec<Vec<u32>> = (0..4).map(|seed| prompt(seed, 20 + seed * 3)).collect();
    let requests = || prompts.iter().map(|p| greedy(p.clone(), 6)).collect();

    let single = Engine::start(&dp_config(1)).unwrap();
    let expected = run_all(&single.client(), requests());
    single.shutdown();

    let engine = Engine::start(&dp_config(2)).unwrap();
    let client = engine.client();
    assert_eq!(client.data_parallel_size(), 2);
    let outputs = run_all(&client, requests());
    for (output, expected) in outputs.iter().zip(&expected) {
        assert_eq!(output.token_ids, expected.token_ids);
        assert_eq!(output.text, expected.text);
    }
    wait_idle(&client);
    let per_engine = client.engine_stats();
    assert_eq!(per_engine.len(), 2);
    for (rank, stats) in per_engine.iter().enumerate() {
        assert_eq!(
            stats.generation_tokens, 12,
            "engine {rank} ran two requests"
        );
    }
    assert_eq!(client.stats().generation_tokens, 24);

    // Submitted together, `a` lands on engine 0 and `b` (engine 0 now busier) on engine 1.
    // Alone afterwards both engines are idle, and each prompt returns to its own engine's
    // cache; by load alone both would go to engine 0 and `b` would find nothing cached.
    let (a, b) = (prompt(10, 40), prompt(11, 40));
    run_all(&client, vec![greedy(a.clone(), 2), greedy(b.clone(), 2)]);
    wait_idle(&client);
    let before = client.engine_stats();
    let repeat_b = run_all(&client, vec![greedy(b, 2)]).remove(0);
    assert_eq!(
        repeat_b.num_cached_tokens, 32,
        "two full blocks of `b` were cached"
    );
    let after = client.engine_stats();
    assert_eq!(after[0].generation_tokens, before[0].generation_tokens);
    assert_eq!(after[1].generation_tokens, before[1].generation_tokens + 2);
    let repeat_a = run_all(&client, vec![greedy(a, 2)]).remove(0);
    assert_eq!(repeat_a.num_cached_tokens, 32);
    assert!(
        engine.metrics().encode().unwrap().contains("engine=\"1\""),
        "engine 1's series are in the scrape"
    );
}

#[test]
#[allow(clippy::unwrap_used, clippy::panic)]
fn an_abort_reaches_the_engine_that_owns_the_request() {
    let engine = Engine::start(&dp_config(2)).unwrap();
    let client = engine.client();
    let mut first = client.add_request(greedy(prompt(1, 20), 100)).unwrap();
    let mut second = client.add_request(greedy(prompt(2, 20), 100)).unwrap();
    // Ids carry their engine: the second request runs on engine 1.
    assert_eq!(second.request_id().0 % 2, 1);
    client.abort(second.request_id());
    let mut last = None;
    while let Some(event) = second.blocking_recv() {
        match event {
            RequestEvent::Output(output) => last = output.finish_reason,
            RequestEvent::Rejected(message) | RequestEvent::Error(message) => panic!("{message}"),
            RequestEvent::Failed(failure) => panic!("{failure:?}"),
        }
    }
    assert_eq!(last, Some(FinishReason::Abort));
    client.abort(first.request_id());
    while first.blocking_recv().is_some() {}
    wait_idle(&client);
    assert!(client.is_alive());
}
