//! Getting the scrapes: from a live server over HTTP across the window, or from saved files.

use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::time::Instant;

use crate::exposition::Scrape;
use crate::{diagnose, TriageArgs, TriageConfig, TriageError, TriageReport};

/// Runs `tokenmill triage`: live scraping when `--url` is given, offline over `--from/--to`
/// otherwise, then the diagnosis.
pub async fn run(args: TriageArgs) -> Result<TriageReport, TriageError> {
    let config = TriageConfig::from_args(&args)?;
    if let Some(from) = &args.from {
        let to = args
            .to
            .as_deref()
            .ok_or(TriageError::MissingArgument("--to"))?;
        let elapsed = args
            .elapsed
            .ok_or(TriageError::MissingArgument("--elapsed"))?;
        let before = read_scrape(from)?;
        let after = read_scrape(to)?;
        let samples = args
            .sample_files
            .iter()
            .map(|path| read_scrape(path))
            .collect::<Result<Vec<_>, _>>()?;
        let mut report = diagnose_checked(&before, &after, &samples, elapsed, &config)?;
        report.target = Some(format!("{} → {}", from.display(), to.display()));
        return Ok(report);
    }
    let url = args
        .url
        .as_deref()
        .ok_or(TriageError::MissingArgument("--url"))?;
    let scraper = Scraper::new(url, args.api_key.as_deref())?;
    let intervals = args.samples.max(2) - 1;
    let start = Instant::now();
    let progress = WindowProgress::start(&scraper.url, args.window, intervals + 1, start);
    let before = scraper.scrape().await?;
    let mut samples = Vec::new();
    for index in 1..intervals {
        tokio::time::sleep_until(
            start + args.window.mul_f64(f64::from(index) / f64::from(intervals)),
        )
        .await;
        samples.push(scraper.scrape().await?);
    }
    tokio::time::sleep_until(start + args.window).await;
    let after = scraper.scrape().await?;
    progress.finish();
    // The measured span between the two scrapes, not the requested one: rates use it.
    let elapsed = start.elapsed();
    let mut report = diagnose_checked(&before, &after, &samples, elapsed, &config)?;
    report.target = Some(scraper.url);
    Ok(report)
}

/// What the user sees while the window runs (on stderr, so the report on stdout stays
/// clean): a line saying what is watched and for how long, then a bar on a terminal.
struct WindowProgress {
    bar: ProgressBar,
    ticker: tokio::task::JoinHandle<()>,
}

impl WindowProgress {
    fn start(url: &str, window: Duration, scrapes: u32, start: Instant) -> WindowProgress {
        eprintln!(
            "triage: watching {url} for {:.0} s ({scrapes} scrapes of /metrics)",
            window.as_secs_f64()
        );
        let total = window.as_millis().max(1) as u64;
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template("{wide_bar} {msg}") {
            bar.set_style(style);
        }
        let ticker = {
            let bar = bar.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(Duration::from_millis(250));
                loop {
                    interval.tick().await;
                    let elapsed = start.elapsed();
                    bar.set_position((elapsed.as_millis() as u64).min(total));
                    bar.set_message(format!(
                        "{:.0}/{:.0} s",
                        elapsed.as_secs_f64().min(window.as_secs_f64()),
                        window.as_secs_f64()
                    ));
                }
            })
        };
        WindowProgress { bar, ticker }
    }

    fn finish(self) {}
}

/// Also on an early return (a failed scrape): the ticker stops and the bar goes.
impl Drop for WindowProgress {
    fn drop(&mut self) {
        self.ticker.abort();
        self.bar.finish_and_clear();
    }
}

/// `diagnose`, refusing input that is not a vLLM-compatible server's metrics or that has no
/// series for the requested model.
fn diagnose_checked(
    before: &Scrape,
    after: &Scrape,
    samples: &[Scrape],
    elapsed: Duration,
    config: &TriageConfig,
) -> Result<TriageReport, TriageError> {
    if !after.has_samples_with_prefix("vllm:") {
        return Err(TriageError::NoVllmMetrics);
    }
    let report = diagnose(before, after, samples, elapsed, config);
    if let Some(model) = &config.model_name {
        if !report.metrics.model_names.contains(model) {
            return Err(TriageError::UnknownModel {
                model: model.clone(),
                available: report.metrics.model_names.join(", "),
            });
        }
    }
    Ok(report)
}

fn read_scrape(path: &Path) -> Result<Scrape, TriageError> {
    let text = std::fs::read_to_string(path).map_err(|source| TriageError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Scrape::parse(&text).map_err(|source| TriageError::Parse {
        origin: path.display().to_string(),
        source,
    })
}

struct Scraper {
    client: reqwest::Client,
    url: String,
    api_key: Option<String>,
}

impl Scraper {
    fn new(url: &str, api_key: Option<&str>) -> Result<Self, TriageError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|source| TriageError::Http {
                url: url.to_owned(),
                source,
            })?;
        Ok(Self {
            client,
            url: metrics_url(url),
            api_key: api_key.map(str::to_owned),
        })
    }

    async fn scrape(&self) -> Result<Scrape, TriageError> {
        let http_error = |source| TriageError::Http {
            url: self.url.clone(),
            source,
        };
        let mut request = self.client.get(&self.url);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(http_error)?;
        let status = response.status();
        if !status.is_success() {
            return Err(TriageError::Status {
                url: self.url.clone(),
                status: status.as_u16(),
            });
        }
        let body = response.text().await.map_err(http_error)?;
        Scrape::parse(&body).map_err(|source| TriageError::Parse {
            origin: self.url.clone(),
            source,
        })
    }
}

/// `http://host:8000` and `http://host:8000/` become `http://host:8000/metrics`; a URL with
/// any other path is used as given.
fn metrics_url(url: &str) -> String {
    let url = url.trim();
    let with_scheme = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    let after_scheme = with_scheme.split_once("://").map_or("", |(_, rest)| rest);
    match after_scheme.find('/') {
        None => format!("{with_scheme}/metrics"),
        Some(slash) if after_scheme[slash..] == *"/" => format!("{with_scheme}metrics"),
        Some(_) => with_scheme,
    }
}

#[cfg(test)]
mod tests {
    use super::metrics_url;

    #[test]
    fn metrics_path_is_appended_to_a_base_url() {
        assert_eq!(metrics_url("http://h:8000"), "http://h:8000/metrics");
        assert_eq!(metrics_url("http://h:8000/"), "http://h:8000/metrics");
        assert_eq!(
            metrics_url("localhost:8000"),
            "http://localhost:8000/metrics"
        );
        assert_eq!(
            metrics_url("https://h/prom/metrics"),
            "https://h/prom/metrics"
        );
    }
}
