//! Sweep summaries: one row per point (concurrency or request rate) with throughput and
//! p50/p99 latencies, written as CSV and JSON, then plotted.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::BenchError;
use crate::metrics::{mean, percentile, time_per_output_token};
use crate::{plots, BenchResult};

/// What a sweep varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepAxis {
    Concurrency,
    RequestRate,
}

impl SweepAxis {
    pub fn column(self) -> &'static str {
        match self {
            SweepAxis::Concurrency => "max_concurrency",
            SweepAxis::RequestRate => "request_rate",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SweepAxis::Concurrency => "max concurrency",
            SweepAxis::RequestRate => "request rate (req/s)",
        }
    }

    fn file_stem(self) -> &'static str {
        match self {
            SweepAxis::Concurrency => "concurrency",
            SweepAxis::RequestRate => "request_rate",
        }
    }
}

/// Mean, p50 and p99 of one latency metric in ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl LatencySummary {
    fn of_seconds(values: &[f64]) -> Self {
        LatencySummary {
            mean_ms: mean(values) * 1000.0,
            p50_ms: percentile(values, 50.0) * 1000.0,
            p99_ms: percentile(values, 99.0) * 1000.0,
        }
    }
}

/// One sweep point's summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepRow {
    pub axis_value: f64,
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft: LatencySummary,
    pub tpot: LatencySummary,
    pub itl: LatencySummary,
    pub e2el: LatencySummary,
}

impl SweepRow {
    pub fn from_result(axis: SweepAxis, result: &BenchResult) -> Self {
        let successful: Vec<_> = result.outcomes.iter().filter(|o| o.success).collect();
        let ttfts: Vec<f64> = successful.iter().map(|o| o.ttft).collect();
        let e2els: Vec<f64> = successful.iter().map(|o| o.latency).collect();
        let itls: Vec<f64> = successful
            .iter()
            .flat_map(|o| o.itl.iter().copied())
            .collect();
        let tpots: Vec<f64> = successful
            .iter()
            .filter_map(|o| time_per_output_token(o.latency, o.ttft, o.output_len()))
            .collect();
        let axis_value = match axis {
            SweepAxis::Concurrency => result
                .point
                .max_concurrency
                .map_or(f64::INFINITY, |c| c as f64),
            SweepAxis::RequestRate => result.point.request_rate,
        };
        SweepRow {
            axis_value,
            completed: result.metrics.completed,
            failed: result.metrics.failed,
            duration_s: result.duration_s,
            request_throughput: result.metrics.request_throughput,
            output_throughput: result.metrics.output_throughput,
            total_token_throughput: result.metrics.total_token_throughput,
            ttft: LatencySummary::of_seconds(&ttfts),
            tpot: LatencySummary::of_seconds(&tpots),
            itl: LatencySummary::of_seconds(&itls),
            e2el: LatencySummary::of_seconds(&e2els),
        }
    }
}

/// The summary as CSV, one header line then one line per row.
pub fn summary_csv(axis: SweepAxis, rows: &[SweepRow]) -> String {
    let mut out = format!(
        "{},completed,failed,duration_s,request_throughput,output_throughput,total_token_throughput",
        axis.column()
    );
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        let _ = write!(out, ",mean_{metric}_ms,p50_{metric}_ms,p99_{metric}_ms");
    }
    out.push('\n');
    for row in rows {
        let _ = write!(
            out,
            "{},{},{},{:.4},{:.4},{:.4},{:.4}",
            row.axis_value,
            row.completed,
            row.failed,
            row.duration_s,
            row.request_throughput,
            row.output_throughput,
            row.total_token_throughput
        );
        for summary in [row.ttft, row.tpot, row.itl, row.e2el] {
            let _ = write!(
                out,
                ",{:.4},{:.4},{:.4}",
                summary.mean_ms, summary.p50_ms, summary.p99_ms
            );
        }
        out.push('\n');
    }
    out
}

pub(crate) fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), BenchError> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| BenchError::io(dir, source))?;
    }
    let text = serde_json::to_string(value)?;
    std::fs::write(path, text).map_err(|source| BenchError::io(path, source))
}

/// Writes `sweep-{axis}-summary.{csv,json}` and the plots into `dir`; returns the files.
pub fn write_sweep_outputs(
    dir: &Path,
    axis: SweepAxis,
    results: &[BenchResult],
) -> Result<Vec<PathBuf>, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::io(dir, source))?;
    let rows: Vec<SweepRow> = results
        .iter()
        .map(|result| SweepRow::from_result(axis, result))
        .collect();
    let stem = format!("sweep-{}", axis.file_stem());
    let csv_path = dir.join(format!("{stem}-summary.csv"));
    std::fs::write(&csv_path, summary_csv(axis, &rows))
        .map_err(|source| BenchError::io(&csv_path, source))?;
    let json_path = dir.join(format!("{stem}-summary.json"));
    let json = serde_json::json!({ "axis": axis.column(), "points": rows });
    write_json(&json_path, &json)?;
    let mut files = vec![csv_path, json_path];
    files.extend(plots::draw_sweep_plots(dir, &stem, axis, &rows)?);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::RequestOutcome;
    use crate::metrics::{calculate_metrics, MetricsContext};
    use crate::{BenchPoint, GoodputSlo};

    fn result_at(concurrency: usize, ttft: f64) -> BenchResult {
        let outcomes: Vec<RequestOutcome> = (0..4)
            .map(|i| RequestOutcome {
                success: true,
                prompt_len: 8,
                content_chunks: 3,
                ttft,
                itl: vec![0.01, 0.02],
                latency: ttft + 0.03,
                start_time: i as f64 * 0.1,
                ..Default::default()
            })
            .collect();
        let metrics = calculate_metrics(
            &outcomes,
            MetricsContext {
                duration_s: 1.0,
                percentiles: &[99.0],
                goodput: &GoodputSlo::default(),
                max_concurrency: Some(concurrency),
                request_rate: f64::INFINITY,
            },
        );
        BenchResult {
            point: BenchPoint {
                max_concurrency: Some(concurrency),
                request_rate: f64::INFINITY,
            },
            metrics,
            outcomes,
            duration_s: 1.0,
            printed: String::new(),
            result: serde_json::Value::Null,
            saved_to: None,
        }
    }

    #[test]
    fn rows_and_csv_summarize_each_point() {
        let results = [result_at(1, 0.1), result_at(4, 0.2)];
        let rows: Vec<SweepRow> = results
            .iter()
            .map(|r| SweepRow::from_result(SweepAxis::Concurrency, r))
            .collect();
        assert_eq!(rows[1].axis_value, 4.0);
        assert!((rows[0].ttft.p50_ms - 100.0).abs() < 1e-9);
        assert!((rows[1].ttft.p99_ms - 200.0).abs() < 1e-9);
        assert!((rows[0].itl.p50_ms - 15.0).abs() < 1e-9);
        assert!((rows[0].tpot.mean_ms - 15.0).abs() < 1e-9);
        assert_eq!(rows[0].output_throughput, 12.0);
        let csv = summary_csv(SweepAxis::Concurrency, &rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("max_concurrency,completed,failed,"));
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert!(lines[2].starts_with("4,4,0,"));
    }

    #[test]
    fn sweep_outputs_are_written() {
        let dir = tempfile::tempdir().expect("temp dir");
        let results = [result_at(1, 0.1), result_at(2, 0.15), result_at(4, 0.2)];
        let files = write_sweep_outputs(dir.path(), SweepAxis::Concurrency, &results)
            .expect("sweep outputs");
        for file in &files {
            let size = std::fs::metadata(file).expect("file exists").len();
            assert!(size > 0, "{} is empty", file.display());
        }
        assert!(files
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "svg")));
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("sweep-concurrency-summary.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(json["points"].as_array().map(Vec::len), Some(3));
    }
}
