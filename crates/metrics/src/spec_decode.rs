//! Speculative decoding: vLLM's `vllm:spec_decode_*` counters, registered only when the
//! engine speculates (as vLLM does), tokenmill's count of skipped speculation, and vLLM's
//! periodic `SpecDecoding metrics: ...` log line.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Why a request decoded without drafts in a step where it could have had them; the `reason`
/// label of `tokenmill:spec_decode_skipped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecSkipReason {
    /// The step's batch was large enough to be compute-bound (`disable_by_batch_size`).
    BatchSize,
    /// The request's recent drafts were mostly rejected; it backs off for a while.
    LowAcceptance,
}

impl SpecSkipReason {
    pub const ALL: [SpecSkipReason; 2] = [SpecSkipReason::BatchSize, SpecSkipReason::LowAcceptance];

    pub fn as_str(self) -> &'static str {
        match self {
            SpecSkipReason::BatchSize => "batch_size",
            SpecSkipReason::LowAcceptance => "low_acceptance",
        }
    }
}

/// One step's speculation, summed over its requests (vLLM's `SpecDecodingStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecDecodeStats {
    /// Requests that carried drafts.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// Accepted tokens by draft position (index 0 = first draft token).
    pub num_accepted_tokens_per_pos: Vec<u64>,
    /// Request-steps decoded without drafts by the skip rule, by [`SpecSkipReason::ALL`] index.
    pub num_skipped: [u64; 2],
    /// Drafts cut to the probe length (the request's previous draft was not accepted whole).
    pub num_probes: u64,
}

impl SpecDecodeStats {
    /// Adds one request's verification: `num_draft_tokens` drafted, the first
    /// `num_accepted` of them accepted.
    pub fn observe_draft(&mut self, num_draft_tokens: usize, num_accepted: usize) {
        if num_draft_tokens == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += num_draft_tokens as u64;
        self.num_accepted_tokens += num_accepted as u64;
        if self.num_accepted_tokens_per_pos.len() < num_accepted {
            self.num_accepted_tokens_per_pos.resize(num_accepted, 0);
        }
        for count in &mut self.num_accepted_tokens_per_pos[..num_accepted] {
            *count += 1;
        }
    }

    pub fn observe_skip(&mut self, reason: SpecSkipReason) {
        self.num_skipped[reason as usize] += 1;
    }

    pub fn observe_probe(&mut self) {
        self.num_probes += 1;
    }

    fn add(&mut self, other: &SpecDecodeStats) {
        self.num_drafts += other.num_drafts;
        self.num_draft_tokens += other.num_draft_tokens;
        self.num_accepted_tokens += other.num_accepted_tokens;
        let per_pos = &other.num_accepted_tokens_per_pos;
        if self.num_accepted_tokens_per_pos.len() < per_pos.len() {
            self.num_accepted_tokens_per_pos.resize(per_pos.len(), 0);
        }
        for (sum, count) in self.num_accepted_tokens_per_pos.iter_mut().zip(per_pos) {
            *sum += count;
        }
        for (sum, count) in self.num_skipped.iter_mut().zip(other.num_skipped) {
            *sum += count;
        }
        self.num_probes += other.num_probes;
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PositionLabels {
    position: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// The registered counters; positions `0..num_speculative_tokens` exist from the start.
#[derive(Debug)]
pub(crate) struct SpecDecodeMetrics {
    num_drafts: Counter,
    num_draft_tokens: Counter,
    num_accepted_tokens: Counter,
    per_pos: Vec<Counter>,
    skipped: [Counter; 2],
    probes: Counter,
}

impl SpecDecodeMetrics {
    pub(crate) fn register(engine: &mut Registry, num_speculative_tokens: usize) -> Self {
        let per_pos_family = Family::<PositionLabels, Counter>::default();
        let per_pos = (0..num_speculative_tokens)
            .map(|position| {
                per_pos_family.get_or_create_owned(&PositionLabels {
                    position: position.to_string(),
                })
            })
            .collect();
        let skipped_family = Family::<ReasonLabels, Counter>::default();
        let skipped = SpecSkipReason::ALL.map(|reason| {
            skipped_family.get_or_create_owned(&ReasonLabels {
                reason: reason.as_str().to_string(),
            })
        });
        let metrics = SpecDecodeMetrics {
            num_drafts: Counter::default(),
            num_draft_tokens: Counter::default(),
            num_accepted_tokens: Counter::default(),
            per_pos,
            skipped,
            probes: Counter::default(),
        };
        engine.register(
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts",
            metrics.num_drafts.clone(),
        );
        engine.register(
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens",
            metrics.num_draft_tokens.clone(),
        );
        engine.register(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens",
            metrics.num_accepted_tokens.clone(),
        );
        engine.register(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position",
            per_pos_family,
        );
        engine.register(
            "tokenmill:spec_decode_skipped",
            "Request-steps decoded without drafts by the skip rule, by reason",
            skipped_family,
        );
        engine.register(
            "tokenmill:spec_decode_probe_drafts",
            "Drafts cut to the probe length because the request's previous draft was not accepted whole",
            metrics.probes.clone(),
        );
        metrics
    }

    pub(crate) fn record(&self, stats: &SpecDecodeStats) {
        self.num_drafts.inc_by(stats.num_drafts);
        self.num_draft_tokens.inc_by(stats.num_draft_tokens);
        self.num_accepted_tokens.inc_by(stats.num_accepted_tokens);
        for (counter, &count) in self.per_pos.iter().zip(&stats.num_accepted_tokens_per_pos) {
            counter.inc_by(count);
        }
        for (counter, &count) in self.skipped.iter().zip(&stats.num_skipped) {
            counter.inc_by(count);
        }
        self.probes.inc_by(stats.num_probes);
    }
}

/// Sums steps between log lines and formats vLLM's line:
///
/// `SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 30.00 tokens/s,
/// Drafted throughput: 60.00 tokens/s, Accepted: 300 tokens, Drafted: 600 tokens,
/// Per-position acceptance rate: 0.800, 0.500, 0.200, Avg Draft acceptance rate: 50.0%`
///
/// (mean acceptance length = 1 + accepted / drafts; a position's rate is its accepted count
/// over the drafts). Nothing is logged for an interval without drafts.
#[derive(Debug, Clone, Default)]
pub struct SpecDecodingLogger {
    interval: SpecDecodeStats,
    last_log_time: Option<Instant>,
}

impl SpecDecodingLogger {
    pub fn observe(&mut self, stats: &SpecDecodeStats) {
        // The first interval starts at the first step seen, so the first line's throughputs
        // have a time base too.
        self.last_log_time.get_or_insert_with(Instant::now);
        self.interval.add(stats);
    }

    /// The line for the interval ending at `now` (call it when the engine's stats line is
    /// logged), or `None` without drafts; the interval restarts either way.
    pub fn log_line(&mut self, now: Instant) -> Option<String> {
        let stats = std::mem::take(&mut self.interval);
        let elapsed = self
            .last_log_time
            .replace(now)
            .and_then(|last| now.checked_duration_since(last))
            .map_or(0.0, |elapsed| elapsed.as_secs_f64());
        if stats.num_drafts == 0 {
            return None;
        }
        let drafts = stats.num_drafts as f64;
        let throughput = |tokens: u64| {
            if elapsed > 0.0 {
                tokens as f64 / elapsed
            } else {
                0.0
            }
        };
        let per_pos: Vec<String> = stats
            .num_accepted_tokens_per_pos
            .iter()
            .map(|&count| format!("{:.3}", count as f64 / drafts))
            .collect();
        Some(format!(
            "SpecDecoding metrics: Mean acceptance length: {:.2}, Accepted throughput: {:.2} \
             tokens/s, Drafted throughput: {:.2} tokens/s, Accepted: {} tokens, Drafted: {} \
             tokens, Per-position acceptance rate: {}, Avg Draft acceptance rate: {:.1}%",
            1.0 + stats.num_accepted_tokens as f64 / drafts,
            throughput(stats.num_accepted_tokens),
            throughput(stats.num_draft_tokens),
            stats.num_accepted_tokens,
            stats.num_draft_tokens,
            per_pos.join(", "),
            100.0 * stats.num_accepted_tokens as f64 / stats.num_draft_tokens.max(1) as f64,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_log_line_is_vllms() {
        let mut stats = SpecDecodeStats::default();
        stats.observe_draft(3, 3);
        stats.observe_draft(3, 1);
        stats.observe_draft(0, 0);
        assert_eq!(stats.num_drafts, 2);
        assert_eq!(stats.num_accepted_tokens_per_pos, vec![2, 1, 1]);
        let start = Instant::now();
        let mut logger = SpecDecodingLogger::default();
        assert_eq!(logger.log_line(start), None, "no drafts yet");
        logger.observe(&stats);
        let line = logger.log_line(start + Duration::from_secs(2)).unwrap();
        assert_eq!(
            line,
            "SpecDecoding metrics: Mean acceptance length: 3.00, Accepted throughput: 2.00 \
             tokens/s, Drafted throughput: 3.00 tokens/s, Accepted: 4 tokens, Drafted: 6 \
             tokens, Per-position acceptance rate: 1.000, 0.500, 0.500, Avg Draft acceptance \
             rate: 66.7%"
        );
        assert_eq!(logger.log_line(start + Duration::from_secs(4)), None);
    }

    #[test]
    fn the_first_line_has_throughputs_too() {
        // A logger whose first line follows drafts (no earlier empty line): the interval
        // starts at the first observed step, not at the line.
        let mut stats = SpecDecodeStats::default();
        stats.observe_draft(4, 4);
        let mut logger = SpecDecodingLogger::default();
        logger.observe(&stats);
        let line = logger
            .log_line(Instant::now() + Duration::from_secs(4))
            .unwrap();
        assert!(
            line.contains("Accepted throughput: 1.00 tokens/s"),
            "{line}"
        );
    }

    #[test]
    fn counters_have_vllms_names_and_exist_only_when_speculating() {
        let config = crate::MetricsConfig {
            model_name: "m".into(),
            max_model_len: 64,
            block_size: 16,
            num_blocks: 8,
            enable_prefix_caching: true,
            cache_dtype: "auto".into(),
        };
        let plain = crate::EngineMetrics::new(config.clone()).encode().unwrap();
        assert!(!plain.contains("spec_decode"), "{plain}");
        let metrics = crate::EngineMetrics::with_spec_decode(config, Some(3));
        let mut step = crate::StepMetrics::default();
        step.spec_decode.observe_draft(3, 2);
        step.spec_decode.observe_skip(SpecSkipReason::BatchSize);
        step.spec_decode.observe_probe();
        metrics.record_step(&step);
        let scrape = metrics.encode().unwrap();
        let labels = "model_name=\"m\",engine=\"0\"";
        for line in [
            format!("vllm:spec_decode_num_drafts_total{{{labels}}} 1"),
            format!("vllm:spec_decode_num_draft_tokens_total{{{labels}}} 3"),
            format!("vllm:spec_decode_num_accepted_tokens_total{{{labels}}} 2"),
            format!(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position=\"1\"}} 1"
            ),
            format!(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position=\"2\"}} 0"
            ),
            format!("tokenmill:spec_decode_skipped_total{{{labels},reason=\"batch_size\"}} 1"),
            format!("tokenmill:spec_decode_probe_drafts_total{{{labels}}} 1"),
        ] {
            assert!(scrape.contains(&line), "{line} missing from\n{scrape}");
        }
    }
}
