//! The engine feeds vLLM's metrics with vLLM's semantics: a known workload (completions,
//! aborts, a prefix-cache hit, preemption under a tiny pool) gives exact counter values,
//! histogram counts, idle gauges and label sets on a real scrape.

#![allow(clippy::panic)] // test helpers

mod common;

use common::{config, greedy, prompts, run_all, samples, value, wait_idle};
use tokenmill_engine::{Engine, RequestEvent};

#[test]
fn a_known_workload_gives_exact_metrics() {
    let mut config = config(256, 256);
    config.served_model_name = "tm-test".into();
    let engine = Engine::start(&config).unwrap();
    let client = engine.client();
    let prompts = prompts(8, 5);

    // Eight requests run to their length limit, one at a time.
    for prompt in &prompts {
        run_all(&client, vec![greedy(prompt.clone(), 5)]);
    }
    // A 40-token prompt, then one sharing its first 32 tokens (two full blocks): the second
    // is served those 32 tokens from the prefix cache.
    let long: Vec<u32> = (0..40).map(|i| 700 + i).collect();
    run_all(&client, vec![greedy(long.clone(), 5)]);
    let mut repeat = long[..32].to_vec();
    repeat.extend([9000, 9001, 9002]);
    let repeated = run_all(&client, vec![greedy(repeat.clone(), 5)]);
    assert_eq!(repeated[0].num_cached_tokens, 32);

    // Two requests aborted after their first token.
    for prompt in &prompts[..2] {
        let mut stream = client.add_request(greedy(prompt.clone(), 50)).unwrap();
        match stream.blocking_recv() {
            Some(RequestEvent::Output(o)) => assert!(!o.new_token_ids.is_empty()),
            other => panic!("unexpected {other:?}"),
        }
        drop(stream);
    }
    let stats = wait_idle(&client);

    let text = engine.metrics().encode().unwrap();
    let s = samples(&text);
    let all_prompts: Vec<usize> = prompts
        .iter()
        .map(Vec::len)
        .chain([long.len(), repeat.len()])
        .chain(prompts[..2].iter().map(Vec::len))
        .collect();
    let prompt_tokens: usize = all_prompts.iter().sum();

    assert_eq!(
        value(
            &s,
            "vllm:request_success_total",
            Some(("finished_reason", "length"))
        ),
        10.0
    );
    assert_eq!(
        value(
            &s,
            "vllm:request_success_total",
            Some(("finished_reason", "abort"))
        ),
        2.0
    );
    assert_eq!(
        value(
            &s,
            "vllm:request_success_total",
            Some(("finished_reason", "stop"))
        ),
        0.0
    );
    assert_eq!(
        value(&s, "vllm:prompt_tokens_total", None),
        prompt_tokens as f64
    );
    assert_eq!(
        value(&s, "vllm:generation_tokens_total", None),
        stats.generation_tokens as f64
    );
    assert!(stats.generation_tokens >= 10 * 5 + 2);
    // Hits: the 32 shared tokens, plus the full blocks of the two aborted prompts, which ran
    // before (the last prompt token is always recomputed).
    let repeat_hits: usize = prompts[..2].iter().map(|p| (p.len() - 1) / 16 * 16).sum();
    assert_eq!(
        value(&s, "vllm:prefix_cache_hits_total", None),
        (32 + repeat_hits) as f64
    );
    assert_eq!(
        value(&s, "vllm:prefix_cache_queries_total", None),
        stats.prefix_cache_queries as f64
    );
    assert_eq!(value(&s, "vllm:num_preemptions_total", None), 0.0);
    assert_eq!(
        value(&s, "vllm:time_to_first_token_seconds_count", None),
        12.0
    );
    assert_eq!(
        value(&s, "vllm:e2e_request_latency_seconds_count", None),
        12.0
    );
    assert_eq!(value(&s, "vllm:request_prompt_tokens_count", None), 12.0);
    assert_eq!(
        value(&s, "vllm:request_prompt_tokens_sum", None),
        prompt_tokens as f64
    );
    assert_eq!(
        value(&s, "vllm:request_generation_tokens_count", None),
        12.0
    );
    assert_eq!(
        value(&s, "vllm:request_queue_time_seconds_count", None),
        12.0
    );
    // Decode gaps: 4 per finished request of 5 tokens; aborted ones add what they produced.
    assert!(value(&s, "vllm:inter_token_latency_seconds_count", None) >= 40.0);
    // Idle gauges.
    assert_eq!(value(&s, "vllm:num_requests_running", None), 0.0);
    assert_eq!(value(&s, "vllm:num_requests_waiting", None), 0.0);
    assert_eq!(value(&s, "vllm:kv_cache_usage_perc", None), 0.0);
    let blocks = stats.num_blocks.to_string();
    assert_eq!(
        value(
            &s,
            "vllm:cache_config_info",
            Some(("num_gpu_blocks", blocks.as_str()))
        ),
        1.0
    );
    assert_eq!(
        value(&s, "vllm:cache_config_info", Some(("block_size", "16"))),
        1.0
    );
    engine.shutdown();
}

#[test]
fn preemptions_under_a_tiny_pool_are_counted() {
    let mut config = config(12, 128);
    config.served_model_name = "tm-test".into();
    config.max_num_seqs = 16;
    let engine = Engine::start(&config).unwrap();
    let client = engine.client();
    run_all(
        &client,
        prompts(16, 9).into_iter().map(|p| greedy(p, 24)).collect(),
    );
    let stats = wait_idle(&client);
    assert!(stats.num_preemptions > 0, "{stats:?}");
    let s = samples(&engine.metrics().encode().unwrap());
    assert_eq!(
        value(&s, "vllm:num_preemptions_total", None),
        stats.num_preemptions as f64
    );
    assert_eq!(
        value(
            &s,
            "vllm:request_success_total",
            Some(("finished_reason", "length"))
        ),
        16.0
    );
    assert_eq!(value(&s, "vllm:kv_cache_usage_perc", None), 0.0);
    engine.shutdown();
}
