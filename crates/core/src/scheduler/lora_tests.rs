//! The `--max-loras` admission constraint and per-adapter prefix-cache isolation.

use super::tests::{config, request, step_with};
use super::*;

fn with_adapter(id: u64, prompt_len: usize, max_tokens: u32, adapter: Option<u32>) -> Request {
    let mut request = request(id, prompt_len, max_tokens);
    request.adapter_id = adapter;
    request
}

fn running_ids(output: &SchedulerOutput) -> Vec<u64> {
    output.scheduled.iter().map(|s| s.request_id.0).collect()
}

#[test]
fn at_most_max_loras_distinct_adapters_run_and_the_others_wait() {
    let mut scheduler = Scheduler::new(config(64, 64)).unwrap();
    scheduler.set_max_loras(Some(2));
    for (id, adapter) in [
        (1, Some(7)),
        (2, Some(8)),
        (3, Some(9)),
        (4, None),
        (5, Some(7)),
    ] {
        let max_tokens = if id == 1 { 2 } else { 6 };
        scheduler
            .add_request(with_adapter(id, 4, max_tokens, adapter))
            .unwrap();
    }
    let (output, _) = step_with(&mut scheduler, 1);
    // Adapter 9 would be a third: request 3 waits; the base request and a second request of
    // a running adapter are admitted past it.
    assert_eq!(running_ids(&output), vec![1, 2, 4, 5]);
    let stats = scheduler.lora_stats();
    assert_eq!(stats.running, BTreeMap::from([(7, 2), (8, 1)]));
    assert_eq!(stats.waiting, BTreeMap::from([(9, 1)]));
    // Request 1 finishes; adapter 7 still runs in request 5, so 9 still waits.
    let (_, updates) = step_with(&mut scheduler, 1);
    assert!(updates
        .iter()
        .any(|u| u.request_id.0 == 1 && u.finish_reason.is_some()));
    let (output, _) = step_with(&mut scheduler, 1);
    assert!(!running_ids(&output).contains(&3));
    // Once adapters 7 and 8 are gone, 9 is admitted, and never alongside both.
    for _ in 0..8 {
        let (output, _) = step_with(&mut scheduler, 1);
        if running_ids(&output).contains(&3) {
            assert!(!running_ids(&output).contains(&2) || !running_ids(&output).contains(&5));
            assert_eq!(scheduler.lora_stats().waiting, BTreeMap::new());
            return;
        }
    }
    panic!("request 3 was never admitted");
}

#[test]
fn without_a_limit_every_adapter_is_admitted() {
    let mut scheduler = Scheduler::new(config(64, 64)).unwrap();
    for id in 1..=4 {
        scheduler
            .add_request(with_adapter(id, 4, 2, Some(id as u32)))
            .unwrap();
    }
    let (output, _) = step_with(&mut scheduler, 1);
    assert_eq!(running_ids(&output), vec![1, 2, 3, 4]);
}

#[test]
fn adapters_never_share_prefix_cache_blocks() {
    let mut scheduler = Scheduler::new(config(64, 64)).unwrap();
    let prompt: Vec<u32> = (0..10).collect();
    let submit = |scheduler: &mut Scheduler, id: u64, adapter: Option<u32>| {
        let mut request = Request::new(RequestId(id), prompt.clone(), 1);
        request.adapter_id = adapter;
        scheduler.add_request(request).unwrap();
        let (output, _) = step_with(scheduler, 1);
        output.scheduled[0].num_cached_tokens
    };
    assert_eq!(submit(&mut scheduler, 1, Some(1)), 0);
    assert_eq!(submit(&mut scheduler, 2, Some(2)), 0, "another adapter hit");
    assert_eq!(submit(&mut scheduler, 3, None), 0, "the base model hit");
    assert_eq!(
        submit(&mut scheduler, 4, Some(1)),
        8,
        "the same adapter missed"
    );
    assert_eq!(submit(&mut scheduler, 5, None), 8, "the base model missed");
}
