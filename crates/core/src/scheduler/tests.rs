use super::*;
use crate::request::StopParams;

pub(super) fn config(num_blocks: u32, budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: 8,
        max_model_len: 64,
        block_size: 4,
        num_blocks,
        enable_prefix_caching: true,
        policy: SchedulingPolicy::Fcfs,
        long_prefill_token_threshold: None,
        enable_chunked_prefill: true,
        sliding_window: None,
        kv_groups: KvCacheGroups::Single,
        state_slots: crate::StateSlotConfig::none(),
    }
}

pub(super) fn request(id: u64, prompt_len: usize, max_tokens: u32) -> Request {
    let prompt = (0..prompt_len as u32)
        .map(|t| t + 100 * id as u32)
        .collect();
    Request::new(RequestId(id), prompt, max_tokens)
}

/// Samples `token` for every sampling request.
pub(super) fn step_with(
    scheduler: &mut Scheduler,
    token: u32,
) -> (SchedulerOutput, Vec<RequestUpdate>) {
    let output = scheduler.schedule();
    let sampled: Vec<(RequestId, u32)> = output
        .scheduled
        .iter()
        .filter(|s| s.samples)
        .map(|s| (s.request_id, token))
        .collect();
    let updates = scheduler.update_from_output(&output, &sampled).unwrap();
    scheduler.kv_cache_manager().verify().unwrap();
    (output, updates)
}

#[test]
fn config_is_validated() {
    let mut bad = config(4, 8);
    bad.max_num_batched_tokens = 0;
    assert!(Scheduler::new(bad).is_err());
    let mut too_small_cache = config(4, 8);
    too_small_cache.max_model_len = 17;
    assert!(matches!(
        Scheduler::new(too_small_cache),
        Err(SchedulerError::InvalidConfig { .. })
    ));
    let mut zero_threshold = config(16, 8);
    zero_threshold.long_prefill_token_threshold = Some(0);
    assert!(Scheduler::new(zero_threshold).is_err());
}

#[test]
fn add_request_rejects_invalid_requests() {
    let mut scheduler = Scheduler::new(config(16, 8)).unwrap();
    assert_eq!(
        scheduler.add_request(request(1, 0, 1)),
        Err(SchedulerError::EmptyPrompt {
            request_id: RequestId(1)
        })
    );
    assert!(matches!(
        scheduler.add_request(request(1, 64, 1)),
        Err(SchedulerError::PromptTooLong { prompt_len: 64, .. })
    ));
    assert!(matches!(
        scheduler.add_request(request(1, 60, 5)),
        Err(SchedulerError::ExceedsMaxModelLen { .. })
    ));
    assert!(matches!(
        scheduler.add_request(request(1, 4, 0)),
        Err(SchedulerError::ZeroMaxTokens { .. })
    ));
    let mut min_above_max = request(1, 4, 2);
    min_above_max.stop.min_tokens = 3;
    assert!(matches!(
        scheduler.add_request(min_above_max),
        Err(SchedulerError::MinTokensExceedMaxTokens { .. })
    ));
    scheduler.add_request(request(1, 60, 4)).unwrap();
    assert_eq!(
        scheduler.add_request(request(1, 4, 1)),
        Err(SchedulerError::DuplicateRequest {
            request_id: RequestId(1)
        })
    );
}

#[test]
fn prefill_then_decode_until_length() {
    let mut scheduler = Scheduler::new(config(16, 16)).unwrap();
    scheduler.add_request(request(1, 6, 3)).unwrap();

    let (output, updates) = step_with(&mut scheduler, 7);
    let first = &output.scheduled[0];
    assert_eq!(first.kind, ScheduleKind::New);
    assert_eq!(first.token_ids, vec![100, 101, 102, 103, 104, 105]);
    assert_eq!(first.start_position, 0);
    assert_eq!(first.block_table().len(), 2);
    assert!(first.samples);
    assert_eq!(updates[0].new_token_ids, vec![7]);
    assert_eq!(updates[0].finish_reason, None);

    let (output, _) = step_with(&mut scheduler, 8);
    let decode = &output.scheduled[0];
    assert_eq!(decode.kind, ScheduleKind::Continuing);
    assert_eq!(decode.token_ids, vec![7]);
    assert_eq!(decode.start_position, 6);

    let (_, updates) = step_with(&mut scheduler, 9);
    assert_eq!(updates[0].finish_reason, Some(FinishReason::Length));
    assert_eq!(updates[0].num_output_tokens, 3);
    assert!(!scheduler.has_unfinished_requests());
    assert_eq!(scheduler.stats().kv_cache_usage, 0.0);
    assert_eq!(scheduler.request_token_ids(RequestId(1)), None);
    let output = scheduler.schedule();
    assert!(output.is_empty());
}

#[test]
fn chunked_prefill_respects_budget_and_samples_only_at_the_end() {
    let mut scheduler = Scheduler::new(config(16, 4)).unwrap();
    scheduler.add_request(request(1, 10, 2)).unwrap();
    let mut starts = Vec::new();
    loop {
        let (output, updates) = step_with(&mut scheduler, 1);
        let scheduled = &output.scheduled[0];
        assert!(output.total_num_scheduled_tokens <= 4);
        starts.push((
            scheduled.start_position,
            scheduled.token_ids.len(),
            scheduled.samples,
        ));
        if !updates.is_empty() {
            break;
        }
    }
    assert_eq!(starts, vec![(0, 4, false), (4, 4, false), (8, 2, true)]);
}

#[test]
fn long_prefill_threshold_caps_chunks() {
    let mut cfg = config(32, 16);
    cfg.long_prefill_token_threshold = Some(3);
    let mut scheduler = Scheduler::new(cfg).unwrap();
    scheduler.add_request(request(1, 7, 1)).unwrap();
    scheduler.add_request(request(2, 2, 1)).unwrap();
    let output = scheduler.schedule();
    let lens: Vec<usize> = output.scheduled.iter().map(|s| s.token_ids.len()).collect();
    assert_eq!(lens, vec![3, 2]);
}

#[test]
fn without_chunked_prefill_prompts_are_scheduled_whole_or_wait() {
    let mut unchunked = config(32, 64);
    unchunked.enable_chunked_prefill = false;
    unchunked.max_num_batched_tokens = 63;
    assert!(
        matches!(Scheduler::new(unchunked), Err(SchedulerError::InvalidConfig { reason }) if reason.contains("max_model_len"))
    );
    unchunked.max_num_batched_tokens = 64;
    // A threshold only caps chunks; without chunking it does not split a prompt.
    unchunked.long_prefill_token_threshold = Some(3);
    let mut scheduler = Scheduler::new(unchunked).unwrap();
    scheduler.add_request(request(1, 40, 4)).unwrap();
    scheduler.add_request(request(2, 30, 1)).unwrap();
    scheduler.add_request(request(3, 20, 1)).unwrap();
    let (output, _) = step_with(&mut scheduler, 1);
    let lens: Vec<(RequestId, usize)> = output
        .scheduled
        .iter()
        .map(|s| (s.request_id, s.token_ids.len()))
        .collect();
    // 40 fits; 30 does not fit the 24 left and is not split; FCFS keeps 3 behind 2.
    assert_eq!(lens, vec![(RequestId(1), 40)]);
    let (output, _) = step_with(&mut scheduler, 1);
    let lens: Vec<(RequestId, usize)> = output
        .scheduled
        .iter()
        .map(|s| (s.request_id, s.token_ids.len()))
        .collect();
    assert_eq!(
        lens,
        vec![(RequestId(1), 1), (RequestId(2), 30), (RequestId(3), 20)]
    );
}

#[test]
fn decodes_come_before_new_prefills_in_the_budget() {
    let mut scheduler = Scheduler::new(config(32, 5)).unwrap();
    scheduler.add_request(request(1, 4, 5)).unwrap();
    step_with(&mut scheduler, 1);
    scheduler.add_request(request(2, 8, 1)).unwrap();
    let (output, _) = step_with(&mut scheduler, 1);
    assert_eq!(output.scheduled[0].request_id, RequestId(1));
    assert_eq!(output.scheduled[0].token_ids.len(), 1);
    assert_eq!(output.scheduled[1].request_id, RequestId(2));
    assert_eq!(output.scheduled[1].token_ids.len(), 4);
}

#[test]
fn max_num_seqs_caps_admission() {
    let mut cfg = config(32, 64);
    cfg.max_num_seqs = 2;
    let mut scheduler = Scheduler::new(cfg).unwrap();
    for id in 1..=3 {
        scheduler.add_request(request(id, 2, 4)).unwrap();
    }
    let output = scheduler.schedule();
    assert_eq!(output.scheduled.len(), 2);
    assert_eq!(scheduler.num_waiting(), 1);
}

#[test]
fn eos_stops_unless_ignored_and_min_tokens_defers_it() {
    let mut scheduler = Scheduler::new(config(32, 64)).unwrap();
    let eos = 2;
    let with_stop = |id, ignore_eos, min_tokens| Request {
        stop: StopParams {
            max_tokens: 4,
            min_tokens,
            ignore_eos,
            eos_token_ids: vec![eos, 3],
            stop_token_ids: vec![9],
        },
        ..request(id, 3, 4)
    };
    scheduler.add_request(with_stop(1, false, 0)).unwrap();
    scheduler.add_request(with_stop(2, true, 0)).unwrap();
    scheduler.add_request(with_stop(3, false, 2)).unwrap();
    let (_, updates) = step_with(&mut scheduler, eos);
    let reasons: Vec<_> = updates.iter().map(|u| u.finish_reason).collect();
    assert_eq!(reasons, vec![Some(FinishReason::Stop), None, None]);
    assert_eq!(updates[0].stop_token_id, None);
    // Second EOS: request 3 reached min_tokens now.
    let (_, updates) = step_with(&mut scheduler, 3);
    let reasons: Vec<_> = updates.iter().map(|u| u.finish_reason).collect();
    assert_eq!(reasons, vec![None, Some(FinishReason::Stop)]);
    let (_, updates) = step_with(&mut scheduler, 9);
    assert_eq!(updates[0].finish_reason, Some(FinishReason::Stop));
    assert_eq!(updates[0].stop_token_id, Some(9));
}

#[test]
fn length_wins_over_eos_on_the_last_allowed_token() {
    let mut scheduler = Scheduler::new(config(32, 64)).unwrap();
    let mut req = request(1, 3, 1);
    req.stop.eos_token_ids = vec![2];
    scheduler.add_request(req).unwrap();
    let (_, updates) = step_with(&mut scheduler, 2);
    assert_eq!(updates[0].finish_reason, Some(FinishReason::Length));
}

#[test]
fn fcfs_preempts_the_latest_and_resumes_by_recomputing() {
    // 4 blocks of 4 tokens. Two 8-token prompts take 2 blocks each; the first decode of
    // request 1 (position 8) needs a third block, so request 2 (admitted last) is preempted.
    let mut cfg = config(4, 64);
    cfg.max_model_len = 16;
    cfg.enable_prefix_caching = false;
    let mut scheduler = Scheduler::new(cfg).unwrap();
    scheduler.add_request(request(1, 8, 6)).unwrap();
    scheduler.add_request(request(2, 8, 2)).unwrap();
    let (output, _) = step_with(&mut scheduler, 50);
    assert_eq!(output.scheduled.len(), 2);
    let (output, _) = step_with(&mut scheduler, 51);
    assert_eq!(output.scheduled.len(), 1);
    assert_eq!(output.preempted_request_ids, vec![RequestId(2)]);
    assert_eq!(scheduler.stats().num_preemptions, 1);
    assert_eq!(scheduler.waiting_request_ids(), vec![RequestId(2)]);

    // Drive until request 2 comes back: it recomputes prompt + its one generated token.
    loop {
        let output = scheduler.schedule();
        let resumed = output
            .scheduled
            .iter()
            .find(|s| s.kind == ScheduleKind::Resumed)
            .cloned();
        let sampled: Vec<_> = output
            .scheduled
            .iter()
            .filter(|s| s.samples)
            .map(|s| (s.request_id, 60))
            .collect();
        scheduler.update_from_output(&output, &sampled).unwrap();
        if let Some(resumed) = resumed {
            assert_eq!(resumed.request_id, RequestId(2));
            assert_eq!(resumed.start_position, 0);
            let mut expected: Vec<u32> = (200..208).collect();
            expected.push(50);
            assert_eq!(resumed.token_ids, expected);
            assert!(resumed.samples);
            break;
        }
    }
}

#[test]
fn priority_preempts_the_lowest_priority_even_if_already_scheduled() {
    let mut cfg = config(4, 64);
    cfg.max_model_len = 16;
    cfg.policy = SchedulingPolicy::Priority;
    cfg.enable_prefix_caching = false;
    let mut scheduler = Scheduler::new(cfg).unwrap();
    let mut low = request(1, 8, 6);
    low.priority = 5;
    let mut high = request(2, 8, 6);
    high.priority = -1;
    scheduler.add_request(low).unwrap();
    scheduler.add_request(high).unwrap();
    let (output, _) = step_with(&mut scheduler, 50);
    // Priority order on admission: request 2 first.
    let admitted: Vec<_> = output.scheduled.iter().map(|s| s.request_id).collect();
    assert_eq!(admitted, vec![RequestId(2), RequestId(1)]);
    // Request 2 (first in running order) decodes into a new block; the victim is request 1.
    let (output, _) = step_with(&mut scheduler, 51);
    assert_eq!(output.preempted_request_ids, vec![RequestId(1)]);
    assert_eq!(output.scheduled.len(), 1);
    assert_eq!(output.scheduled[0].request_id, RequestId(2));
}

#[test]
fn priority_victim_scheduled_earlier_in_the_step_returns_its_budget() {
    let mut cfg = config(5, 64);
    cfg.max_model_len = 20;
    cfg.policy = SchedulingPolicy::Priority;
    cfg.enable_prefix_caching = false;
    let mut scheduler = Scheduler::new(cfg).unwrap();
    // Low priority first in running order with a 2-token prompt (1 block); high priority with
    // 16 tokens (4 blocks): all 5 blocks used. Next step low decodes in place (position 3),
    // high needs a fifth block -> low is preempted although it was already scheduled.
    let mut low = request(1, 2, 8);
    low.priority = 9;
    let mut high = request(2, 16, 4);
    high.priority = 0;
    scheduler.add_request(low).unwrap();
    step_with(&mut scheduler, 5);
    scheduler.add_request(high).unwrap();
    let (output, _) = step_with(&mut scheduler, 5);
    assert_eq!(output.scheduled.len(), 2);
    let (output, _) = step_with(&mut scheduler, 5);
    assert_eq!(output.preempted_request_ids, vec![RequestId(1)]);
    let ids: Vec<_> = output.scheduled.iter().map(|s| s.request_id).collect();
    assert_eq!(ids, vec![RequestId(2)]);
    assert_eq!(output.total_num_scheduled_tokens, 1);
}

#[test]
fn prefix_cache_hit_skips_computed_tokens_and_reports_them() {
    let mut scheduler = Scheduler::new(config(32, 64)).unwrap();
    let shared: Vec<u32> = (0..10).collect();
    scheduler
        .add_request(Request::new(RequestId(1), shared.clone(), 1))
        .unwrap();
    step_with(&mut scheduler, 1);
    let mut longer = shared.clone();
    longer.extend([77, 78]);
    scheduler
        .add_request(Request::new(RequestId(2), longer, 1))
        .unwrap();
    let (output, _) = step_with(&mut scheduler, 1);
    let scheduled = &output.scheduled[0];
    assert_eq!(scheduled.num_cached_tokens, 8);
    assert_eq!(scheduled.start_position, 8);
    assert_eq!(scheduled.token_ids, vec![8, 9, 77, 78]);
    let stats = scheduler.stats();
    assert_eq!(stats.prefix_cache_queries, 10 + 12);
    assert_eq!(stats.prefix_cache_hits, 8);
}

#[test]
fn generated_tokens_are_cached_too() {
    let mut scheduler = Scheduler::new(config(32, 64)).unwrap();
    scheduler
        .add_request(Request::new(RequestId(1), vec![1, 2, 3], 4))
        .unwrap();
    for token in [4, 5, 6, 7] {
        step_with(&mut scheduler, token);
    }
    // Sequence 1..=7 was computed (the last sampled token never is); blocks [1,2,3,4] full.
    scheduler
        .add_request(Request::new(RequestId(2), vec![1, 2, 3, 4, 5, 6], 1))
        .unwrap();
    let (output, _) = step_with(&mut scheduler, 1);
    assert_eq!(output.scheduled[0].num_cached_tokens, 4);
}

#[test]
fn abort_frees_waiting_and_running_requests() {
    let mut scheduler = Scheduler::new(config(16, 64)).unwrap();
    scheduler.add_request(request(1, 5, 10)).unwrap();
    step_with(&mut scheduler, 1);
    scheduler.add_request(request(2, 5, 10)).unwrap();
    assert!(scheduler.kv_cache_manager().num_used_blocks() > 0);
    assert!(scheduler.abort(RequestId(2)));
    assert!(scheduler.abort(RequestId(1)));
    assert!(!scheduler.abort(RequestId(1)));
    assert!(!scheduler.has_unfinished_requests());
    assert_eq!(scheduler.num_waiting(), 0);
    assert_eq!(scheduler.kv_cache_manager().num_used_blocks(), 0);
    assert_eq!(scheduler.request_token_ids(RequestId(1)), None);
    assert_eq!(scheduler.request_token_ids(RequestId(2)), None);
    assert!(scheduler.schedule().is_empty());
}

#[test]
fn stop_string_finish_between_schedule_and_update_ignores_the_sample() {
    let mut scheduler = Scheduler::new(config(16, 64)).unwrap();
    scheduler.add_request(request(1, 5, 10)).unwrap();
    scheduler.add_request(request(2, 5, 10)).unwrap();
    let output = scheduler.schedule();
    let updates = scheduler.finish_requests([RequestId(1), RequestId(9)], FinishReason::Stop);
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].finish_reason, Some(FinishReason::Stop));
    let updates = scheduler
        .update_from_output(&output, &[(RequestId(1), 3), (RequestId(2), 4)])
        .unwrap();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].request_id, RequestId(2));
    scheduler.kv_cache_manager().verify().unwrap();
}

#[test]
fn update_rejects_stale_missing_and_unexpected_samples() {
    let mut scheduler = Scheduler::new(config(16, 4)).unwrap();
    scheduler.add_request(request(1, 2, 10)).unwrap();
    scheduler.add_request(request(2, 6, 10)).unwrap();
    let output = scheduler.schedule();
    // Request 1 samples; request 2 got a 2-token chunk and does not.
    assert_eq!(
        scheduler.update_from_output(&output, &[]),
        Err(SchedulerError::MissingSample {
            request_id: RequestId(1)
        })
    );
    assert_eq!(
        scheduler.update_from_output(&output, &[(RequestId(1), 1), (RequestId(2), 1)]),
        Err(SchedulerError::UnexpectedSample {
            request_id: RequestId(2)
        })
    );
    assert_eq!(
        scheduler.update_from_output(&output, &[(RequestId(1), 1), (RequestId(1), 1)]),
        Err(SchedulerError::UnexpectedSample {
            request_id: RequestId(1)
        })
    );
    scheduler
        .update_from_output(&output, &[(RequestId(1), 1)])
        .unwrap();
    assert!(matches!(
        scheduler.update_from_output(&output, &[(RequestId(1), 1)]),
        Err(SchedulerError::StaleOutput { .. })
    ));
}

#[test]
fn rescheduling_without_update_replans_the_same_tokens() {
    let mut scheduler = Scheduler::new(config(16, 64)).unwrap();
    scheduler.add_request(request(1, 5, 3)).unwrap();
    let first = scheduler.schedule();
    let second = scheduler.schedule();
    assert_eq!(first.scheduled[0].token_ids, second.scheduled[0].token_ids);
    assert_eq!(
        first.scheduled[0].block_table(),
        second.scheduled[0].block_table()
    );
    assert!(scheduler
        .update_from_output(&first, &[(RequestId(1), 1)])
        .is_err());
    scheduler
        .update_from_output(&second, &[(RequestId(1), 1)])
        .unwrap();
    scheduler.kv_cache_manager().verify().unwrap();
}
