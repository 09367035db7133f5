//! `vllm serve`'s flags, honestly mapped: every flag a vLLM user copies either does the
//! equivalent thing here, is accepted with a one-line warning saying why it has no effect on a
//! CPU engine, or is refused with a message naming what tokenmill supports.
//!
//! [`VLLM_FLAGS`] is the one source of truth: the parser's tests parse every row, and the
//! README's "vLLM flag → tokenmill" table is generated from it (`tokenmill serve
//! --print-vllm-flags`, checked by a test against the README).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use tokenmill_engine::kv_events::KvEventsConfig;
use tokenmill_engine::{EngineConfig, KvCacheSizing, ModelDtype};
use tokenmill_server::{CorsConfig, ServerConfig};

/// What a flag does on tokenmill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Does what vLLM's flag does (the text says how).
    Same,
    /// Accepted with a warning: it has no effect on this engine (the text says why).
    NoEffect,
    /// Accepted for the values tokenmill supports; any other value is refused (the text says
    /// which values work).
    Restricted,
}

impl Treatment {
    fn label(self) -> &'static str {
        match self {
            Treatment::Same => "same",
            Treatment::NoEffect => "no effect (warning)",
            Treatment::Restricted => "some values refused",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct VllmFlag {
    /// The long flag, e.g. `--gpu-memory-utilization`.
    pub flag: &'static str,
    /// A value that parses (empty for switches), used by the tests and shown in the table.
    pub example: &'static str,
    pub treatment: Treatment,
    /// What tokenmill does with it.
    pub note: &'static str,
}

const fn row(
    flag: &'static str,
    example: &'static str,
    treatment: Treatment,
    note: &'static str,
) -> VllmFlag {
    VllmFlag {
        flag,
        example,
        treatment,
        note,
    }
}

use Treatment::{NoEffect, Restricted, Same};

/// `vllm serve` flags tokenmill accepts, in the order of vLLM's `--help` groups.
pub const VLLM_FLAGS: &[VllmFlag] = &[
    // Frontend.
    row("--host", "0.0.0.0", Same, "address to listen on"),
    row("--port", "8000", Same, "port to listen on"),
    row("--api-key", "secret", Same, "`Authorization: Bearer` required on every route but /health, /ping and /metrics"),
    row("--served-model-name", "my-model", Same, "names clients may use; the first is reported"),
    row("--chat-template", "template.jinja", Same, "file or inline Jinja template"),
    row("--ssl-keyfile", "key.pem", Same, "HTTPS (with `--ssl-certfile`)"),
    row("--ssl-certfile", "cert.pem", Same, "HTTPS (with `--ssl-keyfile`)"),
    row("--allowed-origins", "[\"https://example.com\"]", Same, "CORS: JSON list of origins (default `[\"*\"]`)"),
    row("--allowed-methods", "[\"GET\",\"POST\"]", Same, "CORS: JSON list of methods (default `[\"*\"]`)"),
    row("--allowed-headers", "[\"*\"]", Same, "CORS: JSON list of headers (default `[\"*\"]`)"),
    row("--allow-credentials", "", Same, "CORS: allow credentials (a `*` origin then mirrors the request's origin)"),
    row("--root-path", "/llm", Same, "routes are also served under this prefix (behind a path-routing proxy)"),
    row("--disable-fastapi-docs", "", Same, "no `/openapi.json` (tokenmill serves no `/docs` or `/redoc` pages)"),
    row("--return-tokens-as-token-ids", "", Same, "logprob tokens are `token_id:N`"),
    row("--trust-request-chat-template", "", Same, "chat requests may bring their own `chat_template` (refused with a 400 otherwise)"),
    row("--response-role", "assistant", Same, "the role chat replies report when the request adds a generation prompt"),
    row("--enable-tokenizer-info-endpoint", "", Same, "serves `GET /tokenizer_info` (tokenizer config and chat template, for remote-tokenizer clients)"),
    row("--enable-prompt-tokens-details", "", Same, "`usage.prompt_tokens_details.cached_tokens` (tokenmill always reports it)"),
    row("--max-log-len", "100", Same, "truncates logged prompts"),
    row("--enable-log-requests", "", Same, "logs each request's prompt"),
    row("--disable-log-requests", "", Same, "the default (deprecated in vLLM)"),
    row("--disable-log-stats", "", Same, "no periodic engine stats line"),
    row("--uvicorn-log-level", "warning", Same, "level of the access log (`warning` and above silence it)"),
    row("--disable-uvicorn-access-log", "", Same, "no access-log lines"),
    row("--disable-access-log-for-endpoints", "/health,/metrics", Same, "no access-log lines for these paths"),
    row("--generation-config", "auto", Same, "default sampling parameters from generation_config.json"),
    row("--max-logprobs", "20", Same, "cap on `logprobs`, `top_logprobs`, `prompt_logprobs`"),
    row("--structured-outputs-config", "{\"backend\": \"guidance\"}", Restricted, "backend `auto`/`guidance` (llguidance; others refused), `disable_any_whitespace`, `disable_additional_properties`, `reasoning_parser`, `disable_fallback`; also the dotted `--structured-outputs-config.KEY VALUE` form"),
    row("--config", "serve.yaml", Same, "YAML file of flags (keys with `-` or `_`); flags on the command line win"),
    // Model.
    row("--model", "model.gguf", Same, "GGUF file, HF directory or HF repo id (also positional)"),
    row("--tokenizer", "path/to/tokenizer", Same, "HF tokenizer directory or `tokenizer.json` replacing the model's"),
    row("--revision", "main", Same, "revision of an HF repo id to load from the local HF cache or download"),
    row("--download-dir", "/models", Same, "where HF repos and the default model are downloaded and looked up"),
    row("--max-model-len", "4096", Same, "context length (prompt + output)"),
    row("--seed", "0", Same, "seeds requests that bring no `seed` (reproducible across runs in arrival order)"),
    row("--dtype", "auto", Restricted, "`auto`, `half`/`float16`, `bfloat16`, `float32`/`float`: `bfloat16` runs BERT encoders' linear layers in bf16 (weights rounded once, f32 accumulation); `auto` runs them as int8 pairs (15-bit fixed point per row, exact integer sums on AMX tiles; f32 on CPUs without AMX), where vLLM would downcast a float32 pooling model to float16; `float32` keeps them f32; decoders' activations are f32 on CPU and weights keep the file's types whatever it says; it sets what `--kv-cache-dtype auto` stores (`auto`: bf16 for a bfloat16 `config.json`, else f16; GGUF f16), a warning for the 16-bit values says what they do"),
    row("--quantization", "gguf", Restricted, "`gguf` (or unset): the weights' types come from the file; AWQ/GPTQ/FP8/... are refused"),
    row("--load-format", "auto", Restricted, "`auto`, `gguf`, `safetensors`"),
    row("--trust-remote-code", "", NoEffect, "tokenmill runs no model code from the hub; supported architectures are built in"),
    row("--tokenizer-revision", "main", NoEffect, "the tokenizer is read from the model (or `--tokenizer`) as found locally"),
    row("--code-revision", "main", NoEffect, "no remote code is run"),
    row("--runner", "pooling", Restricted, "`auto`, `generate`, `pooling` (embeddings, scores, classes; `draft` refused); auto pools encoder (BERT) models"),
    row("--task", "embed", Restricted, "older spelling of `--runner`: `embed`/`embedding`, `score`, `classify` mean pooling, `generate` generates"),
    row("--convert", "embed", Restricted, "`auto`, `none`, `embed` (a decoder as an embedder: final hidden states pooled LAST and normalized; implies `--runner pooling`); `classify`, `reward` refused"),
    row("--pooler-config", "{\"pooling_type\": \"LAST\", \"normalize\": true}", Restricted, "pooling runner: `pooling_type` (`LAST`, `MEAN`, `CLS`) and `normalize` over the model's and sentence-transformers' defaults (alias `--override-pooler-config`); other keys refused by name"),
    // Cache and memory.
    row("--gpu-memory-utilization", "0.9", Same, "fraction of available RAM for weights + KV cache (the KV budget is what remains after the weights)"),
    row("--kv-cache-memory-bytes", "4GiB", Same, "KV-cache budget in bytes (alias of `--kv-cache-memory`)"),
    row("--kv-cache-dtype", "auto", Same, "KV element type (`auto` = the model dtype, 16-bit, see `--dtype`; `fp8`, `fp8_e4m3`, `fp8_e5m2`, `bfloat16`; tokenmill extensions `float16`, `float32`)"),
    row("--block-size", "16", Same, "tokens per KV block"),
    row("--enable-prefix-caching", "", Same, "on by default (`--no-enable-prefix-caching` turns it off)"),
    row("--disable-hybrid-kv-cache-manager", "", Same, "every layer keeps every KV block: no per-attention-kind KV cache groups for models mixing sliding-window and full layers (Gemma 3), no release before the window for all-sliding ones"),
    row("--swap-space", "4", NoEffect, "preempted requests are recomputed from the prefix cache, nothing is swapped"),
    row("--cpu-offload-gb", "0", NoEffect, "weights already live in host memory"),
    row("--calculate-kv-scales", "", NoEffect, "fp8 KV uses a per-tensor scale of 1.0"),
    // Scheduler.
    row("--max-num-seqs", "64", Same, "sequences in one step"),
    row("--max-num-batched-tokens", "512", Same, "token budget of one step"),
    row("--scheduling-policy", "fcfs", Same, "`fcfs` or `priority`"),
    row("--enable-chunked-prefill", "", Same, "on by default (long prompts are split at `--max-num-batched-tokens`; `--no-enable-chunked-prefill` schedules each prompt whole)"),
    row("--speculative-config", "{\"method\":\"ngram\",\"num_speculative_tokens\":4}", Restricted, "methods `ngram` (`prompt_lookup_min`/`max`), `suffix` (`suffix_decoding_*`) and `draft_model` (`model`: a GGUF or HF directory with the same vocabulary), with `num_speculative_tokens` and `disable_by_batch_size`; `eagle`, `mtp`, `medusa`, ... and unknown keys are refused by name; greedy output is identical to no speculation, sampled output keeps its distribution (rejection sampling)"),
    // LoRA.
    row("--enable-lora", "", Same, "serve LoRA adapters (PEFT directories, GGUF LoRA files) chosen per request by `model`"),
    row("--lora-modules", "sql=/adapters/sql", Same, "start-up adapters: `name=path` or JSON `{\"name\",\"path\",\"base_model_name\"}` (needs `--enable-lora`)"),
    row("--max-loras", "4", Same, "distinct adapters in one running batch; requests for others wait"),
    row("--max-lora-rank", "16", Same, "largest adapter rank accepted"),
    row("--max-cpu-loras", "8", Same, "adapters kept in memory; the least recently used are read again on use"),
    // Parallelism and execution.
    row("--tensor-parallel-size", "1", Restricted, "`1`: one engine per process uses all cores (`--threads`); scale out with replicas (deploy/)"),
    row("--pipeline-parallel-size", "1", Restricted, "`1`, as above"),
    row("--data-parallel-size", "2", Same, "N engine cores in one process behind one HTTP front end, each with its own scheduler, KV cache (the memory flags are per engine, as per vLLM DP rank) and `--threads`/N threads (`--cpu-affinity 0-7,8-15` pins each); requests go to the least loaded engine, or to the one that served the prompt's prefix if nearly as idle; metrics labelled `engine=\"0\"`..`\"N-1\"`"),
    row("--device", "cpu", Restricted, "`cpu` or `auto`"),
    row("--enforce-eager", "", NoEffect, "there are no CUDA graphs to capture"),
    row("--max-seq-len-to-capture", "8192", NoEffect, "there are no CUDA graphs to capture"),
    row("--disable-custom-all-reduce", "", NoEffect, "there is no multi-GPU all-reduce"),
    row("--distributed-executor-backend", "mp", NoEffect, "one process; data-parallel engines are threads of it"),
    row("--disable-frontend-multiprocessing", "", NoEffect, "the HTTP frontend and the engine thread share one process already"),
    row("--max-parallel-loading-workers", "2", NoEffect, "weights are memory-mapped and repacked by the compute pool"),
    // KV-cache events.
    row("--kv-events-config", "{\"enable_kv_cache_events\":true}", Same, "KV-cache events (`BlockStored`/`BlockRemoved`/`AllBlocksCleared`) on ZeroMQ PUB + ROUTER replay, vLLM's keys, defaults and wire format; `tcp://` endpoints only"),
];

/// The README's table, generated from [`VLLM_FLAGS`].
pub fn markdown_table() -> String {
    let mut table = String::from("| vLLM flag | example | tokenmill | what it does here |\n");
    table.push_str("|---|---|---|---|\n");
    for flag in VLLM_FLAGS {
        let example = if flag.example.is_empty() {
            String::new()
        } else {
            format!("`{}`", flag.example)
        };
        table.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            flag.flag,
            example,
            flag.treatment.label(),
            flag.note
        ));
    }
    table
}

/// The vLLM flags that are not also tokenmill's own engine or server flags.
#[derive(Debug, Clone, Default, Args)]
pub struct VllmArgs {
    /// Print the "vLLM flag → tokenmill" table (markdown) and exit.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub print_vllm_flags: bool,
    /// YAML file of flags, vLLM's `--config` (read before the other flags, which win).
    #[arg(long, value_name = "FILE", help_heading = "vLLM compatibility")]
    pub config: Option<PathBuf>,
    /// Fraction of available RAM for weights + KV cache.
    #[arg(long, value_name = "FRACTION", help_heading = "vLLM compatibility")]
    pub gpu_memory_utilization: Option<f64>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub dtype: Option<String>,
    #[arg(long, short = 'q', help_heading = "vLLM compatibility")]
    pub quantization: Option<String>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub load_format: Option<String>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub device: Option<String>,
    /// Also `-tp`.
    #[arg(long, value_name = "N", help_heading = "vLLM compatibility")]
    pub tensor_parallel_size: Option<usize>,
    /// Also `-pp`.
    #[arg(long, value_name = "N", help_heading = "vLLM compatibility")]
    pub pipeline_parallel_size: Option<usize>,
    /// Also `-dp`.
    #[arg(long, value_name = "N", help_heading = "vLLM compatibility")]
    pub data_parallel_size: Option<usize>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub trust_remote_code: bool,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub tokenizer_revision: Option<String>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub code_revision: Option<String>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub swap_space: Option<f64>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub cpu_offload_gb: Option<f64>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub calculate_kv_scales: bool,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub enforce_eager: bool,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub max_seq_len_to_capture: Option<usize>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub disable_custom_all_reduce: bool,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub distributed_executor_backend: Option<String>,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub disable_frontend_multiprocessing: bool,
    #[arg(long, help_heading = "vLLM compatibility")]
    pub max_parallel_loading_workers: Option<usize>,
    /// CORS: JSON list of allowed origins (default `["*"]`).
    #[arg(long, value_name = "JSON", help_heading = "vLLM compatibility")]
    pub allowed_origins: Option<String>,
    /// CORS: JSON list of allowed methods (default `["*"]`).
    #[arg(long, value_name = "JSON", help_heading = "vLLM compatibility")]
    pub allowed_methods: Option<String>,
    /// CORS: JSON list of allowed headers (default `["*"]`).
    #[arg(long, value_name = "JSON", help_heading = "vLLM compatibility")]
    pub allowed_headers: Option<String>,
    /// CORS: allow credentials.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub allow_credentials: bool,
    /// Also serve every route under this path prefix.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub root_path: Option<String>,
    /// Do not serve /openapi.json.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub disable_fastapi_docs: bool,
    /// Logprob tokens as `token_id:N`.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub return_tokens_as_token_ids: bool,
    /// Let chat requests bring their own `chat_template` (refused with a 400 otherwise: a
    /// template is a program the server runs).
    #[arg(long, help_heading = "vLLM compatibility")]
    pub trust_request_chat_template: bool,
    /// The role chat replies report when the request adds a generation prompt.
    #[arg(
        long,
        value_name = "ROLE",
        default_value = "assistant",
        help_heading = "vLLM compatibility"
    )]
    pub response_role: String,
    /// Serve GET /tokenizer_info (tokenizer config and chat template).
    #[arg(long, help_heading = "vLLM compatibility")]
    pub enable_tokenizer_info_endpoint: bool,
    /// Always on: usage reports `prompt_tokens_details.cached_tokens`.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub enable_prompt_tokens_details: bool,
    /// The default already: prompts are logged only with --enable-log-requests.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub disable_log_requests: bool,
    /// Level of the access log: critical, error, warning, info, debug, trace.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub uvicorn_log_level: Option<String>,
    /// No access-log lines.
    #[arg(long, help_heading = "vLLM compatibility")]
    pub disable_uvicorn_access_log: bool,
    /// KV-cache events for prefix-aware routers, vLLM's JSON: enable_kv_cache_events,
    /// publisher (zmq, null), endpoint, replay_endpoint, topic, buffer_steps, hwm,
    /// max_queue_size.
    #[arg(long, value_name = "JSON", help_heading = "vLLM compatibility")]
    pub kv_events_config: Option<String>,
    /// Cap on `logprobs`, `top_logprobs` and `prompt_logprobs`.
    #[arg(long, default_value_t = tokenmill_protocol::DEFAULT_MAX_LOGPROBS, help_heading = "vLLM compatibility")]
    pub max_logprobs: u32,
}

impl VllmArgs {
    /// Checks the values tokenmill supports and returns the warnings for flags without effect.
    /// Called before the model loads, so a refused flag fails fast.
    pub fn check(&self) -> anyhow::Result<Vec<String>> {
        let mut warnings = Vec::new();
        match self.model_dtype()? {
            ModelDtype::Auto | ModelDtype::Float32 => {}
            ModelDtype::Float16 => warnings.push(
                "--dtype float16: activations are computed in f32 on the CPU and the weights \
                 keep their file types; the flag only sets what --kv-cache-dtype auto stores"
                    .to_string(),
            ),
            ModelDtype::BFloat16 => warnings.push(
                "--dtype bfloat16: BERT encoders (--runner pooling) run their linear layers in \
                 bf16 (f32 accumulation); decoders compute activations in f32 with the weights' \
                 file types, the flag setting what --kv-cache-dtype auto stores"
                    .to_string(),
            ),
        }
        if let Some(quantization) = self.quantization.as_deref() {
            if !quantization.eq_ignore_ascii_case("gguf") {
                bail!(
                    "--quantization {quantization} is not supported: tokenmill reads the weights' \
                     quantization from the GGUF file (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, \
                     Q5_K, Q6_K ...); pass a GGUF quantized that way, or `--quantization gguf`"
                );
            }
        }
        if let Some(format) = self.load_format.as_deref() {
            if !matches!(format, "auto" | "gguf" | "safetensors") {
                bail!("--load-format {format} is not supported: use auto, gguf or safetensors");
            }
        }
        if let Some(device) = self.device.as_deref() {
            if !matches!(device, "cpu" | "auto") {
                bail!("--device {device} is not supported: tokenmill runs on the CPU (cpu, auto)");
            }
        }
        if self.data_parallel_size == Some(0) {
            bail!("--data-parallel-size must be at least 1");
        }
        for (flag, value, what) in [
            (
                "--tensor-parallel-size",
                self.tensor_parallel_size,
                "one engine uses all of this host's cores (--threads)",
            ),
            (
                "--pipeline-parallel-size",
                self.pipeline_parallel_size,
                "one engine uses all of this host's cores (--threads)",
            ),
        ] {
            match value {
                Some(0) => bail!("{flag} must be at least 1"),
                Some(size) if size > 1 => {
                    bail!("{flag} {size} is not supported: tokenmill serves with {flag} 1; {what}")
                }
                _ => {}
            }
        }
        if let Some(fraction) = self.gpu_memory_utilization {
            if !(fraction > 0.0 && fraction <= 1.0) {
                bail!("--gpu-memory-utilization must be in (0, 1], got {fraction}");
            }
        }
        if let Some(level) = self.uvicorn_log_level.as_deref() {
            access_log_level(level)?;
        }
        self.kv_events()?;
        for (flag, set) in self.no_effect_flags() {
            if set {
                warnings.push(no_effect_warning(flag));
            }
        }
        Ok(warnings)
    }

    fn no_effect_flags(&self) -> [(&'static str, bool); 12] {
        [
            ("--trust-remote-code", self.trust_remote_code),
            ("--tokenizer-revision", self.tokenizer_revision.is_some()),
            ("--code-revision", self.code_revision.is_some()),
            ("--swap-space", self.swap_space.is_some()),
            ("--cpu-offload-gb", self.cpu_offload_gb.is_some()),
            ("--calculate-kv-scales", self.calculate_kv_scales),
            ("--enforce-eager", self.enforce_eager),
            (
                "--max-seq-len-to-capture",
                self.max_seq_len_to_capture.is_some(),
            ),
            (
                "--disable-custom-all-reduce",
                self.disable_custom_all_reduce,
            ),
            (
                "--distributed-executor-backend",
                self.distributed_executor_backend.is_some(),
            ),
            (
                "--disable-frontend-multiprocessing",
                self.disable_frontend_multiprocessing,
            ),
            (
                "--max-parallel-loading-workers",
                self.max_parallel_loading_workers.is_some(),
            ),
        ]
    }

    /// `--dtype`, parsed (`auto` when absent).
    fn model_dtype(&self) -> anyhow::Result<ModelDtype> {
        Ok(self
            .dtype
            .as_deref()
            .map(str::parse)
            .transpose()?
            .unwrap_or_default())
    }

    /// Applies the flags that change the engine.
    pub fn apply_to_engine(&self, config: &mut EngineConfig) -> anyhow::Result<()> {
        config.dtype = self.model_dtype()?;
        if let Some(fraction) = self.gpu_memory_utilization {
            config.kv_cache = KvCacheSizing::UtilizationOfAvailable(fraction);
        }
        config.kv_events = self.kv_events()?;
        config.data_parallel_size = self.data_parallel_size.unwrap_or(1);
        Ok(())
    }

    /// `--kv-events-config`, parsed and checked.
    fn kv_events(&self) -> anyhow::Result<Option<KvEventsConfig>> {
        Ok(self
            .kv_events_config
            .as_deref()
            .map(KvEventsConfig::parse)
            .transpose()?)
    }

    /// Applies the flags that change the HTTP server.
    pub fn apply_to_server(&self, server: &mut ServerConfig) -> anyhow::Result<()> {
        server.cors = Some(
            CorsConfig::new(
                &json_list("--allowed-origins", self.allowed_origins.as_deref())?,
                &json_list("--allowed-methods", self.allowed_methods.as_deref())?,
                &json_list("--allowed-headers", self.allowed_headers.as_deref())?,
                self.allow_credentials,
            )
            .map_err(anyhow::Error::msg)?,
        );
        server.root_path = match self.root_path.as_deref().map(str::trim) {
            None | Some("") | Some("/") => None,
            Some(path) if path.starts_with('/') => Some(path.trim_end_matches('/').to_string()),
            Some(path) => bail!("--root-path must start with '/', got {path}"),
        };
        server.serve_openapi = !self.disable_fastapi_docs;
        server.enable_tokenizer_info_endpoint = self.enable_tokenizer_info_endpoint;
        server.return_tokens_as_token_ids = self.return_tokens_as_token_ids;
        server.trust_request_chat_template = self.trust_request_chat_template;
        if self.response_role.trim().is_empty() {
            bail!("--response-role must not be empty");
        }
        server.response_role = self.response_role.clone();
        server.max_logprobs = self.max_logprobs;
        Ok(())
    }

    /// The tracing directive for the access log that `--uvicorn-log-level` /
    /// `--disable-uvicorn-access-log` ask for, if any.
    pub fn access_log_directive(&self) -> Option<String> {
        if self.disable_uvicorn_access_log {
            return Some(format!("{ACCESS_LOG_TARGET}=off"));
        }
        let level = access_log_level(self.uvicorn_log_level.as_deref()?).ok()?;
        Some(format!("{ACCESS_LOG_TARGET}={level}"))
    }
}

/// The tracing target of the server's access-log lines.
const ACCESS_LOG_TARGET: &str = "tokenmill::access";

/// uvicorn's level names as tracing levels (`critical` has no twin: `error`).
fn access_log_level(level: &str) -> anyhow::Result<&'static str> {
    Ok(match level.to_ascii_lowercase().as_str() {
        "critical" | "error" => "error",
        "warning" | "warn" => "warn",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        other => bail!(
            "--uvicorn-log-level {other} is not a level: use critical, error, warning, info, \
             debug or trace"
        ),
    })
}

fn no_effect_warning(flag: &str) -> String {
    let note = VLLM_FLAGS
        .iter()
        .find(|row| row.flag == flag)
        .map_or("", |row| row.note);
    format!("{flag} has no effect on tokenmill: {note}")
}

/// A JSON list of strings, vLLM's format for the CORS flags; absent means `["*"]`.
fn json_list(flag: &str, value: Option<&str>) -> anyhow::Result<Vec<String>> {
    let Some(value) = value else {
        return Ok(vec!["*".to_string()]);
    };
    serde_json::from_str::<Vec<String>>(value)
        .with_context(|| format!("{flag} must be a JSON list of strings, e.g. '[\"*\"]'"))
}

/// vLLM's two-letter short flags, which clap cannot declare.
const SHORT_ALIASES: &[(&str, &str)] = &[
    ("-tp", "--tensor-parallel-size"),
    ("-pp", "--pipeline-parallel-size"),
    ("-dp", "--data-parallel-size"),
];

/// Rewrites a `serve` command line the way vLLM reads it: `-tp`/`-pp`/`-dp` become their long
/// forms, and `--config FILE.yaml` is expanded: the file's keys become flags placed right after
/// `serve`, so flags given on the command line (parsed later) win. Other command lines are
/// returned unchanged.
pub fn normalize_serve_args(args: Vec<String>) -> anyhow::Result<Vec<String>> {
    // The subcommand is the first argument (the CLI has no global flags).
    let serve_at = 1;
    if args.get(serve_at).map(String::as_str) != Some("serve") {
        return Ok(args);
    }
    let mut file = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut dotted = DottedJsonFlags::default();
    let mut iter = args[serve_at + 1..].iter();
    while let Some(arg) = iter.next() {
        if dotted.take(arg, &mut iter)? {
            continue;
        }
        if let Some((_, long)) = SHORT_ALIASES.iter().find(|(short, _)| short == arg) {
            rest.push((*long).to_string());
        } else if arg == "--config" {
            file = Some(
                iter.next()
                    .context("--config needs a file name")?
                    .to_string(),
            );
        } else if let Some(name) = arg.strip_prefix("--config=") {
            file = Some(name.to_string());
        } else {
            rest.push(arg.clone());
        }
    }
    rest.extend(dotted.into_args());
    let mut expanded = args[..=serve_at].to_vec();
    let Some(file) = file else {
        expanded.extend(rest);
        return Ok(expanded);
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("cannot read --config {file}"))?;
    let from_file = config_flags(&text).with_context(|| format!("--config {file}"))?;
    expanded.extend(from_file);
    expanded.extend(rest);
    Ok(expanded)
}

/// vLLM's JSON-valued flags, which also take one key per argument:
/// `--structured-outputs-config.backend guidance` or `...backend=guidance` (the value is read
/// as JSON when it parses, else as a string; a key with no value is `true`).
const JSON_FLAGS: &[&str] = &[
    "--structured-outputs-config",
    "--speculative-config",
    "--kv-events-config",
];

/// The JSON flags of one command line: the whole-object form and the dotted keys, merged
/// into one object per flag (dotted keys win).
type JsonObject = serde_json::Map<String, serde_json::Value>;

#[derive(Default)]
struct DottedJsonFlags {
    objects: Vec<(&'static str, JsonObject)>,
}

impl DottedJsonFlags {
    fn object(&mut self, flag: &'static str) -> &mut JsonObject {
        let at = match self.objects.iter().position(|(name, _)| *name == flag) {
            Some(at) => at,
            None => {
                self.objects.push((flag, JsonObject::new()));
                self.objects.len() - 1
            }
        };
        &mut self.objects[at].1
    }

    /// Takes `arg` (and its value from `iter`) if it is one of these flags' forms.
    fn take(&mut self, arg: &str, iter: &mut std::slice::Iter<'_, String>) -> anyhow::Result<bool> {
        for &flag in JSON_FLAGS {
            let Some(tail) = arg.strip_prefix(flag) else {
                continue;
            };
            if tail.is_empty() || tail.starts_with('=') {
                let text = match tail.strip_prefix('=') {
                    Some(text) => text.to_string(),
                    None => iter
                        .next()
                        .with_context(|| format!("{flag} needs a JSON value"))?
                        .clone(),
                };
                let value: serde_json::Value = serde_json::from_str(&text)
                    .with_context(|| format!("{flag} is not JSON: {text}"))?;
                let serde_json::Value::Object(whole) = value else {
                    bail!("{flag} must be a JSON object, got {text}");
                };
                let object = self.object(flag);
                for (key, value) in whole {
                    object.entry(key).or_insert(value);
                }
                return Ok(true);
            }
            let Some(key_value) = tail.strip_prefix('.') else {
                continue;
            };
            let (key, text) = match key_value.split_once('=') {
                Some((key, text)) => (key, text.to_string()),
                None => match iter.as_slice().first() {
                    Some(next) if !next.starts_with("--") => {
                        let next = next.clone();
                        iter.next();
                        (key_value, next)
                    }
                    _ => (key_value, "true".to_string()),
                },
            };
            if key.is_empty() {
                bail!("{arg}: a key is missing after '{flag}.'");
            }
            let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
            self.object(flag).insert(key.replace('-', "_"), value);
            return Ok(true);
        }
        Ok(false)
    }

    fn into_args(self) -> Vec<String> {
        self.objects
            .into_iter()
            .flat_map(|(flag, object)| {
                [
                    flag.to_string(),
                    serde_json::Value::Object(object).to_string(),
                ]
            })
            .collect()
    }
}

/// A YAML mapping of flag names to values as command-line arguments: `true` → `--flag`,
/// `false` → nothing (or `--no-flag` for the flags that have one), lists → the values in
/// order, mappings → one JSON argument, anything else → its text.
fn config_flags(text: &str) -> anyhow::Result<Vec<String>> {
    let document: serde_yaml::Value = serde_yaml::from_str(text).context("not valid YAML")?;
    let serde_yaml::Value::Mapping(mapping) = document else {
        bail!("the file must be a mapping of flag names to values");
    };
    let mut flags = Vec::new();
    for (key, value) in mapping {
        let Some(key) = key.as_str() else {
            bail!("flag names must be strings, got {key:?}");
        };
        if key == "config" {
            bail!("a --config file cannot name another --config");
        }
        let flag = format!("--{}", key.replace('_', "-"));
        match value {
            serde_yaml::Value::Bool(true) => flags.push(flag),
            serde_yaml::Value::Bool(false) => {
                if NEGATABLE.contains(&key.replace('_', "-").as_str()) {
                    flags.push(format!("--no-{}", key.replace('_', "-")));
                }
            }
            serde_yaml::Value::Null => {}
            serde_yaml::Value::Sequence(items) => {
                flags.push(flag);
                for item in items {
                    flags.push(scalar_text(&item)?);
                }
            }
            serde_yaml::Value::Mapping(_) => {
                flags.push(flag);
                flags.push(serde_json::to_string(&value).context("cannot convert to JSON")?);
            }
            scalar => {
                flags.push(flag);
                flags.push(scalar_text(&scalar)?);
            }
        }
    }
    Ok(flags)
}

/// Flags with a `--no-` form.
const NEGATABLE: &[&str] = &["enable-prefix-caching", "enable-chunked-prefill"];

fn scalar_text(value: &serde_yaml::Value) -> anyhow::Result<String> {
    Ok(match value {
        serde_yaml::Value::String(text) => text.clone(),
        serde_yaml::Value::Number(number) => number.to_string(),
        serde_yaml::Value::Bool(flag) => flag.to_string(),
        other => serde_json::to_string(other).context("cannot convert to JSON")?,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn serve_args(args: &[&str]) -> Result<crate::serve::ServeArgs, String> {
        let mut argv = vec!["tokenmill".to_string(), "serve".to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let argv = normalize_serve_args(argv).map_err(|e| format!("{e:#}"))?;
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Serve(args) => Ok(*args),
            _ => Err("not serve".into()),
        }
    }

    #[test]
    fn every_flag_in_the_table_parses_and_its_example_is_accepted() {
        for row in VLLM_FLAGS {
            if row.flag == "--config" {
                continue; // Expanded before parsing; tested below.
            }
            let mut args = vec![row.flag];
            if !row.example.is_empty() {
                args.push(row.example);
            }
            // The TLS pair is only accepted together.
            match row.flag {
                "--ssl-keyfile" => args.extend(["--ssl-certfile", "cert.pem"]),
                "--ssl-certfile" => args.extend(["--ssl-keyfile", "key.pem"]),
                _ => {}
            }
            let parsed = serve_args(&args).unwrap_or_else(|e| panic!("{}: {e}", row.flag));
            let warnings = parsed
                .vllm
                .check()
                .unwrap_or_else(|e| panic!("{} {}: {e}", row.flag, row.example));
            match row.treatment {
                Treatment::NoEffect => assert!(
                    warnings.iter().any(|w| w.starts_with(row.flag)),
                    "{} must warn: {warnings:?}",
                    row.flag
                ),
                Treatment::Same => assert!(warnings.is_empty(), "{}: {warnings:?}", row.flag),
                Treatment::Restricted => {}
            }
        }
    }

    #[test]
    fn flags_are_unique_and_documented() {
        let mut seen = std::collections::HashSet::new();
        for row in VLLM_FLAGS {
            assert!(seen.insert(row.flag), "{} twice", row.flag);
            assert!(
                row.flag.starts_with("--") && !row.note.is_empty(),
                "{}",
                row.flag
            );
        }
    }

    #[test]
    fn readme_table_is_generated_from_the_flag_list() {
        let readme = include_str!("../../../README.md");
        let begin = "<!-- vllm-flags:begin (tokenmill serve --print-vllm-flags) -->\n";
        let end = "<!-- vllm-flags:end -->";
        let start = readme.find(begin).expect("README has the vLLM flag table") + begin.len();
        let stop = readme[start..].find(end).expect("the table ends") + start;
        assert_eq!(
            &readme[start..stop],
            markdown_table(),
            "regenerate the README table with `tokenmill serve --print-vllm-flags`"
        );
    }

    #[test]
    fn unsupported_values_are_refused_naming_what_works() {
        for (args, expected) in [
            (
                &["--tensor-parallel-size", "2"][..],
                "--tensor-parallel-size 1",
            ),
            (&["-tp", "4"][..], "--tensor-parallel-size 1"),
            (&["-dp", "0"][..], "--data-parallel-size must be at least 1"),
            (&["--quantization", "awq"][..], "GGUF"),
            (&["-q", "gptq"][..], "GGUF"),
            (&["--dtype", "float64"][..], "bfloat16"),
            (&["--device", "cuda"][..], "cpu"),
            (&["--gpu-memory-utilization", "1.5"][..], "(0, 1]"),
            (&["--uvicorn-log-level", "loud"][..], "warning"),
            (&["--load-format", "pt"][..], "safetensors"),
            (
                &["--kv-events-config", r#"{"publisher":"kafka"}"#][..],
                "kafka",
            ),
        ] {
            let error = serve_args(args)
                .unwrap()
                .vllm
                .check()
                .unwrap_err()
                .to_string();
            assert!(error.contains(expected), "{args:?}: {error}");
        }
        let warnings = serve_args(&["--dtype", "bfloat16", "--enforce-eager"])
            .unwrap()
            .vllm
            .check()
            .unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
    }

    #[test]
    fn vllm_quickstart_command_lines_parse() {
        // From vLLM's quick-start and deployment docs, with a local model path.
        for line in [
            "model.gguf --dtype auto --api-key token-abc123",
            "--model model.gguf --gpu-memory-utilization 0.9 --max-model-len 4096 --seed 0",
            "model.gguf --tensor-parallel-size 1 --enforce-eager --trust-remote-code",
            "model.gguf --host 0.0.0.0 --port 8000 --served-model-name m --disable-log-requests",
            "model.gguf --enable-chunked-prefill --max-num-batched-tokens 2048 --max-num-seqs 32",
        ] {
            let args: Vec<&str> = line.split_whitespace().collect();
            let parsed = serve_args(&args).unwrap_or_else(|e| panic!("{line}: {e}"));
            parsed
                .vllm
                .check()
                .unwrap_or_else(|e| panic!("{line}: {e}"));
        }
    }

    #[test]
    fn config_file_flags_come_first_so_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("serve.yaml");
        std::fs::write(
            &file,
            "model: a.gguf\nport: 9000\nmax_num_seqs: 8\nenable-prefix-caching: false\n\
             trust_remote_code: true\nserved-model-name: [one, two]\nallowed_origins: '[\"*\"]'\n",
        )
        .unwrap();
        let file = file.to_str().unwrap();
        let parsed = serve_args(&["--config", file, "--port", "9001"]).unwrap();
        assert_eq!(parsed.port, 9001, "the command line wins");
        assert_eq!(parsed.engine.model.as_deref(), Some("a.gguf"));
        assert_eq!(parsed.engine.max_num_seqs, 8);
        assert!(parsed.engine.no_enable_prefix_caching);
        assert!(parsed.vllm.trust_remote_code);
        assert_eq!(parsed.served_model_name, ["one", "two"]);
        let equals = serve_args(&[&format!("--config={file}")]).unwrap();
        assert_eq!(equals.port, 9000);
        std::fs::write(dir.path().join("bad.yaml"), "- a\n- b\n").unwrap();
        let bad = dir.path().join("bad.yaml");
        let error = serve_args(&["--config", bad.to_str().unwrap()]).unwrap_err();
        assert!(error.contains("mapping"), "{error}");
        assert!(serve_args(&["--config", "/nonexistent.yaml"]).is_err());
    }

    #[test]
    fn disable_hybrid_kv_cache_manager_reaches_the_engine_config() {
        assert!(
            !serve_args(&[])
                .unwrap()
                .engine
                .disable_hybrid_kv_cache_manager
        );
        let parsed = serve_args(&["--disable-hybrid-kv-cache-manager"]).unwrap();
        assert!(parsed.engine.disable_hybrid_kv_cache_manager);
    }

    #[test]
    fn chunked_prefill_and_response_role_parse_as_in_vllm() {
        let parsed =
            serve_args(&["--no-enable-chunked-prefill", "--response-role", "bot"]).unwrap();
        assert!(parsed.engine.no_enable_chunked_prefill);
        assert_eq!(parsed.vllm.response_role, "bot");
        let last_wins =
            serve_args(&["--no-enable-chunked-prefill", "--enable-chunked-prefill"]).unwrap();
        assert!(!last_wins.engine.no_enable_chunked_prefill);
        assert_eq!(serve_args(&[]).unwrap().vllm.response_role, "assistant");
        let mut server = ServerConfig::new(vec!["m".into()]);
        let empty = serve_args(&["--response-role", " "]).unwrap();
        assert!(empty.vllm.apply_to_server(&mut server).is_err());
    }

    #[test]
    fn json_flags_take_vllm_dotted_keys() {
        let parsed = serve_args(&[
            "--structured-outputs-config.backend",
            "guidance",
            "--structured-outputs-config.disable_any_whitespace",
            "--structured-outputs-config",
            r#"{"backend": "auto", "disable_additional_properties": true}"#,
            "--structured-outputs-config.disable-fallback=false",
            "--port",
            "9001",
        ])
        .unwrap();
        let text = parsed
            .engine
            .structured_outputs
            .structured_outputs_config
            .unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"backend": "guidance", "disable_any_whitespace": true,
                               "disable_additional_properties": true, "disable_fallback": false})
        );
        assert_eq!(parsed.port, 9001);
        assert!(serve_args(&["--structured-outputs-config", "[1]"]).is_err());
        assert!(serve_args(&["--structured-outputs-config.", "x"]).is_err());
    }

    #[test]
    fn other_subcommands_are_left_alone() {
        let argv: Vec<String> = ["tokenmill", "generate", "--config", "x", "-tp"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(normalize_serve_args(argv.clone()).unwrap(), argv);
    }

    #[test]
    fn access_log_level_maps_uvicorn_names() {
        let args = serve_args(&["--uvicorn-log-level", "warning"]).unwrap();
        assert_eq!(
            args.vllm.access_log_directive().as_deref(),
            Some("tokenmill::access=warn")
        );
        let off = serve_args(&["--disable-uvicorn-access-log"]).unwrap();
        assert_eq!(
            off.vllm.access_log_directive().as_deref(),
            Some("tokenmill::access=off")
        );
    }
}
