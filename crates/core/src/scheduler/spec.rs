//! Speculative decoding in the scheduler: draft tokens a proposer attached to a running
//! request are scheduled after its last token (their KV slots allocated as lookahead, within
//! the token budget), and the executor's verified run comes back through
//! [`Scheduler::update_from_token_runs`], which rolls back the rejected positions.

use super::{RequestState, Scheduler};
use crate::error::SchedulerError;
use crate::request::RequestId;

impl Scheduler {
    /// Attaches draft tokens to a running request for its next decode step, replacing any it
    /// had. They are used at most once: the next `schedule` takes as many as fit (the token
    /// budget, `max_model_len`, and `max_tokens` minus one, since the verified run always
    /// adds a token of the target's own) when the request is decoding, and drops them
    /// otherwise. Returns `false` for a request that is not running, and always for a model
    /// with recurrent-state slots: a rejected draft's update cannot be rolled back out of a
    /// recurrent state (the engine refuses speculative decoding for such a model at
    /// start-up; this keeps the scheduler safe on its own).
    pub fn set_draft_token_ids(&mut self, request_id: RequestId, draft_token_ids: &[u32]) -> bool {
        if !self.running.contains(&request_id) || self.config.state_slots.is_enabled() {
            return false;
        }
        match self.requests.get_mut(&request_id) {
            Some(state) => {
                state.draft_token_ids.clear();
                state.draft_token_ids.extend_from_slice(draft_token_ids);
                true
            }
            None => false,
        }
    }

    /// Prompt length of an unfinished request.
    pub fn num_prompt_tokens(&self, request_id: RequestId) -> Option<usize> {
        self.requests
            .get(&request_id)
            .map(|state| state.request.prompt_token_ids.len())
    }

    /// Whether the request's next step is a decode (all but its last token computed), the
    /// only kind of step that carries draft tokens; `false` for unknown ids.
    pub fn is_decoding(&self, request_id: RequestId) -> bool {
        self.requests.get(&request_id).is_some_and(|state| {
            self.running.contains(&request_id)
                && state.num_computed_tokens + 1 == state.num_tokens()
        })
    }

    /// Drops every request's drafts once a step has taken what it could of them.
    pub(super) fn clear_draft_token_ids(&mut self) {
        for request_id in &self.running {
            if let Some(state) = self.requests.get_mut(request_id) {
                state.draft_token_ids.clear();
            }
        }
    }

    /// How many of `state`'s drafts this step carries: none unless it is a decode
    /// (`remaining == 1`), then as many as the budget (and the long-prefill threshold) beyond
    /// the decode token, the model length and `max_tokens` leave room for.
    pub(super) fn num_draft_tokens(
        &self,
        state: &RequestState,
        remaining: usize,
        budget: usize,
    ) -> usize {
        if remaining != 1 || state.draft_token_ids.is_empty() {
            return 0;
        }
        let room_in_model = self
            .config
            .max_model_len
            .saturating_sub(state.num_tokens() + 1);
        let room_in_output =
            (state.request.stop.max_tokens as usize).saturating_sub(state.num_output_tokens() + 1);
        // vLLM caps a step's tokens, drafts included, by the long-prefill threshold too.
        let threshold = self
            .config
            .long_prefill_token_threshold
            .unwrap_or(usize::MAX);
        state
            .draft_token_ids
            .len()
            .min(budget.min(threshold).saturating_sub(1))
            .min(room_in_model)
            .min(room_in_output)
    }
}

/// A run is the accepted prefix of the drafts plus one token of the target's own.
pub(super) fn validate_run(
    request_id: RequestId,
    run: &[u32],
    drafts: &[u32],
) -> Result<(), SchedulerError> {
    let accepted = run.len().saturating_sub(1);
    if run.is_empty() || accepted > drafts.len() || run[..accepted] != drafts[..accepted] {
        return Err(SchedulerError::InvalidTokenRun {
            request_id,
            len: run.len(),
            num_drafts: drafts.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache_manager::KvCacheGroups;
    use crate::request::{FinishReason, Request};
    use crate::scheduler::{SchedulerConfig, SchedulerOutput, SchedulingPolicy};

    const EOS: u32 = 2;

    fn scheduler(budget: usize) -> Scheduler {
        Scheduler::new(SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: 4,
            max_model_len: 64,
            block_size: 4,
            num_blocks: 32,
            enable_prefix_caching: true,
            policy: SchedulingPolicy::Fcfs,
            long_prefill_token_threshold: None,
            enable_chunked_prefill: true,
            sliding_window: None,
            kv_groups: KvCacheGroups::Single,
            state_slots: crate::StateSlotConfig::none(),
        })
        .unwrap()
    }

    fn request(id: u64, max_tokens: u32, min_tokens: u32) -> Request {
        let mut request = Request::new(RequestId(id), (10..16).collect(), max_tokens);
        request.stop.eos_token_ids = vec![EOS];
        request.stop.min_tokens = min_tokens;
        request
    }

    /// Admits request 1 (six prompt tokens), prefills it and samples token 40.
    fn decoding(budget: usize, max_tokens: u32, min_tokens: u32) -> Scheduler {
        let mut scheduler = scheduler(budget);
        scheduler
            .add_request(request(1, max_tokens, min_tokens))
            .unwrap();
        while !scheduler.is_decoding(RequestId(1)) {
            let output = scheduler.schedule();
            let sampled: Vec<(RequestId, u32)> = output
                .scheduled
                .iter()
                .filter(|s| s.samples)
                .map(|s| (s.request_id, 40))
                .collect();
            scheduler.update_from_output(&output, &sampled).unwrap();
        }
        assert!(scheduler.is_decoding(RequestId(1)));
        scheduler
    }

    fn step(
        scheduler: &mut Scheduler,
        drafts: &[u32],
        run: &[u32],
    ) -> (SchedulerOutput, Vec<crate::RequestUpdate>) {
        assert!(scheduler.set_draft_token_ids(RequestId(1), drafts));
        let output = scheduler.schedule();
        let updates = scheduler
            .update_from_token_runs(&output, &[(RequestId(1), run.to_vec())])
            .unwrap();
        scheduler.kv_cache_manager().verify().unwrap();
        (output, updates)
    }

    #[test]
    fn drafts_get_lookahead_slots_and_rejected_ones_are_rolled_back() {
        let mut scheduler = decoding(64, 32, 0);
        let free_before = scheduler.kv_cache_manager().num_free_blocks();
        assert!(scheduler.set_draft_token_ids(RequestId(1), &[41, 42, 43, 44, 45]));
        let output = scheduler.schedule();
        let scheduled = &output.scheduled[0];
        assert_eq!(scheduled.token_ids, vec![40, 41, 42, 43, 44, 45]);
        assert_eq!(scheduled.draft_token_ids, vec![41, 42, 43, 44, 45]);
        assert!(scheduled.samples);
        assert_eq!(
            scheduled.block_table().len(),
            3,
            "12 positions, lookahead included"
        );
        assert_eq!(
            free_before - scheduler.kv_cache_manager().num_free_blocks(),
            1
        );
        // Everything rejected: the target's own token 50, the lookahead block freed.
        let updates = scheduler
            .update_from_token_runs(&output, &[(RequestId(1), vec![50])])
            .unwrap();
        assert_eq!(updates[0].new_token_ids, vec![50]);
        assert_eq!(scheduler.kv_cache_manager().num_free_blocks(), free_before);
        assert_eq!(
            scheduler
                .kv_cache_manager()
                .block_table(RequestId(1))
                .unwrap()
                .len(),
            2
        );
        // Two accepted plus a replacement: the computed count moves past the accepted ones.
        let (output, updates) = step(&mut scheduler, &[51, 52, 53], &[51, 52, 60]);
        assert_eq!(output.scheduled[0].start_position, 7);
        assert_eq!(updates[0].new_token_ids, vec![51, 52, 60]);
        assert_eq!(updates[0].num_output_tokens, 5);
        let (output, _) = step(&mut scheduler, &[], &[61]);
        assert_eq!(output.scheduled[0].start_position, 10);
        assert_eq!(output.scheduled[0].token_ids, vec![60]);
        assert_eq!(
            scheduler.request_token_ids(RequestId(1)).unwrap()[6..],
            [40, 50, 51, 52, 60, 61]
        );
    }

    #[test]
    fn nothing_is_kept_past_a_stop_token_inside_an_accepted_run() {
        let mut scheduler = decoding(64, 32, 0);
        let (_, updates) = step(&mut scheduler, &[41, EOS, 43], &[41, EOS, 43, 44]);
        assert_eq!(updates[0].new_token_ids, vec![41, EOS]);
        assert_eq!(updates[0].finish_reason, Some(FinishReason::Stop));
        assert!(!scheduler.has_unfinished_requests());
        assert_eq!(scheduler.kv_cache_manager().num_used_blocks(), 0);
    }

    #[test]
    fn min_tokens_holds_inside_a_run_and_max_tokens_caps_the_drafts() {
        // min_tokens 3: the EOS as second output token does not stop.
        let mut scheduler = decoding(64, 32, 3);
        let (_, updates) = step(&mut scheduler, &[EOS, 42], &[EOS, 42, EOS]);
        assert_eq!(updates[0].new_token_ids, vec![EOS, 42, EOS]);
        assert_eq!(updates[0].finish_reason, Some(FinishReason::Stop));
        // max_tokens 4 with one generated: at most 2 drafts, the run then ends at length.
        let mut scheduler = decoding(64, 4, 0);
        assert!(scheduler.set_draft_token_ids(RequestId(1), &[41, 42, 43, 44]));
        let output = scheduler.schedule();
        assert_eq!(output.scheduled[0].draft_token_ids, vec![41, 42]);
        let updates = scheduler
            .update_from_token_runs(&output, &[(RequestId(1), vec![41, 42, 43])])
            .unwrap();
        assert_eq!(updates[0].new_token_ids, vec![41, 42, 43]);
        assert_eq!(updates[0].finish_reason, Some(FinishReason::Length));
    }

    #[test]
    fn the_budget_caps_the_drafts_and_a_wrong_run_changes_nothing() {
        let mut scheduler = decoding(3, 32, 0);
        assert!(scheduler.set_draft_token_ids(RequestId(1), &[41, 42, 43, 44]));
        let output = scheduler.schedule();
        assert_eq!(output.scheduled[0].token_ids, vec![40, 41, 42]);
        assert_eq!(output.total_num_scheduled_tokens, 3);
        for run in [vec![], vec![41, 43, 5], vec![41, 42, 43, 44]] {
            assert!(matches!(
                scheduler.update_from_token_runs(&output, &[(RequestId(1), run)]),
                Err(SchedulerError::InvalidTokenRun { .. })
            ));
        }
        let updates = scheduler
            .update_from_token_runs(&output, &[(RequestId(1), vec![41, 42, 7])])
            .unwrap();
        assert_eq!(updates[0].new_token_ids, vec![41, 42, 7]);
        // Drafts are used once, and only by running requests.
        let output = scheduler.schedule();
        assert!(output.scheduled[0].draft_token_ids.is_empty());
        assert!(!scheduler.set_draft_token_ids(RequestId(9), &[1]));
    }
}
