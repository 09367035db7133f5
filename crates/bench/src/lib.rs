//! tokenmill-bench: `tokenmill bench serve`, a serving benchmark client for any
//! OpenAI-compatible server (tokenmill, vLLM, llama.cpp), with `vllm bench serve`'s options,
//! printed result block and result-file keys, so every speed claim is one reproducible command.
//! It talks HTTP only and depends on no model, kernel or engine crate, so it builds on its own;
//! the offline forward-pass benchmark, `tokenmill bench speed`, is `tokenmill-bench-speed`.
//!
//! Key types: [`BenchServeArgs`] (the clap options, vLLM's names) → [`BenchPlan`] (checked);
//! datasets yield [`RequestInput`]s; each streamed request becomes a [`RequestOutcome`] (TTFT,
//! inter-token gaps, end-to-end latency, token counts or an error); [`calculate_metrics`] turns
//! outcomes into [`BenchmarkMetrics`] (numpy-compatible percentiles); [`format_result_block`]
//! prints vLLM's block. [`run`] returns a [`BenchReport`] with one [`BenchResult`] per point.
//!
//! The loop of [`run`]: discover the model (GET /v1/models) → pick a tokenizer (a local
//! tokenizer.json, the server's /tokenize + /detokenize, or an approximate word fallback) →
//! build the dataset once for all points → for each point (one, or one per
//! `--sweep-concurrency` / `--sweep-request-rate` value): warm up, send requests at their
//! scheduled arrival times (Poisson or gamma gaps from a seeded RNG) under a concurrency
//! semaphore, compute metrics, print the block, save the result JSON → for sweeps, write a
//! summary CSV/JSON and plots.

mod args;
mod client;
mod corpus;
mod dataset;
mod driver;
mod error;
mod metrics;
mod plots;
mod report;
mod schedule;
mod sse;
mod structured;
mod sweep;
mod tokenize;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use args::{
    BenchPlan, BenchServeArgs, DatasetName, EndpointKind, GoodputSlo, PercentileMetric,
};
pub use client::{
    interpret_chunk, request_body, send_request, ChunkMeaning, EndpointConfig, RequestInput,
    RequestOutcome,
};
pub use dataset::{
    builtin_schemas, json_dataset, prefix_repetition, random_dataset, sample_requests,
    PrefixRepetitionConfig, RandomConfig, StructuredConfig,
};
pub use driver::{run_benchmark, RunOutcome, RunSettings};
pub use error::BenchError;
pub use metrics::{
    calculate_metrics, mean, percentile, std_dev, time_per_output_token, BenchmarkMetrics,
    Distribution, MetricsContext,
};
pub use report::{
    format_failures, format_result_block, result_file_name, result_json, timestamp_now,
    BlockSettings, ResultHeader,
};
pub use schedule::{arrival_offsets, inter_arrival_gaps};
pub use sse::{SseEvent, SseParser};
pub use structured::StructuredCheck;
pub use sweep::SweepAxis;
pub use tokenize::{PromptTokenizer, ServerAccess};

/// The traffic settings of one benchmark point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchPoint {
    pub max_concurrency: Option<usize>,
    pub request_rate: f64,
}

/// Everything measured at one point.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub point: BenchPoint,
    pub metrics: BenchmarkMetrics,
    pub outcomes: Vec<RequestOutcome>,
    pub duration_s: f64,
    /// The failure listing and result block, as printed.
    pub printed: String,
    /// The result JSON (vLLM keys), whether or not it was saved.
    pub result: serde_json::Value,
    pub saved_to: Option<PathBuf>,
}

/// The outcome of `tokenmill bench serve`.
#[derive(Debug, Clone)]
pub struct BenchReport {
    pub model_id: String,
    /// Where prompt token counts came from.
    pub tokenizer: String,
    pub tokenizer_exact: bool,
    /// One per point: a single run, or one per sweep value.
    pub results: Vec<BenchResult>,
    /// Sweep summary and plot files written.
    pub sweep_files: Vec<PathBuf>,
}

async fn first_model(
    http: &reqwest::Client,
    base_url: &str,
    api_key: Option<&str>,
) -> Result<String, BenchError> {
    let url = format!("{base_url}/v1/models");
    let mut request = http.get(&url);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|source| BenchError::Http {
        url: url.clone(),
        source,
    })?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(BenchError::Server {
            url,
            status: status.as_u16(),
            body: body.chars().take(300).collect(),
        });
    }
    let value: serde_json::Value = response.json().await.map_err(|source| BenchError::Http {
        url: url.clone(),
        source,
    })?;
    value
        .pointer("/data/0/id")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| BenchError::ModelDiscovery {
            url,
            message: "no models found; make sure the server is running and has a model loaded"
                .into(),
        })
}

fn sweep_points(args: &BenchServeArgs) -> (Option<SweepAxis>, Vec<BenchPoint>) {
    if !args.sweep_concurrency.is_empty() {
        let points = args
            .sweep_concurrency
            .iter()
            .map(|&c| BenchPoint {
                max_concurrency: Some(c),
                request_rate: args.request_rate,
            })
            .collect();
        (Some(SweepAxis::Concurrency), points)
    } else if !args.sweep_request_rate.is_empty() {
        let points = args
            .sweep_request_rate
            .iter()
            .map(|&rate| BenchPoint {
                max_concurrency: args.max_concurrency,
                request_rate: rate,
            })
            .collect();
        (Some(SweepAxis::RequestRate), points)
    } else {
        (
            None,
            vec![BenchPoint {
                max_concurrency: args.max_concurrency,
                request_rate: args.request_rate,
            }],
        )
    }
}

fn result_path(
    args: &BenchServeArgs,
    point: BenchPoint,
    model_id: &str,
    date: &str,
    sweeping: bool,
) -> PathBuf {
    let name = match &args.result_filename {
        Some(name) if sweeping => {
            let suffix = match point.max_concurrency {
                Some(c) if !args.sweep_concurrency.is_empty() => format!("concurrency{c}"),
                _ => format!("{}qps", report::python_float(point.request_rate)),
            };
            match name.rsplit_once('.') {
                Some((stem, extension)) => format!("{stem}-{suffix}.{extension}"),
                None => format!("{name}-{suffix}"),
            }
        }
        Some(name) => name.clone(),
        None => result_file_name(
            args.label.as_deref(),
            point.request_rate,
            point.max_concurrency,
            model_id,
            date,
        ),
    };
    match &args.result_dir {
        Some(dir) => dir.join(name),
        None => PathBuf::from(name),
    }
}

/// Runs `tokenmill bench serve`: prints progress and vLLM's result block for every point,
/// saves result files when asked, and returns the measurements.
pub async fn run(mut args: BenchServeArgs) -> Result<BenchReport, BenchError> {
    let plan = args.plan()?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(6 * 60 * 60))
        .tcp_nodelay(true)
        .build()
        .map_err(|source| BenchError::Http {
            url: plan.base_url.clone(),
            source,
        })?;

    let model_id = match &args.model {
        Some(model) => model.clone(),
        None => {
            println!("Model not specified, fetching first model from server...");
            let model = first_model(&http, &plan.base_url, args.api_key.as_deref()).await?;
            println!("First model name: {model}");
            model
        }
    };
    let model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| model_id.clone());

    let tokenizer = match &args.tokenizer {
        Some(path) => PromptTokenizer::from_file(path)?,
        None => {
            PromptTokenizer::from_server(ServerAccess {
                http: http.clone(),
                base_url: plan.base_url.clone(),
                model: model_name.clone(),
                api_key: args.api_key.clone(),
            })
            .await
        }
    };
    if !plan.extra_body.contains_key("temperature") {
        println!(
            "WARNING: --temperature is not set, so the server's default sampling applies. \
             For greedy decoding, include --temperature=0."
        );
    }

    let (axis, points) = sweep_points(&args);
    let all_requests = sample_requests(&args, &tokenizer, args.num_prompts * points.len()).await?;
    let per_point = all_requests.len() / points.len();
    let endpoint = Arc::new(EndpointConfig {
        api_url: plan.api_url.clone(),
        kind: plan.endpoint_kind,
        model: model_name,
        api_key: args.api_key.clone(),
        ignore_eos: plan.ignore_eos,
        extra_body: plan.extra_body.clone(),
    });

    let date = report::timestamp_now();
    let mut results = Vec::with_capacity(points.len());
    for (index, point) in points.iter().copied().enumerate() {
        let requests = &all_requests[index * per_point..(index + 1) * per_point];
        if axis.is_some() {
            println!(
                "=== Sweep point {}/{}: max concurrency {}, request rate {} ===",
                index + 1,
                points.len(),
                point
                    .max_concurrency
                    .map_or("None".to_string(), |c| c.to_string()),
                report::python_float(point.request_rate)
            );
        }
        let settings = RunSettings {
            request_rate: point.request_rate,
            burstiness: args.burstiness,
            max_concurrency: point.max_concurrency,
            num_warmups: args.num_warmups,
            show_progress: !args.disable_tqdm,
            seed: args.seed,
        };
        let run = run_benchmark(&http, &endpoint, &settings, requests).await?;
        let metrics = calculate_metrics(
            &run.outcomes,
            MetricsContext {
                duration_s: run.duration_s,
                percentiles: &plan.percentiles,
                goodput: &plan.goodput,
                max_concurrency: point.max_concurrency,
                request_rate: point.request_rate,
            },
        );
        if metrics.completed == 0 {
            println!("WARNING: all requests failed. This is likely due to a misconfiguration of the benchmark arguments.");
        }
        let block_settings = BlockSettings {
            max_concurrency: point.max_concurrency,
            request_rate: point.request_rate,
            duration_s: run.duration_s,
            goodput_enabled: !plan.goodput.is_empty(),
            percentile_metrics: &plan.percentile_metrics,
        };
        let structured = StructuredCheck::of(requests, &run.outcomes);
        let printed = format!(
            "{}{}{}",
            format_failures(&run.outcomes),
            format_result_block(&metrics, block_settings),
            structured.map(|check| check.format()).unwrap_or_default()
        );
        print!("{printed}");
        let header = ResultHeader {
            date: date.clone(),
            label: args.label.clone(),
            model_id: model_id.clone(),
            tokenizer_id: tokenizer.description().to_string(),
            num_prompts: requests.len(),
            request_rate: point.request_rate,
            burstiness: args.burstiness,
            max_concurrency: point.max_concurrency,
        };
        let mut result = result_json(&header, &metrics, &run.outcomes, block_settings);
        if let (Some(check), Some(map)) = (structured, result.as_object_mut()) {
            check.insert_into(map);
        }
        let saved_to = if args.save_result {
            let path = result_path(&args, point, &model_id, &date, axis.is_some());
            sweep::write_json(&path, &result)?;
            println!("Saved result to {}", path.display());
            Some(path)
        } else {
            None
        };
        results.push(BenchResult {
            point,
            metrics,
            outcomes: run.outcomes,
            duration_s: run.duration_s,
            printed,
            result,
            saved_to,
        });
    }

    let sweep_files = match axis {
        Some(axis) => {
            let dir = args
                .result_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("."));
            let files = sweep::write_sweep_outputs(&dir, axis, &results)?;
            for file in &files {
                println!("Wrote {}", file.display());
            }
            files
        }
        None => Vec::new(),
    };
    Ok(BenchReport {
        model_id,
        tokenizer: tokenizer.description().to_string(),
        tokenizer_exact: tokenizer.is_exact(),
        results,
        sweep_files,
    })
}
