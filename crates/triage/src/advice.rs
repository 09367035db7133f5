//! Recommendations: what to change, naming the flag and the direction, derived from the
//! pathologies first and then from the steps that found something the pathologies do not
//! cover. Remedies follow seed articles 000 (remediation steps) and 002 (each pathology's fix).

use crate::measure::WindowMetrics;
use crate::report::{
    format_number, Direction, Pathology, PathologyFinding, Recommendation, Symptom,
};
use crate::steps::Facts;
use crate::thresholds::*;

const MAX_NUM_SEQS: &str = "--max-num-seqs";
const MAX_NUM_BATCHED_TOKENS: &str = "--max-num-batched-tokens";
const KV_CACHE_MEMORY: &str = "--kv-cache-memory";
const KV_CACHE_DTYPE: &str = "--kv-cache-dtype";
const MAX_MODEL_LEN: &str = "--max-model-len";
const ENABLE_PREFIX_CACHING: &str = "--enable-prefix-caching";
const QUANTIZATION: &str = "--quantization";
const SPECULATIVE_CONFIG: &str = "--speculative-config";

#[derive(Default)]
struct Advice {
    recommendations: Vec<Recommendation>,
}

impl Advice {
    /// Adds a recommendation, or merges its reason into an earlier one for the same change.
    fn add(
        &mut self,
        flag: Option<&str>,
        direction: Direction,
        suggested_value: Option<f64>,
        action: String,
        because: &str,
    ) {
        let same = |rec: &Recommendation| match flag {
            Some(flag) => rec.flag.as_deref() == Some(flag) && rec.direction == direction,
            None => rec.flag.is_none() && rec.direction == direction && rec.action == action,
        };
        if let Some(existing) = self.recommendations.iter_mut().find(|rec| same(rec)) {
            if !existing.because.iter().any(|reason| reason == because) {
                existing.because.push(because.to_owned());
            }
            if existing.suggested_value.is_none() {
                existing.suggested_value = suggested_value;
            }
            return;
        }
        self.recommendations.push(Recommendation {
            flag: flag.map(str::to_owned),
            direction,
            suggested_value,
            action,
            because: vec![because.to_owned()],
        });
    }

    fn more_kv_memory(&mut self, because: &str) {
        self.add(
            Some(KV_CACHE_MEMORY),
            Direction::Increase,
            None,
            format!(
                "raise {KV_CACHE_MEMORY} (vLLM: --gpu-memory-utilization) to give the KV pool more blocks"
            ),
            because,
        );
        self.add(
            Some(KV_CACHE_DTYPE),
            Direction::Decrease,
            None,
            format!(
                "shrink each cached token: {KV_CACHE_DTYPE} fp8 (2x the tokens of a 16-bit cache such as vLLM's and tokenmill's auto, 4x of an f32 one) or quantized weights (vLLM: {QUANTIZATION}; tokenmill: a Q4_K_M or Q4_0 GGUF) to free memory for the cache"
            ),
            because,
        );
    }

    fn replicas(&mut self, because: &str) {
        self.add(
            None,
            Direction::ScaleOut,
            None,
            "add replicas (data parallelism) to spread the load; replicas scale without inter-GPU traffic".to_owned(),
            because,
        );
    }
}

pub(crate) fn recommend(
    metrics: &WindowMetrics,
    facts: &Facts,
    findings: &[PathologyFinding],
) -> Vec<Recommendation> {
    let mut advice = Advice::default();
    let found = |pathology: Pathology| findings.iter().any(|f| f.pathology == pathology);
    let decode_fine = !facts.itl.is_elevated();

    if found(Pathology::KvCacheThrashing) {
        let because = Pathology::KvCacheThrashing.title();
        let safe = safe_max_num_seqs(metrics, facts);
        let action = match (safe, facts.running_max) {
            (Some(safe), _) => format!(
                "lower {MAX_NUM_SEQS} to about {} so the admitted sequences fit in {}% of the KV pool",
                format_number(safe),
                format_number(KV_SAFE_FRACTION * 100.0)
            ),
            (None, Some(running)) => format!(
                "lower {MAX_NUM_SEQS} below the {} requests seen running so the scheduler stops admitting what it must preempt",
                format_number(running)
            ),
            (None, None) => format!("lower {MAX_NUM_SEQS} so the scheduler stops admitting what it must preempt"),
        };
        advice.add(
            Some(MAX_NUM_SEQS),
            Direction::Decrease,
            safe,
            action,
            because,
        );
        advice.more_kv_memory(because);
        advice.replicas(because);
    }

    if found(Pathology::PrefillQueueing) {
        let because = Pathology::PrefillQueueing.title();
        raise_batch_cap_if_pinned(&mut advice, facts, decode_fine, because);
        if facts
            .kv_mean
            .is_some_and(|usage| usage >= KV_PRESSURE_USAGE)
        {
            advice.more_kv_memory(because);
        }
        advice.replicas(because);
    }

    if found(Pathology::LongPrefills) {
        let because = Pathology::LongPrefills.title();
        prefix_caching_and_prompts(&mut advice, metrics, because);
        advice.add(
            Some(MAX_NUM_BATCHED_TOKENS),
            Direction::Increase,
            None,
            format!(
                "raise {MAX_NUM_BATCHED_TOKENS} so each step prefills a larger chunk (faster TTFT, at some ITL cost)"
            ),
            because,
        );
        if facts.prompt_p95.is_some_and(|p95| p95 > LONG_PROMPT_TOKENS) {
            advice.add(
                Some(MAX_MODEL_LEN),
                Direction::Decrease,
                None,
                format!(
                    "shorten prompts (retrieved context, history) or cap them with a lower {MAX_MODEL_LEN} if the longest ones are not needed"
                ),
                because,
            );
        }
    }

    if found(Pathology::UnderUtilisation) {
        let running = facts.running_mean.map_or_else(String::new, |mean| {
            format!(" (the batch averages {} requests)", format_number(mean))
        });
        advice.add(
            None,
            Direction::ScaleIn,
            None,
            format!("consolidate replicas or route more traffic to this server{running}"),
            Pathology::UnderUtilisation.title(),
        );
    }

    if found(Pathology::BlockLeak) {
        advice.add(
            None,
            Direction::Investigate,
            None,
            "KV blocks are held by no request: restart the server to reclaim them and report it; every exit path (finish, abort, disconnect, error) must free its blocks".to_owned(),
            Pathology::BlockLeak.title(),
        );
    }

    if found(Pathology::PrefixCacheMisses) {
        let because = Pathology::PrefixCacheMisses.title();
        prefix_caching_and_prompts(&mut advice, metrics, because);
        advice.add(
            None,
            Direction::Restructure,
            None,
            "route requests that share a prefix to the same replica".to_owned(),
            because,
        );
        if facts
            .kv_mean
            .is_some_and(|usage| usage >= KV_PRESSURE_USAGE)
        {
            advice.more_kv_memory(because);
        }
    }

    if found(Pathology::PoorSpecAcceptance) {
        advice.add(
            Some(SPECULATIVE_CONFIG),
            Direction::Disable,
            None,
            format!(
                "switch speculative decoding off (drop {SPECULATIVE_CONFIG}) for this workload, or keep it only for input-grounded traffic (code edits, quoting from context) where drafts are accepted"
            ),
            Pathology::PoorSpecAcceptance.title(),
        );
    }

    // Steps whose findings no pathology covers.
    if facts.preemptions > PREEMPTIONS_PROBLEM && !found(Pathology::KvCacheThrashing) {
        // Preempted without a high-usage sample (the gauge is sampled, preemption is not):
        // 000 step 3 still says to lower max_num_seqs when the counter climbs.
        let because = "requests were preempted";
        advice.add(
            Some(MAX_NUM_SEQS),
            Direction::Decrease,
            safe_max_num_seqs(metrics, facts),
            format!("lower {MAX_NUM_SEQS} so the scheduler stops admitting what it must preempt"),
            because,
        );
        advice.more_kv_memory(because);
    }
    if matches!(facts.symptom, Symptom::Itl | Symptom::TtftAndItl) {
        let because = "ITL above its target";
        advice.add(
            Some(MAX_NUM_SEQS),
            Direction::Decrease,
            None,
            format!("lower {MAX_NUM_SEQS}: inter-token latency grows with the running batch"),
            because,
        );
        advice.add(
            Some(MAX_NUM_BATCHED_TOKENS),
            Direction::Decrease,
            None,
            format!(
                "lower {MAX_NUM_BATCHED_TOKENS} so long prefills are cut into smaller chunks that stall decode steps less"
            ),
            because,
        );
        advice.add(
            Some(QUANTIZATION),
            Direction::Enable,
            None,
            format!("serve quantized weights (vLLM: {QUANTIZATION} fp8/awq/gptq or a pre-quantized checkpoint; tokenmill: a Q4_K_M or Q4_0 GGUF): decode reads fewer bytes per token"),
            because,
        );
    }
    if facts.sustained_queue {
        let because = "requests wait at every sample";
        raise_batch_cap_if_pinned(&mut advice, facts, decode_fine, because);
        advice.replicas(because);
    }
    if facts
        .concurrency_at_p95
        .is_some_and(|concurrency| concurrency < MIN_CONCURRENCY_AT_P95)
    {
        let because = "KV pool holds fewer than two p95-sized requests";
        advice.more_kv_memory(because);
        advice.add(
            Some(MAX_MODEL_LEN),
            Direction::Decrease,
            None,
            format!("lower {MAX_MODEL_LEN} if the longest requests are not needed, so one request cannot take most of the pool"),
            because,
        );
    }
    let caching_off = metrics
        .cache_config
        .as_ref()
        .is_some_and(|config| config.enable_prefix_caching == Some(false));
    if caching_off && facts.ttft.is_elevated() {
        advice.add(
            Some(ENABLE_PREFIX_CACHING),
            Direction::Enable,
            None,
            format!("turn on {ENABLE_PREFIX_CACHING} so shared prompt prefixes skip prefill"),
            "TTFT above its target",
        );
    }
    advice.recommendations
}

/// Raises max_num_seqs only when the batch is pinned at it with KV room and decode is not the
/// problem (a bigger batch would make a high ITL worse). A window with preemptions has no
/// pinned cap (`Facts::max_num_seqs_exact`): there more sequences would thrash.
fn raise_batch_cap_if_pinned(advice: &mut Advice, facts: &Facts, decode_fine: bool, because: &str) {
    let Some(cap) = facts.max_num_seqs_exact else {
        return;
    };
    if !facts.kv_headroom() || !decode_fine {
        return;
    }
    let usage = facts.kv_mean.unwrap_or(0.0) * 100.0;
    advice.add(
        Some(MAX_NUM_SEQS),
        Direction::Increase,
        None,
        format!(
            "raise {MAX_NUM_SEQS} above {}: the batch is pinned there while requests wait and KV usage is only {}%",
            format_number(cap),
            format_number(usage)
        ),
        because,
    );
}

fn prefix_caching_and_prompts(advice: &mut Advice, metrics: &WindowMetrics, because: &str) {
    let caching = metrics
        .cache_config
        .as_ref()
        .and_then(|config| config.enable_prefix_caching);
    if caching == Some(false) {
        advice.add(
            Some(ENABLE_PREFIX_CACHING),
            Direction::Enable,
            None,
            format!("turn on {ENABLE_PREFIX_CACHING} so shared prompt prefixes skip prefill"),
            because,
        );
    }
    advice.add(
        None,
        Direction::Restructure,
        None,
        "put the shared system prompt and static instructions first, byte-identical across requests, and per-request content (ids, timestamps, retrieved context) after it".to_owned(),
        because,
    );
}

/// 002's sizing rule: KV capacity × 0.85 over the mean tokens one request holds, when that is
/// below the batch actually seen (otherwise the rule gives no useful lower value).
fn safe_max_num_seqs(metrics: &WindowMetrics, facts: &Facts) -> Option<f64> {
    let capacity = metrics.cache_config.as_ref()?.capacity_tokens?;
    let prompt = metrics.prompt_length.and_then(|d| d.mean)?;
    let output = metrics.output_length.and_then(|d| d.mean).unwrap_or(0.0);
    let per_request = prompt + output;
    if per_request <= 0.0 {
        return None;
    }
    let safe = (capacity * KV_SAFE_FRACTION / per_request).floor().max(1.0);
    facts
        .running_max
        .filter(|&running| safe < running)
        .map(|_| safe)
}
