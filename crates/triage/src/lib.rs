//! tokenmill-triage: `tokenmill triage`, the diagnosis an expert would reach by reading a
//! vLLM-compatible server's dashboards, computed from its Prometheus `/metrics`.
//!
//! Because tokenmill exposes vLLM's metric names (`vllm:*`, see `vllm-compat.md`), the same
//! code diagnoses tokenmill and vLLM servers, live or from two saved scrapes attached to a
//! ticket. The method is seed article 000's five steps (symptom, saturation, KV-cache health,
//! sequence lengths, deployment shape); the pathologies are seed article 002's (KV-cache
//! thrashing, prefill starvation, under-utilisation, block leak, prefix-cache misses). Every
//! threshold is a named constant in [`thresholds`] citing its source.
//!
//! Key types:
//! - [`Scrape`] — one parsed `/metrics` body ([`exposition`] is a small parser of the
//!   Prometheus text format).
//! - [`WindowMetrics`] — counters as increases and rates between two scrapes, histograms as
//!   quantiles of their bucket deltas (PromQL `histogram_quantile` semantics), gauges as
//!   min/mean/max/trend over the samples in the window.
//! - [`TriageReport`] — steps with verdicts and evidence, pathologies, recommendations naming
//!   flags and directions; `Display` is the human report, `Serialize` the `--json` document
//!   (versioned by [`SCHEMA_VERSION`]).
//!
//! Usage: the binary flattens [`TriageArgs`] into its `triage` subcommand and calls [`run`],
//! which scrapes the server at the start of the window, `--samples - 2` times in between and
//! at the end (or reads `--from/--to` files), then calls the pure [`diagnose`]:
//!
//! ```no_run
//! # async fn example(args: tokenmill_triage::TriageArgs) -> Result<(), tokenmill_triage::TriageError> {
//! let json = args.json;
//! let report = tokenmill_triage::run(args).await?;
//! if json {
//!     println!("{}", report.to_json().map_err(tokenmill_triage::TriageError::Json)?);
//! } else {
//!     print!("{report}");
//! }
//! # Ok(()) }
//! ```

pub mod exposition;
pub mod measure;
pub mod report;
pub mod thresholds;
pub mod window;

mod advice;
mod args;
mod live;
mod pathology;
mod steps;

use std::path::PathBuf;
use std::time::Duration;

pub use args::{parse_duration, TriageArgs};
pub use exposition::{ExpositionError, Scrape};
pub use live::run;
pub use measure::WindowMetrics;
pub use report::{
    Direction, Evidence, Pathology, PathologyFinding, Recommendation, Step, StepReport, Symptom,
    TriageReport, Unit, Verdict, SCHEMA_VERSION,
};
pub use window::SeriesFilter;

/// What the diagnosis is measured against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TriageConfig {
    /// TTFT objective; default [`thresholds::DEFAULT_TTFT_TARGET_SECONDS`].
    pub slo_ttft: Option<Duration>,
    /// Inter-token latency objective; default [`thresholds::DEFAULT_ITL_TARGET_SECONDS`].
    pub slo_itl: Option<Duration>,
    /// Only series with this `model_name` label; `None` sums all models.
    pub model_name: Option<String>,
}

impl TriageConfig {
    /// The configuration the command-line arguments ask for.
    pub fn from_args(args: &TriageArgs) -> Result<Self, TriageError> {
        let millis = |flag: &'static str, value: Option<f64>| {
            value
                .map(|ms| {
                    Duration::try_from_secs_f64(ms / 1000.0)
                        .ok()
                        .filter(|duration| !duration.is_zero())
                        .ok_or(TriageError::InvalidObjective { flag, value: ms })
                })
                .transpose()
        };
        Ok(Self {
            slo_ttft: millis("--slo-ttft", args.slo_ttft)?,
            slo_itl: millis("--slo-itl", args.slo_itl)?,
            model_name: args.model_name.clone(),
        })
    }
}

/// Why a triage could not run.
#[derive(Debug, thiserror::Error)]
pub enum TriageError {
    #[error("scraping {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("scraping {url}: HTTP status {status}{hint}", hint = status_hint(*status))]
    Status { url: String, status: u16 },
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing metrics from {origin}: {source}")]
    Parse {
        origin: String,
        #[source]
        source: ExpositionError,
    },
    #[error("no vllm:* metrics found: is this a vLLM-compatible server's /metrics?")]
    NoVllmMetrics,
    #[error("no series with model_name {model:?}; models present: {available}")]
    UnknownModel { model: String, available: String },
    #[error("{flag} must be a positive number of milliseconds, got {value}")]
    InvalidObjective { flag: &'static str, value: f64 },
    #[error("missing argument {0}")]
    MissingArgument(&'static str),
    #[error("writing the JSON report: {0}")]
    Json(#[source] serde_json::Error),
}

fn status_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (pass --api-key if the server protects /metrics)",
        404 => " (is --url the server's base URL or its /metrics URL?)",
        _ => "",
    }
}

/// The diagnosis of the window `before → after` (`elapsed` apart), with `gauge_samples` the
/// scrapes taken in between, in order and evenly spaced. Pure: no IO, no clock.
pub fn diagnose(
    before: &Scrape,
    after: &Scrape,
    gauge_samples: &[Scrape],
    elapsed: Duration,
    config: &TriageConfig,
) -> TriageReport {
    let filter = SeriesFilter {
        model_name: config.model_name.clone(),
    };
    let metrics = WindowMetrics::measure(before, after, gauge_samples, elapsed, &filter);
    let facts = steps::Facts::derive(&metrics, config);
    let steps = steps::assess(&metrics, &facts);
    let pathologies = pathology::detect(&metrics, &facts);
    let recommendations = advice::recommend(&metrics, &facts, &pathologies);
    let overall = steps
        .iter()
        .map(|step| step.verdict)
        .chain(pathologies.iter().map(|finding| finding.severity))
        .max()
        .unwrap_or(Verdict::Ok);
    TriageReport {
        schema_version: SCHEMA_VERSION,
        target: None,
        model_filter: config.model_name.clone(),
        overall,
        symptom: facts.symptom,
        steps,
        pathologies,
        recommendations,
        metrics,
    }
}
