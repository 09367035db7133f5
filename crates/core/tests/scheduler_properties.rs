//! Property tests: random request streams (lengths, budgets, priorities, aborts, salts, tiny
//! pools) through the scheduler and a paged token executor, with every invariant checked after
//! every step (see `common/driver.rs`).

mod common;

use proptest::prelude::*;
use tokenmill_core::{
    KvCacheGroups, SchedulerConfig, SchedulingPolicy, StateSlotConfig, StopParams,
};

use common::driver::{run, run_with_drafts, run_with_model_window, RequestSpec};
use common::EOS;

/// Raw per-request draws, turned into a valid request once the scenario's limits are known.
#[derive(Debug, Clone)]
struct RawRequest {
    arrival_step: usize,
    base: usize,
    shared_len: usize,
    suffix: Vec<u32>,
    max_tokens: u32,
    min_tokens: u32,
    priority: i32,
    ignore_eos: bool,
    abort_at_step: Option<usize>,
    salt: Option<u8>,
    stop_token: Option<u32>,
}

#[derive(Debug, Clone)]
struct Scenario {
    config: SchedulerConfig,
    eos_every: u64,
    requests: Vec<RequestSpec>,
}

fn raw_request() -> impl Strategy<Value = RawRequest> {
    (
        (
            0usize..12,
            0usize..2,
            0usize..40,
            prop::collection::vec(0u32..6, 0..10),
        ),
        (1u32..48, 0u32..6, -2i32..=2, any::<bool>()),
        (
            prop::option::weighted(0.2, 0usize..40),
            prop::option::weighted(0.3, 0u8..2),
            prop::option::weighted(0.3, 1u32..64),
        ),
    )
        .prop_map(
            |(
                (arrival_step, base, shared_len, suffix),
                (max_tokens, min_tokens, priority, ignore_eos),
                (abort_at_step, salt, stop_token),
            )| RawRequest {
                arrival_step,
                base,
                shared_len,
                suffix,
                max_tokens,
                min_tokens,
                priority,
                ignore_eos,
                abort_at_step,
                salt,
                stop_token,
            },
        )
}

fn build_request(raw: &RawRequest, bases: &[Vec<u32>; 2], max_model_len: usize) -> RequestSpec {
    let base = &bases[raw.base];
    let mut prompt: Vec<u32> = base[..raw.shared_len.min(base.len())].to_vec();
    prompt.extend_from_slice(&raw.suffix);
    if prompt.is_empty() {
        prompt.push(1);
    }
    prompt.truncate(max_model_len - 1);
    let room = (max_model_len - prompt.len()) as u32;
    let max_tokens = 1 + (raw.max_tokens - 1) % room;
    RequestSpec {
        arrival_step: raw.arrival_step,
        prompt,
        stop: StopParams {
            max_tokens,
            min_tokens: raw.min_tokens.min(max_tokens),
            ignore_eos: raw.ignore_eos,
            eos_token_ids: vec![EOS],
            stop_token_ids: raw.stop_token.into_iter().collect(),
        },
        priority: raw.priority,
        salt: raw.salt,
        abort_at_step: raw.abort_at_step,
    }
}

/// Scenarios with pools from "one max-length request" to roomy, budgets from 1 token.
fn scenario(with_aborts: bool) -> impl Strategy<Value = Scenario> {
    (
        (
            1usize..=6,
            4usize..=40,
            prop_oneof![0usize..=2, 0usize..=12],
            1usize..=24,
            1usize..=6,
        ),
        (
            any::<bool>(),
            prop_oneof![
                Just(SchedulingPolicy::Fcfs),
                Just(SchedulingPolicy::Priority)
            ],
            prop::option::weighted(0.3, 1usize..=10),
            0u64..=10,
        ),
        prop::collection::vec(raw_request(), 1..=10),
        (
            prop::collection::vec(0u32..6, 40),
            prop::collection::vec(0u32..6, 40),
        ),
    )
        .prop_map(
            move |(
                (block_size, max_model_len, extra_blocks, budget, max_num_seqs),
                (enable_prefix_caching, policy, long_prefill_token_threshold, eos_every),
                raws,
                (base_a, base_b),
            )| {
                let bases = [base_a, base_b];
                let config = SchedulerConfig {
                    max_num_batched_tokens: budget,
                    max_num_seqs,
                    max_model_len,
                    block_size,
                    num_blocks: (max_model_len.div_ceil(block_size) + extra_blocks) as u32,
                    enable_prefix_caching,
                    policy,
                    long_prefill_token_threshold,
                    enable_chunked_prefill: true,
                    sliding_window: None,
                    kv_groups: KvCacheGroups::Single,
                    state_slots: StateSlotConfig::none(),
                };
                let requests = raws
                    .iter()
                    .map(|raw| {
                        let mut spec = build_request(raw, &bases, max_model_len);
                        if !with_aborts {
                            spec.abort_at_step = None;
                        }
                        spec
                    })
                    .collect();
                Scenario {
                    config,
                    eos_every,
                    requests,
                }
            },
        )
}

/// Generous for the worst case (budget 1, one-request pools, repeated recompute).
const MAX_STEPS: usize = 50_000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn invariants_hold_and_every_request_finishes(scenario in scenario(true)) {
        let result = run(scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(result.is_ok(), "{}", result.err().unwrap_or_default());
    }
}

/// The same requests with a pool big enough that nothing is ever preempted, no prefix cache,
/// no chunking and room for everyone at once.
fn reference_config(scenario: &Scenario) -> SchedulerConfig {
    let config = scenario.config;
    let blocks_per_request = config.max_model_len.div_ceil(config.block_size);
    SchedulerConfig {
        max_num_batched_tokens: 100_000,
        max_num_seqs: 1_000,
        num_blocks: (blocks_per_request * scenario.requests.len() + 1) as u32,
        enable_prefix_caching: false,
        long_prefill_token_threshold: None,
        enable_chunked_prefill: true,
        ..config
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Architecture invariant 3: greedy output does not depend on batching, chunking,
    /// preemption with recompute, or prefix caching.
    #[test]
    fn greedy_outputs_do_not_depend_on_scheduling(scenario in scenario(false)) {
        let reference = run(reference_config(&scenario), &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(reference.is_ok(), "{}", reference.clone().err().unwrap_or_default());
        let reference = reference.unwrap_or_else(|_| unreachable!());
        prop_assert_eq!(reference.stats.num_preemptions, 0);
        for caching in [false, true] {
            let config = SchedulerConfig { enable_prefix_caching: caching, ..scenario.config };
            let result = run(config, &scenario.requests, scenario.eos_every, MAX_STEPS);
            prop_assert!(result.is_ok(), "{}", result.clone().err().unwrap_or_default());
            let result = result.unwrap_or_else(|_| unreachable!());
            prop_assert_eq!(&result.outcomes, &reference.outcomes, "caching={}", caching);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Speculative decoding: random drafts (mostly right, sometimes wrong) on every decode
    /// keep every invariant (block accounting and ref counts after accept/reject, no leaks at
    /// finish, preemption with drafts in flight) and give the outputs of plain decoding.
    #[test]
    fn drafts_change_nothing_but_the_step_count(scenario in scenario(true), seed in any::<u64>()) {
        let plain = run(scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(plain.is_ok(), "{}", plain.clone().err().unwrap_or_default());
        let plain = plain.unwrap_or_else(|_| unreachable!());
        let speculative = run_with_drafts(
            scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS, Some(seed),
        );
        prop_assert!(speculative.is_ok(), "{}", speculative.clone().err().unwrap_or_default());
        let speculative = speculative.unwrap_or_else(|_| unreachable!());
        if scenario.requests.iter().all(|r| r.abort_at_step.is_none()) {
            prop_assert_eq!(&speculative.outcomes, &plain.outcomes);
        }
    }
}

/// [`scenario`] with a sliding window of 1 to 12 positions (as short as one token, as long as
/// several blocks) and a pool sized from what one request holds under it, often smaller than
/// one max-length request would need without the window.
fn windowed_scenario(with_aborts: bool) -> impl Strategy<Value = Scenario> {
    (scenario(with_aborts), 1usize..=12, 0usize..=4).prop_map(|(mut scenario, window, extra)| {
        scenario.config.sliding_window = Some(window);
        scenario.config.num_blocks = (scenario.config.max_blocks_per_request() + extra) as u32;
        scenario
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Sliding window: leading blocks are released exactly when no future query sees them,
    /// reference counts and accounting hold after every step (prefix hits that take only the
    /// window's blocks, preemption, aborts), released blocks are never read back, and every
    /// request finishes.
    #[test]
    fn windowed_invariants_hold_and_every_request_finishes(scenario in windowed_scenario(true)) {
        let result = run(scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(result.is_ok(), "{}", result.err().unwrap_or_default());
    }

    /// Releasing blocks outside the window changes no output: the same windowed "model" over a
    /// KV manager that keeps every block (roomy pool, no prefix cache, no preemption) gives
    /// the same tokens, with and without prefix caching.
    #[test]
    fn windowed_outputs_equal_the_path_that_keeps_every_block(scenario in windowed_scenario(false)) {
        let window = scenario.config.sliding_window.unwrap_or(1);
        let keep_all = SchedulerConfig { sliding_window: None, ..reference_config(&scenario) };
        let reference = run_with_model_window(
            keep_all, &scenario.requests, scenario.eos_every, MAX_STEPS, window,
        );
        prop_assert!(reference.is_ok(), "{}", reference.clone().err().unwrap_or_default());
        let reference = reference.unwrap_or_else(|_| unreachable!());
        for caching in [false, true] {
            let config = SchedulerConfig { enable_prefix_caching: caching, ..scenario.config };
            let result = run(config, &scenario.requests, scenario.eos_every, MAX_STEPS);
            prop_assert!(result.is_ok(), "{}", result.clone().err().unwrap_or_default());
            let result = result.unwrap_or_else(|_| unreachable!());
            prop_assert_eq!(&result.outcomes, &reference.outcomes, "caching={}", caching);
        }
    }

    /// Speculative drafts under a window: rejected drafts roll back without touching released
    /// blocks, and the outputs are those of plain decoding.
    #[test]
    fn windowed_drafts_change_nothing_but_the_step_count(
        scenario in windowed_scenario(false), seed in any::<u64>(),
    ) {
        let plain = run(scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(plain.is_ok(), "{}", plain.clone().err().unwrap_or_default());
        let speculative = run_with_drafts(
            scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS, Some(seed),
        );
        prop_assert!(speculative.is_ok(), "{}", speculative.clone().err().unwrap_or_default());
        prop_assert_eq!(
            &speculative.unwrap_or_else(|_| unreachable!()).outcomes,
            &plain.unwrap_or_else(|_| unreachable!()).outcomes
        );
    }
}

/// [`scenario`] for a hybrid model (vLLM's hybrid KV cache manager): 1 or 2 full-attention
/// groups and 1 to 3 sliding-window groups with a window of 1 to 12 positions, in a pool
/// sized from what one request holds over all groups, often smaller than keeping every block
/// in every group would need.
fn hybrid_scenario(with_aborts: bool) -> impl Strategy<Value = Scenario> {
    (
        scenario(with_aborts),
        1usize..=12,
        1usize..=2,
        1usize..=3,
        0usize..=6,
    )
        .prop_map(|(mut scenario, window, full, sliding, extra)| {
            scenario.config.sliding_window = Some(window);
            scenario.config.kv_groups = KvCacheGroups::Hybrid { full, sliding };
            scenario.config.num_blocks = (scenario.config.max_blocks_per_request() + extra) as u32;
            scenario
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Hybrid groups: every group's table is written and read back on its own (the sliding
    /// groups only inside their window, the full groups whole), reference counts and
    /// accounting hold over all groups after every step (prefix hits every group serves,
    /// preemption, aborts), sliding groups release exactly the blocks before the window, and
    /// every request finishes.
    #[test]
    fn hybrid_invariants_hold_and_every_request_finishes(scenario in hybrid_scenario(true)) {
        let result = run(scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(result.is_ok(), "{}", result.err().unwrap_or_default());
    }

    /// The groups change no output: one group keeping every block (the
    /// `--disable-hybrid-kv-cache-manager` path, roomy pool, no prefix cache, no preemption)
    /// gives the same tokens, with and without prefix caching, and with speculative drafts.
    #[test]
    fn hybrid_outputs_equal_the_path_that_keeps_every_block(
        scenario in hybrid_scenario(false), seed in any::<u64>(),
    ) {
        let keep_all = SchedulerConfig {
            sliding_window: None,
            kv_groups: KvCacheGroups::Single,
            ..reference_config(&scenario)
        };
        let reference = run(keep_all, &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(reference.is_ok(), "{}", reference.clone().err().unwrap_or_default());
        let reference = reference.unwrap_or_else(|_| unreachable!());
        for caching in [false, true] {
            let config = SchedulerConfig { enable_prefix_caching: caching, ..scenario.config };
            let result = run(config, &scenario.requests, scenario.eos_every, MAX_STEPS);
            prop_assert!(result.is_ok(), "{}", result.clone().err().unwrap_or_default());
            let result = result.unwrap_or_else(|_| unreachable!());
            prop_assert_eq!(&result.outcomes, &reference.outcomes, "caching={}", caching);
        }
        let speculative = run_with_drafts(
            scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS, Some(seed),
        );
        prop_assert!(speculative.is_ok(), "{}", speculative.clone().err().unwrap_or_default());
        prop_assert_eq!(
            &speculative.unwrap_or_else(|_| unreachable!()).outcomes,
            &reference.outcomes
        );
    }
}

/// [`scenario`] for a model with recurrent layers: 1 to `max_num_seqs + 1` state slots (often
/// fewer than the requests that could run, so admission waits for a slot), weighed against
/// the blocks by random byte sizes.
fn state_scenario(with_aborts: bool) -> impl Strategy<Value = Scenario> {
    (scenario(with_aborts), 0u32..=6, 1u64..=1000, 1u64..=1000).prop_map(
        |(mut scenario, slots, bytes_per_slot, bytes_per_block)| {
            let num_slots = 1 + slots % (scenario.config.max_num_seqs as u32 + 1);
            scenario.config.state_slots = StateSlotConfig {
                num_slots,
                bytes_per_slot,
                bytes_per_block,
            };
            scenario
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Recurrent-state slots under random add / schedule / finish / abort / preempt streams in
    /// small pools: a request holds exactly one slot exactly while it runs, no two running
    /// requests share one, none leaks (all free at the end), every continuing run finds its own
    /// state of exactly the positions before it (the executor fails the step otherwise), no
    /// prefix hit is ever taken, usage weighs slots by bytes, and every request finishes.
    #[test]
    fn state_slot_invariants_hold_and_every_request_finishes(scenario in state_scenario(true)) {
        let result = run(scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(result.is_ok(), "{}", result.err().unwrap_or_default());
    }

    /// The recurrent state gives the tokens of the reference (a pure transformer with a roomy
    /// pool, no preemption, no prefix cache), with prefix caching asked for or not, and with
    /// speculative drafts offered (the scheduler refuses them with recurrent state).
    #[test]
    fn state_outputs_equal_the_reference(scenario in state_scenario(false), seed in any::<u64>()) {
        let reference = SchedulerConfig {
            state_slots: StateSlotConfig::none(),
            ..reference_config(&scenario)
        };
        let reference = run(reference, &scenario.requests, scenario.eos_every, MAX_STEPS);
        prop_assert!(reference.is_ok(), "{}", reference.clone().err().unwrap_or_default());
        let reference = reference.unwrap_or_else(|_| unreachable!());
        for caching in [false, true] {
            let config = SchedulerConfig { enable_prefix_caching: caching, ..scenario.config };
            let result = run(config, &scenario.requests, scenario.eos_every, MAX_STEPS);
            prop_assert!(result.is_ok(), "{}", result.clone().err().unwrap_or_default());
            let result = result.unwrap_or_else(|_| unreachable!());
            prop_assert_eq!(result.stats.prefix_cache_hits, 0);
            prop_assert_eq!(&result.outcomes, &reference.outcomes, "caching={}", caching);
        }
        let speculative = run_with_drafts(
            scenario.config, &scenario.requests, scenario.eos_every, MAX_STEPS, Some(seed),
        );
        prop_assert!(speculative.is_ok(), "{}", speculative.clone().err().unwrap_or_default());
        prop_assert_eq!(
            &speculative.unwrap_or_else(|_| unreachable!()).outcomes,
            &reference.outcomes
        );
    }
}
