//! Command-line arguments of `tokenmill triage`, for the binary to flatten into its subcommand.

use std::path::PathBuf;
use std::time::Duration;

/// `tokenmill triage`: diagnose a running vLLM-compatible server from its `/metrics`.
#[derive(Debug, Clone, clap::Args)]
pub struct TriageArgs {
    /// Server to scrape: base URL (`http://host:8000`, `/metrics` is appended) or the full
    /// metrics URL.
    #[arg(long, required_unless_present = "from", conflicts_with = "from")]
    pub url: Option<String>,

    /// How long to watch the live server ("30s", "2m", "1m30s", "500ms").
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub window: Duration,

    /// Gauge samples across the window, both ends included (at least 2).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub samples: u32,

    /// Bearer token for a server started with `--api-key`.
    #[arg(long)]
    pub api_key: Option<String>,

    /// Time-to-first-token objective in milliseconds (default 500).
    #[arg(long, value_name = "MS")]
    pub slo_ttft: Option<f64>,

    /// Inter-token latency objective in milliseconds (default 50).
    #[arg(long, value_name = "MS")]
    pub slo_itl: Option<f64>,

    /// Restrict the diagnosis to one `model_name` (default: all models summed).
    #[arg(long)]
    pub model_name: Option<String>,

    /// Print the stable JSON document instead of the text report.
    #[arg(long)]
    pub json: bool,

    /// Offline mode: the scrape taken at the start of the window.
    #[arg(long, value_name = "FILE", requires_all = ["to", "elapsed"])]
    pub from: Option<PathBuf>,

    /// Offline mode: the scrape taken at the end of the window.
    #[arg(long, value_name = "FILE", requires = "from")]
    pub to: Option<PathBuf>,

    /// Offline mode: time between the `--from` and `--to` scrapes ("30s").
    #[arg(long, value_parser = parse_duration, requires = "from")]
    pub elapsed: Option<Duration>,

    /// Offline mode: scrapes taken in between, in order, for the gauge statistics (repeatable).
    #[arg(long = "sample", value_name = "FILE", requires = "from")]
    pub sample_files: Vec<PathBuf>,
}

/// Parses a duration such as `30s`, `500ms`, `2m`, `1m30s`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".to_owned());
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|error| error.to_string());
    }
    let mut total = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: expected a number"))?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ms" => 0.001,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            unit => return Err(format!("invalid duration {text:?}: unknown unit {unit:?}")),
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("30 parsecs").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        triage: TriageArgs,
    }

    #[test]
    fn live_and_offline_modes_parse() {
        let live = Cli::try_parse_from(["t", "--url", "http://h:8000", "--window", "10s"]).unwrap();
        assert_eq!(live.triage.window, Duration::from_secs(10));
        assert_eq!(live.triage.samples, 5);
        let offline = Cli::try_parse_from([
            "t",
            "--from",
            "a.prom",
            "--to",
            "b.prom",
            "--elapsed",
            "30s",
            "--sample",
            "m.prom",
        ])
        .unwrap();
        assert_eq!(offline.triage.elapsed, Some(Duration::from_secs(30)));
        assert_eq!(offline.triage.sample_files.len(), 1);
        assert!(Cli::try_parse_from(["t"]).is_err());
        assert!(Cli::try_parse_from(["t", "--from", "a.prom"]).is_err());
        assert!(Cli::try_parse_from([
            "t",
            "--url",
            "u",
            "--from",
            "a",
            "--to",
            "b",
            "--elapsed",
            "1s"
        ])
        .is_err());
    }
}
