//! The periodic engine stats line, in vLLM's shape:
//!
//! `Engine 000: Avg prompt throughput: 12.3 tokens/s, Avg generation throughput: 45.6 tokens/s,
//! Running: 3 reqs, Waiting: 0 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 40.2%`
//!
//! with `Preemptions: N` after `Waiting` when the interval had any (vLLM's placement). The
//! logger is pure: it never reads a clock, the caller passes `now`, so the interval and idle
//! logic are unit-testable. It says `KV cache usage` where a GPU build of vLLM says
//! `GPU KV cache usage`, since tokenmill's cache lives in host memory.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tracing::Level;

use crate::engine_metrics::StepMetrics;

/// How many recent steps with prefix-cache lookups the hit rate covers. vLLM averages over its
/// last 1000 requests; steps are what the engine reports here, and the window keeps the rate
/// about the recent past rather than the whole uptime.
pub const PREFIX_CACHE_WINDOW_STEPS: usize = 1000;

/// Accumulates step stats between log lines and formats the line when the interval is up.
#[derive(Debug, Clone)]
pub struct StatsLogger {
    interval: Duration,
    engine_index: usize,
    last_log_time: Option<Instant>,
    interval_prompt_tokens: u64,
    interval_generation_tokens: u64,
    interval_preemptions: u64,
    last_prompt_throughput: f64,
    last_generation_throughput: f64,
    num_running: usize,
    num_waiting: usize,
    kv_cache_usage: f64,
    prefix_cache_window: VecDeque<(u64, u64)>,
    prefix_cache_window_queries: u64,
    prefix_cache_window_hits: u64,
}

impl StatsLogger {
    /// A logger for engine 0 whose first interval starts at the first `maybe_log` call.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            engine_index: 0,
            last_log_time: None,
            interval_prompt_tokens: 0,
            interval_generation_tokens: 0,
            interval_preemptions: 0,
            last_prompt_throughput: 0.0,
            last_generation_throughput: 0.0,
            num_running: 0,
            num_waiting: 0,
            kv_cache_usage: 0.0,
            prefix_cache_window: VecDeque::new(),
            prefix_cache_window_queries: 0,
            prefix_cache_window_hits: 0,
        }
    }

    /// A logger for data-parallel engine `index` (`Engine 001: ...`).
    pub fn for_engine(mut self, index: usize) -> Self {
        self.engine_index = index;
        self
    }

    /// Starts the first interval at `start` (the engine's start-up) instead of at the first
    /// `maybe_log` call.
    pub fn starting_at(mut self, start: Instant) -> Self {
        self.last_log_time = Some(start);
        self
    }

    /// The log interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Adds one engine step's counts and takes its gauges as the current state.
    pub fn observe_step(&mut self, step: &StepMetrics) {
        self.interval_prompt_tokens += step.prompt_tokens;
        self.interval_generation_tokens += step.generation_tokens;
        self.interval_preemptions += step.num_preemptions;
        self.num_running = step.num_running;
        self.num_waiting = step.num_waiting;
        self.kv_cache_usage = step.kv_cache_usage;
        if step.prefix_cache_queries > 0 {
            self.prefix_cache_window
                .push_back((step.prefix_cache_queries, step.prefix_cache_hits));
            self.prefix_cache_window_queries += step.prefix_cache_queries;
            self.prefix_cache_window_hits += step.prefix_cache_hits;
            while self.prefix_cache_window.len() > PREFIX_CACHE_WINDOW_STEPS {
                if let Some((queries, hits)) = self.prefix_cache_window.pop_front() {
                    self.prefix_cache_window_queries -= queries;
                    self.prefix_cache_window_hits -= hits;
                }
            }
        }
    }

    /// The line to log if a full interval has passed since the last one, with its level:
    /// `Debug` when this interval and the one before both had zero throughput (vLLM's
    /// "avoid log noise on an idle production system"), `Info` otherwise.
    pub fn maybe_log(&mut self, now: Instant) -> Option<(Level, String)> {
        let Some(last_log_time) = self.last_log_time else {
            self.last_log_time = Some(now);
            return None;
        };
        let elapsed = now.checked_duration_since(last_log_time)?;
        if elapsed < self.interval {
            return None;
        }
        let elapsed_seconds = elapsed.as_secs_f64();
        let throughput = |tokens: u64| {
            if elapsed_seconds > 0.0 {
                tokens as f64 / elapsed_seconds
            } else {
                0.0
            }
        };
        let prompt_throughput = throughput(self.interval_prompt_tokens);
        let generation_throughput = throughput(self.interval_generation_tokens);
        let idle = prompt_throughput == 0.0
            && generation_throughput == 0.0
            && self.last_prompt_throughput == 0.0
            && self.last_generation_throughput == 0.0;
        let level = if idle { Level::DEBUG } else { Level::INFO };

        let mut line = format!(
            "Engine {:03}: Avg prompt throughput: {:.1} tokens/s, \
             Avg generation throughput: {:.1} tokens/s, Running: {} reqs, Waiting: {} reqs",
            self.engine_index,
            prompt_throughput,
            generation_throughput,
            self.num_running,
            self.num_waiting,
        );
        if self.interval_preemptions > 0 {
            line.push_str(&format!(", Preemptions: {}", self.interval_preemptions));
        }
        line.push_str(&format!(
            ", KV cache usage: {:.1}%, Prefix cache hit rate: {:.1}%",
            self.kv_cache_usage * 100.0,
            self.prefix_cache_hit_rate() * 100.0,
        ));

        self.last_prompt_throughput = prompt_throughput;
        self.last_generation_throughput = generation_throughput;
        self.last_log_time = Some(now);
        self.interval_prompt_tokens = 0;
        self.interval_generation_tokens = 0;
        self.interval_preemptions = 0;
        Some((level, line))
    }

    /// Hits over queries across the recent window; 0 before any lookup.
    pub fn prefix_cache_hit_rate(&self) -> f64 {
        if self.prefix_cache_window_queries == 0 {
            0.0
        } else {
            self.prefix_cache_window_hits as f64 / self.prefix_cache_window_queries as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy_step() -> StepMetrics {
        StepMetrics {
            num_running: 3,
            num_waiting: 1,
            kv_cache_usage: 0.125,
            prefix_cache_queries: 100,
            prefix_cache_hits: 40,
            prompt_tokens: 50,
            generation_tokens: 20,
            iteration_tokens: 70,
            ..StepMetrics::default()
        }
    }

    #[test]
    fn nothing_is_logged_before_the_interval_is_up() {
        let start = Instant::now();
        let mut logger = StatsLogger::new(Duration::from_secs(10)).starting_at(start);
        logger.observe_step(&busy_step());
        assert_eq!(logger.maybe_log(start + Duration::from_secs(9)), None);
        assert!(logger.maybe_log(start + Duration::from_secs(10)).is_some());
    }

    #[test]
    fn first_maybe_log_starts_the_interval_when_no_start_was_given() {
        let start = Instant::now();
        let mut logger = StatsLogger::new(Duration::from_secs(5));
        assert_eq!(logger.maybe_log(start), None);
        assert_eq!(logger.maybe_log(start + Duration::from_secs(4)), None);
        assert!(logger.maybe_log(start + Duration::from_secs(5)).is_some());
    }

    #[test]
    fn a_clock_going_backwards_logs_nothing() {
        let start = Instant::now() + Duration::from_secs(100);
        let mut logger = StatsLogger::new(Duration::from_secs(1)).starting_at(start);
        assert_eq!(logger.maybe_log(start - Duration::from_secs(50)), None);
    }

    #[test]
    fn prefix_hit_rate_window_forgets_old_steps() {
        let mut logger = StatsLogger::new(Duration::from_secs(1));
        let miss = StepMetrics {
            prefix_cache_queries: 10,
            prefix_cache_hits: 0,
            ..StepMetrics::default()
        };
        let hit = StepMetrics {
            prefix_cache_queries: 10,
            prefix_cache_hits: 10,
            ..StepMetrics::default()
        };
        logger.observe_step(&miss);
        for _ in 0..PREFIX_CACHE_WINDOW_STEPS {
            logger.observe_step(&hit);
        }
        assert_eq!(logger.prefix_cache_hit_rate(), 1.0);
    }
}
