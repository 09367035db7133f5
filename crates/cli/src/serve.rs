//! `tokenmill serve [MODEL]`: the OpenAI-compatible server.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokenmill_engine::Engine;
use tokenmill_models::ModelSource;
use tokenmill_protocol::SamplingDefaults;
use tokenmill_server::{ServerConfig, TlsConfig};

use crate::engine_args::EngineArgs;
use crate::lora_args::LoraArgs;
use crate::responses_args::ResponsesArgs;
use crate::runner::RunnerArgs;
use crate::tool_args::ToolArgs;
use crate::vllm_flags::{markdown_table, VllmArgs};

/// What clients call the default model when no `--served-model-name` is given.
const DEFAULT_SERVED_NAME: &str = "SmolLM2-135M-Instruct";

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model to serve (same as --model): a GGUF file, an HF directory or an HF repo id.
    #[arg(value_name = "MODEL")]
    pub model_positional: Option<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub vllm: VllmArgs,
    #[command(flatten)]
    pub tools: ToolArgs,
    #[command(flatten)]
    pub runner: RunnerArgs,
    #[command(flatten)]
    pub lora: LoraArgs,
    #[command(flatten)]
    pub responses: ResponsesArgs,
    #[arg(long, default_value = "127.0.0.1", help_heading = "Frontend")]
    pub host: String,
    #[arg(long, default_value_t = 8000, help_heading = "Frontend")]
    pub port: u16,
    /// Names clients may use for the model (the first is reported); default: the model argument.
    #[arg(long, num_args = 1.., help_heading = "Frontend")]
    pub served_model_name: Vec<String>,
    /// Require `Authorization: Bearer KEY` on every route but /health (and /metrics).
    #[arg(
        long,
        env = "TOKENMILL_API_KEY",
        hide_env_values = true,
        help_heading = "Frontend"
    )]
    pub api_key: Option<String>,
    /// Also require the API key on /metrics.
    #[arg(long, help_heading = "Frontend")]
    pub api_key_metrics: bool,
    #[arg(long, requires = "ssl_certfile", help_heading = "Frontend")]
    pub ssl_keyfile: Option<PathBuf>,
    #[arg(long, requires = "ssl_keyfile", help_heading = "Frontend")]
    pub ssl_certfile: Option<PathBuf>,
    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30.0, help_heading = "Frontend")]
    pub shutdown_timeout: f64,
    /// Largest accepted request body in bytes (413 above).
    #[arg(long, default_value_t = 32 << 20, help_heading = "Frontend")]
    pub max_request_body_bytes: usize,
    /// Cap on `n` per request.
    #[arg(long, default_value_t = 128, help_heading = "Frontend")]
    pub max_n: u32,
    /// Generation requests beyond this many waiting get 503 with Retry-After (counted in
    /// tokenmill:requests_rejected_total); default: unbounded.
    #[arg(long, value_name = "N", help_heading = "Frontend")]
    pub max_waiting_requests: Option<usize>,
    /// Expensive pre-admission jobs (chat-template renders, grammar and schema compiles,
    /// tokenizing prompts over 16 KiB) run at once, off the async workers; more wait in turn,
    /// and beyond 64 waiting per job get 503 with Retry-After. Default: the cores available.
    #[arg(long, value_name = "N", help_heading = "Frontend")]
    pub max_admission_jobs: Option<std::num::NonZeroUsize>,
    /// Seconds a connection may take to send a complete request head (slow-loris defence;
    /// also closes keep-alive connections idle that long).
    #[arg(long, default_value_t = 30.0, help_heading = "Frontend")]
    pub header_read_timeout: f64,
    /// Seconds a request body may take to arrive (408 after).
    #[arg(long, default_value_t = 30.0, help_heading = "Frontend")]
    pub body_read_timeout: f64,
    /// Log each request's prompt.
    #[arg(long, help_heading = "Logging")]
    pub enable_log_requests: bool,
    /// Truncate logged prompts to this many characters.
    #[arg(long, help_heading = "Logging")]
    pub max_log_len: Option<usize>,
    /// Turn off the periodic engine stats line.
    #[arg(long, help_heading = "Logging")]
    pub disable_log_stats: bool,
    /// Seconds between engine stats lines.
    #[arg(long, default_value_t = 10.0, help_heading = "Logging")]
    pub log_stats_interval: f64,
    /// Endpoints without access-log lines, comma separated (e.g. /health,/metrics).
    #[arg(long, value_delimiter = ',', help_heading = "Logging")]
    pub disable_access_log_for_endpoints: Vec<String>,
    /// Export one OpenTelemetry span per request over OTLP/HTTP (JSON) to this collector, e.g.
    /// http://localhost:4318 (`/v1/traces` is appended unless present). Off by default.
    #[arg(long, value_name = "URL", help_heading = "Observability")]
    pub otlp_traces_endpoint: Option<String>,
    /// With --data-parallel-size N: pin each engine's threads to a CPU set, one set per
    /// engine, comma separated (e.g. `0-7,8-15`; ranges within a set joined by `+`). Without
    /// --threads an engine runs one thread per CPU of its set. Pinning that fails only warns.
    #[arg(long, value_name = "SETS", help_heading = "Compute")]
    pub cpu_affinity: Option<String>,
    /// Default sampling parameters: `auto` (the model's generation_config.json), `vllm`
    /// (none), or a folder holding a generation_config.json.
    #[arg(long, default_value = "auto", help_heading = "Model")]
    pub generation_config: String,
}

pub fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    if args.vllm.print_vllm_flags {
        print!("{}", markdown_table());
        return Ok(());
    }
    // Refused vLLM flags fail before the model loads; the ones without effect say so.
    for warning in args.vllm.check()? {
        tracing::warn!("{warning}");
    }
    // The address first: a busy port fails now, not after the model has loaded.
    let listener = tokenmill_server::bind(&args.host, args.port)?;
    if args.model_positional.is_some() {
        args.engine.model = args.model_positional.take();
    }
    let (tool_settings, reasoning_parser) = args.tools.settings()?;
    let reasoning_parser = args
        .engine
        .structured_outputs
        .reasoning_parser(reasoning_parser)?;
    let mut config = args.engine.to_config()?;
    args.vllm.apply_to_engine(&mut config)?;
    if let Some(sets) = &args.cpu_affinity {
        config.cpu_affinity = tokenmill_engine::dp::parse_cpu_affinity(sets)?;
    }
    config.lora = args.lora.to_config()?;
    let served_model_names = if args.served_model_name.is_empty() {
        vec![args
            .engine
            .model
            .clone()
            .unwrap_or_else(|| DEFAULT_SERVED_NAME.to_string())]
    } else {
        args.served_model_name.clone()
    };
    config.served_model_name = served_model_names[0].clone();
    if args.disable_log_stats {
        config.log_stats_interval = None;
    } else {
        config.log_stats_interval = Some(Duration::from_secs_f64(args.log_stats_interval.max(0.1)));
    }
    config.otlp_traces_endpoint = args.otlp_traces_endpoint.clone().filter(|e| !e.is_empty());
    let mut server = ServerConfig::new(served_model_names);
    server.host = args.host.clone();
    server.port = args.port;
    server.api_key = args.api_key.clone().filter(|k| !k.is_empty());
    server.api_key_metrics = args.api_key_metrics;
    server.tls = match (&args.ssl_certfile, &args.ssl_keyfile) {
        (Some(cert_file), Some(key_file)) => Some(TlsConfig {
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
        }),
        _ => None,
    };
    server.shutdown_timeout = Duration::from_secs_f64(args.shutdown_timeout.max(0.0));
    server.max_body_bytes = args.max_request_body_bytes;
    server.max_n = args.max_n;
    server.max_waiting_requests = args.max_waiting_requests;
    if let Some(jobs) = args.max_admission_jobs {
        server.max_admission_jobs = jobs.get();
    }
    server.header_read_timeout =
        positive_seconds("--header-read-timeout", args.header_read_timeout)?;
    server.body_read_timeout = positive_seconds("--body-read-timeout", args.body_read_timeout)?;
    server.enable_log_requests = args.enable_log_requests;
    server.max_log_len = args.max_log_len;
    server.disable_access_log_for_endpoints = args.disable_access_log_for_endpoints.clone();
    server.sampling_defaults = generation_defaults(&args.generation_config, &config.model)?;
    server.tools = tool_settings;
    server.reasoning_parser = reasoning_parser;
    args.vllm.apply_to_server(&mut server)?;
    server.allow_runtime_lora_updating = args.lora.runtime_updating();
    if server.allow_runtime_lora_updating {
        tracing::warn!(
            "runtime LoRA updating is on: /v1/load_lora_adapter and /v1/unload_lora_adapter \
             are served; adapters load only under --allowed-lora-root and the directories of \
             --lora-modules"
        );
    }

    if args.runner.pooling(&config)? {
        if config.data_parallel_size > 1 || !config.cpu_affinity.is_empty() {
            anyhow::bail!(
                "--data-parallel-size and --cpu-affinity serve generative models only; the \
                 pooling runner is one engine (run replicas to scale embeddings out)"
            );
        }
        let engine = args.runner.start_pooling(&config)?;
        crate::async_runtime()?
            .block_on(tokenmill_server::serve_pooling_on(listener, engine, server))?;
        return Ok(());
    }
    server.response_store = args.responses.open()?;
    let engine = Engine::start(&config)?;
    for line in engine.capacity().log_lines() {
        tracing::info!("{line}");
    }
    if config.data_parallel_size > 1 {
        tracing::info!(
            "data parallel: {} engines, each with the KV cache above",
            config.data_parallel_size
        );
    }
    crate::async_runtime()?.block_on(tokenmill_server::serve_on(listener, engine, server))?;
    Ok(())
}

fn positive_seconds(flag: &str, seconds: f64) -> anyhow::Result<Duration> {
    if !(seconds.is_finite() && seconds > 0.0) {
        anyhow::bail!("{flag} must be a positive number of seconds, got {seconds}");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// vLLM's `--generation-config`: default sampling parameters from a generation_config.json.
fn generation_defaults(setting: &str, model: &ModelSource) -> anyhow::Result<SamplingDefaults> {
    let folder = match (setting, model) {
        ("vllm", _) => return Ok(SamplingDefaults::default()),
        ("auto", ModelSource::HfDirectory(dir)) => dir.clone(),
        ("auto", ModelSource::Gguf(_)) => return Ok(SamplingDefaults::default()),
        (folder, _) => PathBuf::from(folder),
    };
    let file = folder.join("generation_config.json");
    if !file.exists() {
        if setting == "auto" {
            return Ok(SamplingDefaults::default());
        }
        anyhow::bail!("--generation-config: {} does not exist", file.display());
    }
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", file.display()))?;
    let float = |key: &str| {
        json.get(key)
            .and_then(serde_json::Value::as_f64)
            .map(|v| v as f32)
    };
    Ok(SamplingDefaults {
        temperature: float("temperature"),
        top_p: float("top_p"),
        top_k: json.get("top_k").and_then(serde_json::Value::as_i64),
        min_p: float("min_p"),
        repetition_penalty: float("repetition_penalty"),
        presence_penalty: None,
        frequency_penalty: None,
        max_tokens: json
            .get("max_new_tokens")
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| u32::try_from(v).ok()),
    })
}
