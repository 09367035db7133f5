//! Server settings, filled from `tokenmill serve` flags (vLLM's names).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokenmill_protocol::{SamplingDefaults, ToolSettings};
use tokenmill_response_store::ResponseStore;

use crate::cors::CorsConfig;

/// PEM files for HTTPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Everything the HTTP layer needs besides the engine.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Names clients may use for the model; the first one is reported in responses/metrics.
    pub served_model_names: Vec<String>,
    /// Bearer token required on every route except `/health` (and `/metrics` unless
    /// `api_key_metrics`).
    pub api_key: Option<String>,
    pub api_key_metrics: bool,
    pub tls: Option<TlsConfig>,
    /// How long a drain waits for in-flight requests before aborting them.
    pub shutdown_timeout: Duration,
    /// Request bodies above this get a 413.
    pub max_body_bytes: usize,
    /// Cap on `n`.
    pub max_n: u32,
    /// Log prompts (truncated to `max_log_len` characters) with each request.
    pub enable_log_requests: bool,
    pub max_log_len: Option<usize>,
    /// Paths (e.g. `/health,/metrics`) without access-log lines.
    pub disable_access_log_for_endpoints: Vec<String>,
    /// Defaults from `--generation-config`.
    pub sampling_defaults: SamplingDefaults,
    /// Cap on `logprobs`, `top_logprobs` and `prompt_logprobs` (`--max-logprobs`).
    pub max_logprobs: u32,
    /// Logprob tokens as `token_id:N` (`--return-tokens-as-token-ids`).
    pub return_tokens_as_token_ids: bool,
    /// Chat requests may bring their own `chat_template` (`--trust-request-chat-template`);
    /// otherwise such a request is a 400, as in vLLM.
    pub trust_request_chat_template: bool,
    /// CORS headers (vLLM's defaults allow any origin); `None` sends none.
    pub cors: Option<CorsConfig>,
    /// Serve every route under this prefix as well (`--root-path`, no trailing `/`).
    pub root_path: Option<String>,
    /// Serve `/openapi.json` (off with `--disable-fastapi-docs`).
    pub serve_openapi: bool,
    /// Serve `GET /tokenizer_info` (`--enable-tokenizer-info-endpoint`; it exposes the chat
    /// template, so it is off by default as in vLLM).
    pub enable_tokenizer_info_endpoint: bool,
    /// A connection that has not sent a complete request head within this is closed
    /// (slow-loris defence; also bounds idle keep-alive connections).
    pub header_read_timeout: Duration,
    /// A request body not received completely within this gets a 408.
    pub body_read_timeout: Duration,
    /// Generation requests beyond this many waiting get a 503 with `Retry-After`; `None` = no
    /// bound.
    pub max_waiting_requests: Option<usize>,
    /// Admission jobs (template renders, grammar compiles, tokenizing long prompts) run at
    /// once on the blocking pool (`--max-admission-jobs`; default: the cores available).
    pub max_admission_jobs: usize,
    /// `--enable-auto-tool-choice`, `--tool-call-parser`, `--exclude-tools-when-tool-choice-none`.
    pub tools: ToolSettings,
    /// `--reasoning-parser`.
    pub reasoning_parser: Option<String>,
    /// The role chat replies report when the request adds a generation prompt
    /// (`--response-role`; without one the reply continues the last message, whose role it
    /// reports, as vLLM does).
    pub response_role: String,
    /// Serve `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`
    /// (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=true` or `--allow-runtime-lora-updating`).
    pub allow_runtime_lora_updating: bool,
    /// Where `/v1/responses` keeps stored responses (`--responses-store`; `None`: nothing is
    /// stored, `store: true` answers `store: false`).
    pub response_store: Option<Arc<ResponseStore>>,
}

/// Default of both read timeouts.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

impl ServerConfig {
    pub fn new(served_model_names: Vec<String>) -> ServerConfig {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            served_model_names,
            api_key: None,
            api_key_metrics: false,
            tls: None,
            shutdown_timeout: Duration::from_secs(30),
            max_body_bytes: 32 << 20,
            max_n: 128,
            enable_log_requests: false,
            max_log_len: None,
            disable_access_log_for_endpoints: Vec::new(),
            sampling_defaults: SamplingDefaults::default(),
            max_logprobs: tokenmill_protocol::DEFAULT_MAX_LOGPROBS,
            return_tokens_as_token_ids: false,
            trust_request_chat_template: false,
            cors: Some(CorsConfig::default()),
            root_path: None,
            serve_openapi: true,
            enable_tokenizer_info_endpoint: false,
            header_read_timeout: DEFAULT_READ_TIMEOUT,
            body_read_timeout: DEFAULT_READ_TIMEOUT,
            max_waiting_requests: None,
            max_admission_jobs: std::thread::available_parallelism().map_or(2, usize::from),
            tools: ToolSettings::default(),
            reasoning_parser: None,
            response_role: "assistant".into(),
            allow_runtime_lora_updating: false,
            response_store: None,
        }
    }

    /// The name responses report.
    pub fn primary_model_name(&self) -> &str {
        self.served_model_names
            .first()
            .map(String::as_str)
            .unwrap_or("tokenmill")
    }
}
