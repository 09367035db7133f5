//! The diagnosis as data: the report, its steps, pathologies and recommendations, rendered for
//! humans by `Display` and for machines by `serde` (the `--json` document).

use std::fmt;

use serde::Serialize;

use crate::measure::WindowMetrics;

/// Version of the `--json` document. Bump on any incompatible change to its shape.
pub const SCHEMA_VERSION: u32 = 1;

/// How bad a finding is. Ordered: `Ok < Warning < Problem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warning,
    Problem,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ok => "ok",
            Self::Warning => "warning",
            Self::Problem => "problem",
        })
    }
}

/// The unit of an evidence value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Unit {
    #[serde(rename = "ms")]
    Milliseconds,
    #[serde(rename = "s")]
    Seconds,
    #[serde(rename = "%")]
    Percent,
    #[serde(rename = "tokens")]
    Tokens,
    #[serde(rename = "requests")]
    Requests,
    #[serde(rename = "req/s")]
    RequestsPerSecond,
    #[serde(rename = "tok/s")]
    TokensPerSecond,
    #[serde(rename = "/s")]
    PerSecond,
    #[serde(rename = "count")]
    Count,
    #[serde(rename = "blocks")]
    Blocks,
    #[serde(rename = "x")]
    Times,
    #[serde(rename = "pp/min")]
    PercentPointsPerMinute,
}

impl Unit {
    fn suffix(self) -> &'static str {
        match self {
            Self::Milliseconds => " ms",
            Self::Seconds => " s",
            Self::Percent => "%",
            Self::Tokens => " tokens",
            Self::Requests => " requests",
            Self::RequestsPerSecond => " req/s",
            Self::TokensPerSecond => " tok/s",
            Self::PerSecond => "/s",
            Self::Count => "",
            Self::Blocks => " blocks",
            Self::Times => "x",
            Self::PercentPointsPerMinute => " pp/min",
        }
    }
}

/// One measured number supporting a finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evidence {
    /// Stable machine key, e.g. `ttft_p95`.
    pub key: String,
    /// Human label, e.g. `TTFT p95`.
    pub label: String,
    pub value: f64,
    pub unit: Unit,
}

impl Evidence {
    pub fn new(key: &str, label: &str, value: f64, unit: Unit) -> Self {
        Self {
            key: key.to_owned(),
            label: label.to_owned(),
            value: round_significant(value),
            unit,
        }
    }

    /// A duration measured in seconds, reported in milliseconds.
    pub fn millis(key: &str, label: &str, seconds: f64) -> Self {
        Self::new(key, label, seconds * 1000.0, Unit::Milliseconds)
    }

    /// A fraction 0..1, reported in percent.
    pub fn percent(key: &str, label: &str, fraction: f64) -> Self {
        Self::new(key, label, fraction * 100.0, Unit::Percent)
    }
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}{}",
            self.label,
            format_number(self.value),
            self.unit.suffix()
        )
    }
}

/// Six significant digits: enough for any evidence, and no `37.50000000000001` in the JSON.
fn round_significant(value: f64) -> f64 {
    if !value.is_finite() || value == 0.0 {
        return value;
    }
    format!("{value:.5e}").parse().unwrap_or(value)
}

/// Short human numbers: no exponent, fewer decimals as the magnitude grows, none on integers.
pub(crate) fn format_number(value: f64) -> String {
    if !value.is_finite() {
        return format!("{value}");
    }
    let magnitude = value.abs();
    let decimals = if magnitude >= 100.0 || magnitude == magnitude.trunc() {
        0
    } else if magnitude >= 10.0 {
        1
    } else if magnitude >= 1.0 {
        2
    } else {
        3
    };
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// The five steps of the method (seed article 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Symptom,
    Saturation,
    KvCache,
    SequenceLengths,
    DeploymentShape,
}

impl Step {
    pub fn title(self) -> &'static str {
        match self {
            Self::Symptom => "symptom",
            Self::Saturation => "saturation",
            Self::KvCache => "KV cache",
            Self::SequenceLengths => "sequence lengths",
            Self::DeploymentShape => "deployment shape",
        }
    }

    fn number(self) -> u8 {
        match self {
            Self::Symptom => 1,
            Self::Saturation => 2,
            Self::KvCache => 3,
            Self::SequenceLengths => 4,
            Self::DeploymentShape => 5,
        }
    }
}

/// Where the latency is (step 1's classification).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Symptom {
    /// No request finished and nothing ran in the window.
    NoTraffic,
    /// Latencies within their objectives.
    None,
    Ttft,
    Itl,
    TtftAndItl,
    /// TTFT and ITL fine, end-to-end long: long outputs.
    E2eOnly,
}

/// One step's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepReport {
    pub step: Step,
    pub verdict: Verdict,
    pub summary: String,
    pub evidence: Vec<Evidence>,
}

/// The recognised pathologies (seed article 002, plus the split of prefill starvation by
/// queueing vs long prefills from 000 step 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pathology {
    KvCacheThrashing,
    /// TTFT high, ITL normal, requests waiting: TTFT is queueing time.
    PrefillQueueing,
    /// TTFT high, ITL normal, nothing waiting: TTFT is prefill compute.
    LongPrefills,
    UnderUtilisation,
    BlockLeak,
    PrefixCacheMisses,
    /// Speculative decoding on, most drafts rejected.
    PoorSpecAcceptance,
}

impl Pathology {
    pub fn title(self) -> &'static str {
        match self {
            Self::KvCacheThrashing => "KV-cache thrashing",
            Self::PrefillQueueing => "prefill starvation (queueing)",
            Self::LongPrefills => "prefill starvation (long prefills)",
            Self::UnderUtilisation => "under-utilisation",
            Self::BlockLeak => "KV block leak",
            Self::PrefixCacheMisses => "prefix-cache misses",
            Self::PoorSpecAcceptance => "poor speculative acceptance",
        }
    }
}

/// A detected pathology with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathologyFinding {
    pub pathology: Pathology,
    pub title: String,
    pub severity: Verdict,
    pub summary: String,
    pub evidence: Vec<Evidence>,
}

/// Which way to move a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Increase,
    Decrease,
    Enable,
    /// Switch a feature off.
    Disable,
    /// Change how clients build prompts (no server flag).
    Restructure,
    /// Add replicas.
    ScaleOut,
    /// Fewer replicas or more traffic per replica.
    ScaleIn,
    /// Look into the server itself (a bug, not a setting).
    Investigate,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Increase => "raise",
            Self::Decrease => "lower",
            Self::Enable => "enable",
            Self::Disable => "disable",
            Self::Restructure => "restructure",
            Self::ScaleOut => "scale out",
            Self::ScaleIn => "scale in",
            Self::Investigate => "investigate",
        })
    }
}

/// A concrete change, naming the flag and the direction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    /// The server flag, e.g. `--max-num-seqs`; `None` for prompts, replicas and bugs.
    pub flag: Option<String>,
    pub direction: Direction,
    /// A suggested value, when the evidence supports one.
    pub suggested_value: Option<f64>,
    pub action: String,
    /// The findings that call for it.
    pub because: Vec<String>,
}

impl fmt::Display for Recommendation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.action)?;
        if !self.because.is_empty() {
            write!(f, " [because: {}]", self.because.join("; "))?;
        }
        Ok(())
    }
}

/// The full diagnosis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TriageReport {
    pub schema_version: u32,
    /// What was diagnosed: the scraped URL, or the offline files.
    pub target: Option<String>,
    /// The `model_name` the diagnosis was restricted to; `None` = all models summed.
    pub model_filter: Option<String>,
    pub overall: Verdict,
    pub symptom: Symptom,
    pub steps: Vec<StepReport>,
    pub pathologies: Vec<PathologyFinding>,
    pub recommendations: Vec<Recommendation>,
    pub metrics: WindowMetrics,
}

impl TriageReport {
    /// The finding for `pathology`, if it was detected.
    pub fn pathology(&self, pathology: Pathology) -> Option<&PathologyFinding> {
        self.pathologies
            .iter()
            .find(|finding| finding.pathology == pathology)
    }

    /// The outcome of `step`.
    pub fn step(&self, step: Step) -> Option<&StepReport> {
        self.steps.iter().find(|report| report.step == step)
    }

    /// Whether some recommendation names `flag` with `direction`.
    pub fn recommends(&self, flag: &str, direction: Direction) -> bool {
        self.recommendations
            .iter()
            .any(|rec| rec.flag.as_deref() == Some(flag) && rec.direction == direction)
    }

    /// The `--json` document.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

fn join_evidence(evidence: &[Evidence]) -> String {
    evidence
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for TriageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let metrics = &self.metrics;
        write!(f, "tokenmill triage")?;
        if let Some(target) = &self.target {
            write!(f, " of {target}")?;
        }
        let models = match &self.model_filter {
            Some(model) => model.clone(),
            None if metrics.model_names.is_empty() => "-".to_owned(),
            None => metrics.model_names.join(", "),
        };
        writeln!(
            f,
            ": window {} s, {} gauge samples, model {models}, {} engine(s)",
            format_number(metrics.window_seconds),
            metrics.gauge_sample_count,
            metrics.engines,
        )?;
        writeln!(f, "overall: {}", self.overall.to_string().to_uppercase())?;
        writeln!(f)?;
        writeln!(f, "steps:")?;
        for step in &self.steps {
            write!(
                f,
                "  {}. {:<17} {:<10}{}",
                step.step.number(),
                step.step.title(),
                format!("[{}]", step.verdict),
                step.summary
            )?;
            if !step.evidence.is_empty() {
                write!(f, " ({})", join_evidence(&step.evidence))?;
            }
            writeln!(f)?;
        }
        writeln!(f)?;
        if self.pathologies.is_empty() {
            writeln!(f, "pathologies: none detected")?;
        } else {
            writeln!(f, "pathologies:")?;
            for finding in &self.pathologies {
                writeln!(
                    f,
                    "  - {} [{}]: {}",
                    finding.title, finding.severity, finding.summary
                )?;
                if !finding.evidence.is_empty() {
                    writeln!(f, "      evidence: {}", join_evidence(&finding.evidence))?;
                }
            }
        }
        writeln!(f)?;
        if self.recommendations.is_empty() {
            writeln!(f, "recommendations: none")?;
        } else {
            writeln!(f, "recommendations:")?;
            for (index, recommendation) in self.recommendations.iter().enumerate() {
                writeln!(f, "  {}. {recommendation}", index + 1)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short_and_readable() {
        assert_eq!(format_number(1234.56), "1235");
        assert_eq!(format_number(42.0), "42");
        assert_eq!(format_number(12.34), "12.3");
        assert_eq!(format_number(1.5), "1.5");
        assert_eq!(format_number(0.0421), "0.042");
        assert_eq!(format_number(0.0), "0");
    }

    #[test]
    fn evidence_values_are_rounded_to_six_significant_digits() {
        let evidence = Evidence::millis("itl_p50", "ITL p50", 0.037_500_000_000_000_01);
        assert_eq!(evidence.value, 37.5);
        assert_eq!(
            Evidence::new("x", "x", 1234.5678, Unit::Count).value,
            1234.57
        );
    }

    #[test]
    fn evidence_renders_with_its_unit() {
        assert_eq!(
            Evidence::millis("ttft_p95", "TTFT p95", 0.25).to_string(),
            "TTFT p95 250 ms"
        );
        assert_eq!(
            Evidence::percent("kv", "KV usage", 0.998).to_string(),
            "KV usage 99.8%"
        );
    }
}
