//! The periodic stats line: vLLM's exact shape, interval handling and the idle DEBUG rule.

use std::time::{Duration, Instant};

use tokenmill_metrics::{StatsLogger, StepMetrics};
use tracing::Level;

const INTERVAL: Duration = Duration::from_secs(10);

fn busy(prompt_tokens: u64, generation_tokens: u64) -> StepMetrics {
    StepMetrics {
        num_running: 3,
        num_waiting: 0,
        kv_cache_usage: 0.125,
        prefix_cache_queries: 1000,
        prefix_cache_hits: 402,
        prompt_tokens,
        generation_tokens,
        iteration_tokens: 64,
        ..StepMetrics::default()
    }
}

#[test]
fn line_has_vllms_exact_shape() {
    let start = Instant::now();
    let mut logger = StatsLogger::new(INTERVAL).starting_at(start);
    logger.observe_step(&busy(100, 400));
    logger.observe_step(&busy(23, 56));
    let (level, line) = logger.maybe_log(start + INTERVAL).expect("interval is up");
    assert_eq!(level, Level::INFO);
    assert_eq!(
        line,
        "Engine 000: Avg prompt throughput: 12.3 tokens/s, Avg generation throughput: 45.6 \
         tokens/s, Running: 3 reqs, Waiting: 0 reqs, KV cache usage: 12.5%, Prefix cache hit \
         rate: 40.2%"
    );
}

#[test]
fn preemptions_appear_after_waiting_only_in_intervals_that_had_them() {
    let start = Instant::now();
    let mut logger = StatsLogger::new(INTERVAL).starting_at(start);
    logger.observe_step(&StepMetrics {
        num_preemptions: 2,
        num_waiting: 4,
        ..busy(10, 10)
    });
    logger.observe_step(&StepMetrics {
        num_preemptions: 1,
        num_waiting: 5,
        ..busy(10, 10)
    });
    let (_, line) = logger.maybe_log(start + INTERVAL).expect("interval is up");
    assert!(
        line.contains(", Waiting: 5 reqs, Preemptions: 3, KV cache usage: 12.5%"),
        "{line}"
    );

    logger.observe_step(&busy(10, 10));
    let (_, line) = logger
        .maybe_log(start + 2 * INTERVAL)
        .expect("interval is up");
    assert!(!line.contains("Preemptions"), "{line}");
    assert!(
        line.contains(", Waiting: 0 reqs, KV cache usage: "),
        "{line}"
    );
}

#[test]
fn throughput_is_over_the_actual_elapsed_time() {
    let start = Instant::now();
    let mut logger = StatsLogger::new(INTERVAL).starting_at(start);
    logger.observe_step(&busy(250, 125));
    // The engine checked late: 12.5 s have passed, not 10.
    let (_, line) = logger
        .maybe_log(start + Duration::from_millis(12_500))
        .expect("interval is up");
    assert!(
        line.starts_with(
            "Engine 000: Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 10.0 tokens/s,"
        ),
        "{line}"
    );
    // Counts were reset: the next interval starts from the last log time.
    logger.observe_step(&busy(50, 0));
    let (_, line) = logger
        .maybe_log(start + Duration::from_millis(22_500))
        .expect("interval is up");
    assert!(
        line.starts_with(
            "Engine 000: Avg prompt throughput: 5.0 tokens/s, Avg generation throughput: 0.0 tokens/s,"
        ),
        "{line}"
    );
}

#[test]
fn idle_lines_drop_to_debug_after_two_idle_intervals_in_a_row() {
    let start = Instant::now();
    let at = |intervals: u32| start + INTERVAL * intervals;
    let mut logger = StatsLogger::new(INTERVAL).starting_at(start);

    logger.observe_step(&busy(10, 10));
    assert_eq!(
        logger.maybe_log(at(1)).map(|(level, _)| level),
        Some(Level::INFO)
    );
    // First idle interval: the previous one had throughput, so still INFO.
    assert_eq!(
        logger.maybe_log(at(2)).map(|(level, _)| level),
        Some(Level::INFO)
    );
    // Second idle interval in a row.
    assert_eq!(
        logger.maybe_log(at(3)).map(|(level, _)| level),
        Some(Level::DEBUG)
    );
    assert_eq!(
        logger.maybe_log(at(4)).map(|(level, _)| level),
        Some(Level::DEBUG)
    );
    // Traffic again: back to INFO at once.
    logger.observe_step(&busy(0, 1));
    assert_eq!(
        logger.maybe_log(at(5)).map(|(level, _)| level),
        Some(Level::INFO)
    );
}

#[test]
fn an_engine_that_never_served_logs_at_debug() {
    let start = Instant::now();
    let mut logger = StatsLogger::new(INTERVAL).starting_at(start);
    let (level, line) = logger.maybe_log(start + INTERVAL).expect("interval is up");
    assert_eq!(level, Level::DEBUG);
    assert_eq!(
        line,
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 \
         tokens/s, Running: 0 reqs, Waiting: 0 reqs, KV cache usage: 0.0%, Prefix cache hit \
         rate: 0.0%"
    );
}

#[test]
fn gauges_keep_the_last_step_between_lines() {
    let start = Instant::now();
    let mut logger = StatsLogger::new(INTERVAL).starting_at(start);
    logger.observe_step(&StepMetrics {
        num_running: 7,
        num_waiting: 2,
        kv_cache_usage: 0.5,
        ..StepMetrics::default()
    });
    logger.maybe_log(start + INTERVAL).expect("interval is up");
    let (_, line) = logger
        .maybe_log(start + 2 * INTERVAL)
        .expect("interval is up");
    assert!(
        line.contains("Running: 7 reqs, Waiting: 2 reqs, KV cache usage: 50.0%"),
        "{line}"
    );
}

#[test]
fn no_line_before_the_interval_is_up() {
    let start = Instant::now();
    let mut logger = StatsLogger::new(INTERVAL).starting_at(start);
    logger.observe_step(&busy(10, 10));
    assert_eq!(logger.maybe_log(start + Duration::from_millis(9_999)), None);
    assert!(logger.maybe_log(start + INTERVAL).is_some());
    assert_eq!(
        logger.maybe_log(start + INTERVAL + Duration::from_secs(1)),
        None
    );
}
