//! The scheduler with recurrent-state slots: admission waits for a free slot, a running
//! request keeps its slot, and finish, abort and preemption give it back.

use super::tests::{config, request, step_with};
use super::*;

fn with_slots(num_blocks: u32, budget: usize, num_slots: u32) -> SchedulerConfig {
    SchedulerConfig {
        state_slots: StateSlotConfig {
            num_slots,
            bytes_per_slot: 64,
            bytes_per_block: 64,
        },
        ..config(num_blocks, budget)
    }
}

fn slots_of(output: &SchedulerOutput) -> Vec<(RequestId, Option<u32>)> {
    output
        .scheduled
        .iter()
        .map(|s| (s.request_id, s.state_slot))
        .collect()
}

#[test]
fn admission_waits_for_a_free_slot_and_finishing_frees_it() {
    let mut scheduler = Scheduler::new(with_slots(32, 64, 2)).unwrap();
    scheduler.add_request(request(1, 4, 1)).unwrap();
    scheduler.add_request(request(2, 4, 3)).unwrap();
    scheduler.add_request(request(3, 4, 3)).unwrap();
    let (output, updates) = step_with(&mut scheduler, 9);
    // Blocks and max_num_seqs would allow all three; two slots allow two.
    assert_eq!(
        slots_of(&output),
        vec![(RequestId(1), Some(0)), (RequestId(2), Some(1))]
    );
    assert_eq!(scheduler.waiting_request_ids(), vec![RequestId(3)]);
    // Request 1 finished in that step (max_tokens 1): its slot went back with its blocks.
    assert_eq!(updates[0].finish_reason, Some(FinishReason::Length));
    assert_eq!(scheduler.stats().num_free_state_slots, 1);
    assert_eq!(scheduler.kv_cache_manager().state_slot(RequestId(1)), None);
    let (output, _) = step_with(&mut scheduler, 9);
    assert_eq!(
        slots_of(&output),
        vec![(RequestId(2), Some(1)), (RequestId(3), Some(0))]
    );
    assert_eq!(output.scheduled[1].start_position, 0);
    while scheduler.has_unfinished_requests() {
        step_with(&mut scheduler, 9);
    }
    let stats = scheduler.stats();
    assert_eq!((stats.num_state_slots, stats.num_free_state_slots), (2, 2));
    assert_eq!(stats.kv_cache_usage, 0.0);
}

#[test]
fn abort_frees_the_slot_of_a_running_request_and_waiting_ones_hold_none() {
    let mut scheduler = Scheduler::new(with_slots(32, 64, 1)).unwrap();
    scheduler.add_request(request(1, 4, 5)).unwrap();
    scheduler.add_request(request(2, 4, 5)).unwrap();
    step_with(&mut scheduler, 9);
    let kv = scheduler.kv_cache_manager();
    assert_eq!(kv.state_slot(RequestId(1)), Some(0));
    assert_eq!(kv.state_slot(RequestId(2)), None);
    assert!(scheduler.abort(RequestId(1)));
    assert_eq!(scheduler.stats().num_free_state_slots, 1);
    scheduler.kv_cache_manager().verify().unwrap();
    let (output, _) = step_with(&mut scheduler, 9);
    assert_eq!(slots_of(&output), vec![(RequestId(2), Some(0))]);
    assert_eq!(output.scheduled[0].start_position, 0);
    assert!(scheduler.abort(RequestId(2)));
    assert_eq!(scheduler.stats().num_free_state_slots, 1);
}

#[test]
fn preemption_frees_the_slot_and_the_request_resumes_from_position_zero() {
    // As `fcfs_preempts_the_latest_and_resumes_by_recomputing`: 4 blocks of 4 tokens, two
    // 8-token prompts; request 1's first decode needs a third block, so request 2 goes.
    let mut cfg = with_slots(4, 64, 2);
    cfg.max_model_len = 16;
    let mut scheduler = Scheduler::new(cfg).unwrap();
    scheduler.add_request(request(1, 8, 6)).unwrap();
    scheduler.add_request(request(2, 8, 2)).unwrap();
    let (output, _) = step_with(&mut scheduler, 50);
    assert_eq!(
        slots_of(&output),
        vec![(RequestId(1), Some(0)), (RequestId(2), Some(1))]
    );
    let (output, _) = step_with(&mut scheduler, 51);
    assert_eq!(output.preempted_request_ids, vec![RequestId(2)]);
    assert_eq!(scheduler.kv_cache_manager().state_slot(RequestId(2)), None);
    assert_eq!(scheduler.stats().num_free_state_slots, 1);
    loop {
        let (output, _) = step_with(&mut scheduler, 60);
        if let Some(resumed) = output
            .scheduled
            .iter()
            .find(|s| s.kind == ScheduleKind::Resumed)
        {
            assert_eq!(resumed.request_id, RequestId(2));
            assert_eq!(resumed.start_position, 0);
            assert!(resumed.state_slot.is_some());
            break;
        }
    }
}

#[test]
fn no_prefix_hits_and_no_drafts_with_recurrent_state() {
    let mut scheduler = Scheduler::new(with_slots(32, 64, 4)).unwrap();
    assert!(scheduler.config().enable_prefix_caching);
    assert!(!scheduler.config().prefix_caching_active());
    scheduler.add_request(request(1, 9, 1)).unwrap();
    while scheduler.has_unfinished_requests() {
        step_with(&mut scheduler, 9);
    }
    // The same prompt again recomputes from position 0.
    scheduler.add_request(request(1, 9, 3)).unwrap();
    let (output, _) = step_with(&mut scheduler, 9);
    assert_eq!(output.scheduled[0].start_position, 0);
    assert_eq!(output.scheduled[0].num_cached_tokens, 0);
    let stats = scheduler.stats();
    assert_eq!(
        (stats.prefix_cache_queries, stats.prefix_cache_hits),
        (0, 0)
    );
    // A decoding request is offered drafts: refused.
    assert!(scheduler.is_decoding(RequestId(1)));
    assert!(!scheduler.set_draft_token_ids(RequestId(1), &[1, 2]));
    let (output, _) = step_with(&mut scheduler, 9);
    assert!(output.scheduled[0].draft_token_ids.is_empty());
}

#[test]
fn a_pure_transformer_gets_no_slot() {
    let mut scheduler = Scheduler::new(config(32, 64)).unwrap();
    scheduler.add_request(request(1, 4, 2)).unwrap();
    let (output, _) = step_with(&mut scheduler, 9);
    assert_eq!(slots_of(&output), vec![(RequestId(1), None)]);
    assert_eq!(scheduler.stats().num_state_slots, 0);
}
