//! `tokenmill bench serve` options, named as `vllm bench serve` names them, and their checked
//! form ([`BenchPlan`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::BenchError;

/// Which prompts to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DatasetName {
    /// Synthetic prompts of random tokens with exact token lengths.
    #[value(name = "random")]
    Random,
    /// The first turn of each ShareGPT conversation (JSON file).
    #[value(name = "sharegpt")]
    Sharegpt,
    /// Random suffixes behind a few shared random prefixes (exercises prefix caching).
    #[value(name = "prefix_repetition")]
    PrefixRepetition,
    /// A JSONL file with a "prompt" per line (and optionally "output_tokens"/"output_len").
    #[value(name = "custom")]
    Custom,
    /// tokenmill's input-grounded prompts (code edits that re-emit a file, quotes from a
    /// context), where speculative decoding's n-gram and suffix drafts pay off.
    #[value(name = "input_grounded")]
    InputGrounded,
    /// Prompts asking for JSON, constrained by a few JSON schemas (vLLM's structured-output
    /// benchmark's `json`); the share of outputs that validate is reported.
    #[value(name = "json")]
    Json,
    /// As `json`, with a schema of its own for every request: each one a cold grammar compile.
    #[value(name = "json-unique")]
    JsonUnique,
}

/// The options of `tokenmill bench serve` (vLLM's `vllm bench serve` names and defaults).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchServeArgs {
    /// Server or API base URL, e.g. http://127.0.0.1:8000 (overrides --host/--port).
    #[arg(long)]
    pub base_url: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API endpoint: /v1/completions, /v1/chat/completions, /v1/messages (Anthropic's
    /// Messages API, streamed events), or /v1/embeddings (a pooling server: one non-streamed
    /// request per prompt; E2EL percentiles and request/input-token throughput are what it
    /// measures).
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// Model name sent in requests (default: the first id of GET /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Model name used in the API if it differs from --model.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Bearer token for the server.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A local tokenizer.json used to build prompts of exact token lengths (default: the
    /// server's /tokenize and /detokenize, else an approximate word-based construction).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Benchmark label, the prefix of the result file name (default: "openai").
    #[arg(long)]
    pub label: Option<String>,

    #[arg(long, value_enum, default_value = "random")]
    pub dataset_name: DatasetName,
    /// ShareGPT JSON or custom JSONL file.
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// General input length; maps to --random-input-len.
    #[arg(long)]
    pub input_len: Option<usize>,
    /// General output length; maps to every dataset's output length option.
    #[arg(long)]
    pub output_len: Option<usize>,
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    /// Input and output lengths are drawn uniformly from [len·(1−r), len·(1+r)].
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// A random prefix shared by all random prompts.
    #[arg(long, default_value_t = 0)]
    pub random_prefix_len: usize,
    #[arg(long, default_value_t = 256)]
    pub prefix_repetition_prefix_len: usize,
    #[arg(long, default_value_t = 256)]
    pub prefix_repetition_suffix_len: usize,
    #[arg(long, default_value_t = 10)]
    pub prefix_repetition_num_prefixes: usize,
    #[arg(long, default_value_t = 128)]
    pub prefix_repetition_output_len: usize,
    /// Output length for ShareGPT requests (default: the reference completion's length).
    #[arg(long)]
    pub sharegpt_output_len: Option<usize>,
    /// Output length for custom requests that do not name their own.
    #[arg(long, default_value_t = 256)]
    pub custom_output_len: usize,
    /// Output length of input_grounded requests (enough to re-emit the edited file).
    #[arg(long, default_value_t = 256)]
    pub input_grounded_output_len: usize,
    /// `json` datasets: the share of requests sent with their schema (the others send the same
    /// prompt unconstrained). vLLM's structured-output benchmark's option.
    #[arg(long, default_value_t = 1.0)]
    pub structured_output_ratio: f64,
    /// `json` datasets: one JSON schema file to use instead of the built-in schemas.
    #[arg(long)]
    pub json_schema_path: Option<PathBuf>,
    /// Output length (max_tokens) of `json` requests: enough to finish the object.
    #[arg(long, default_value_t = 256)]
    pub structured_output_len: usize,

    /// Requests per second ("inf" sends all at once); arrivals are Poisson, or gamma with
    /// --burstiness.
    #[arg(long, default_value = "inf")]
    pub request_rate: f64,
    /// Gamma shape of inter-arrival gaps: 1.0 is Poisson, lower is burstier.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// At most this many requests in flight.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub num_warmups: usize,
    /// Send ignore_eos (always on for the random dataset, as vLLM does).
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long)]
    pub temperature: Option<f64>,
    #[arg(long)]
    pub top_p: Option<f64>,
    #[arg(long)]
    pub top_k: Option<i64>,
    #[arg(long)]
    pub min_p: Option<f64>,
    /// A JSON object merged into every request body.
    #[arg(long)]
    pub extra_body: Option<String>,

    /// Metrics with percentile sections: ttft,tpot,itl,e2el,client_queue_time,
    /// e2el_including_client_queue. Default, as vLLM's: ttft,tpot,itl for the generation
    /// endpoints, e2el for /v1/embeddings.
    #[arg(long)]
    pub percentile_metrics: Option<String>,
    /// Percentiles reported for each selected metric, e.g. 50,90,99.
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    /// Service level objectives as KEY:MS pairs (ttft, tpot, e2el).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,

    #[arg(long)]
    pub save_result: bool,
    /// Accepted for vLLM compatibility: per-request records are always saved.
    #[arg(long)]
    pub save_detailed: bool,
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    #[arg(long)]
    pub result_filename: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub disable_tqdm: bool,

    /// Run once per max-concurrency value (comma list) and write a summary CSV/JSON and plots.
    #[arg(long, value_delimiter = ',', conflicts_with = "sweep_request_rate")]
    pub sweep_concurrency: Vec<usize>,
    /// Run once per request rate (comma list) and write a summary CSV/JSON and plots.
    #[arg(long, value_delimiter = ',')]
    pub sweep_request_rate: Vec<f64>,
}

/// API flavour of the endpoint, decided by its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointKind {
    Completions,
    ChatCompletions,
    /// `/v1/embeddings`: not streamed; the whole response is the request's latency.
    Embeddings,
    /// `/v1/messages`: Anthropic's Messages API, its `content_block_delta` events timed.
    Messages,
    /// `/v1/responses`: OpenAI's Responses API, its `response.*.delta` events timed.
    Responses,
}

/// A metric that can get a percentile section in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PercentileMetric {
    Ttft,
    Tpot,
    Itl,
    E2el,
    ClientQueueTime,
    E2elIncludingClientQueue,
}

impl PercentileMetric {
    /// vLLM's attribute name: the key stem in the result JSON.
    pub fn key(self) -> &'static str {
        match self {
            PercentileMetric::Ttft => "ttft",
            PercentileMetric::Tpot => "tpot",
            PercentileMetric::Itl => "itl",
            PercentileMetric::E2el => "e2el",
            PercentileMetric::ClientQueueTime => "client_queue_time",
            PercentileMetric::E2elIncludingClientQueue => "e2el_including_client_queue",
        }
    }

    fn parse(name: &str) -> Result<Self, BenchError> {
        Ok(match name.trim() {
            "ttft" => PercentileMetric::Ttft,
            "tpot" => PercentileMetric::Tpot,
            "itl" => PercentileMetric::Itl,
            "e2el" => PercentileMetric::E2el,
            "client_queue_time" => PercentileMetric::ClientQueueTime,
            "e2el_including_client_queue" => PercentileMetric::E2elIncludingClientQueue,
            other => {
                return Err(BenchError::InvalidArgument(format!(
                    "unknown percentile metric {other:?} (allowed: ttft, tpot, itl, e2el, \
                     client_queue_time, e2el_including_client_queue)"
                )))
            }
        })
    }
}

/// Goodput service level objectives in milliseconds (vLLM's `--goodput`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GoodputSlo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl GoodputSlo {
    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tpot_ms.is_none() && self.e2el_ms.is_none()
    }

    /// Parses `KEY:VALUE` pairs; keys are ttft, tpot, e2el; values are non-negative ms.
    pub fn parse(pairs: &[String]) -> Result<Self, BenchError> {
        let mut slo = GoodputSlo::default();
        for pair in pairs {
            let (name, value) = pair.split_once(':').ok_or_else(|| {
                BenchError::InvalidArgument(format!(
                    "invalid goodput {pair:?}: specify service level objectives as \
                     \"KEY:VALUE\" pairs, the value a number in milliseconds"
                ))
            })?;
            let value: f64 = value.trim().parse().map_err(|_| {
                BenchError::InvalidArgument(format!("invalid goodput value in {pair:?}"))
            })?;
            if value.is_nan() || value < 0.0 {
                return Err(BenchError::InvalidArgument(format!(
                    "invalid goodput value in {pair:?}: must be non-negative"
                )));
            }
            match name.trim() {
                "ttft" => slo.ttft_ms = Some(value),
                "tpot" => slo.tpot_ms = Some(value),
                "e2el" => slo.e2el_ms = Some(value),
                other => {
                    return Err(BenchError::InvalidArgument(format!(
                        "invalid goodput metric {other:?}: should be one of ttft, tpot, e2el"
                    )))
                }
            }
        }
        Ok(slo)
    }
}

/// The checked, typed form of [`BenchServeArgs`].
#[derive(Debug, Clone)]
pub struct BenchPlan {
    pub base_url: String,
    pub api_url: String,
    pub endpoint_kind: EndpointKind,
    pub percentile_metrics: Vec<PercentileMetric>,
    pub percentiles: Vec<f64>,
    pub goodput: GoodputSlo,
    /// Sampling parameters and --extra-body, merged into every request body.
    pub extra_body: serde_json::Map<String, serde_json::Value>,
    pub ignore_eos: bool,
}

impl BenchServeArgs {
    /// Validates the options and resolves vLLM's aliases (--input-len, --output-len).
    pub fn plan(&mut self) -> Result<BenchPlan, BenchError> {
        if let Some(input_len) = self.input_len {
            self.random_input_len = input_len;
        }
        if let Some(output_len) = self.output_len {
            self.random_output_len = output_len;
            self.sharegpt_output_len = Some(output_len);
            self.custom_output_len = output_len;
            self.prefix_repetition_output_len = output_len;
            self.input_grounded_output_len = output_len;
            self.structured_output_len = output_len;
        }
        if self.max_concurrency == Some(0) {
            return Err(BenchError::InvalidArgument(
                "--max-concurrency must be greater than 0".into(),
            ));
        }
        if self.sweep_concurrency.contains(&0) {
            return Err(BenchError::InvalidArgument(
                "--sweep-concurrency values must be greater than 0".into(),
            ));
        }
        for rate in
            std::iter::once(self.request_rate).chain(self.sweep_request_rate.iter().copied())
        {
            if rate.is_nan() || rate <= 0.0 {
                return Err(BenchError::InvalidArgument(format!(
                    "request rate must be positive, got {rate}"
                )));
            }
        }
        if self.burstiness.is_nan() || self.burstiness <= 0.0 {
            return Err(BenchError::InvalidArgument(format!(
                "a positive burstiness factor is expected, got {}",
                self.burstiness
            )));
        }
        if self.num_prompts == 0 {
            return Err(BenchError::InvalidArgument(
                "--num-prompts must be at least 1".into(),
            ));
        }
        if !(0.0..1.0).contains(&self.random_range_ratio) {
            return Err(BenchError::InvalidArgument(
                "--random-range-ratio must be in [0, 1)".into(),
            ));
        }
        let structured = matches!(
            self.dataset_name,
            DatasetName::Json | DatasetName::JsonUnique
        );
        if !structured && self.json_schema_path.is_some() {
            return Err(BenchError::InvalidArgument(
                "--json-schema-path applies to the json and json-unique datasets only".into(),
            ));
        }
        if !(0.0..=1.0).contains(&self.structured_output_ratio) {
            return Err(BenchError::InvalidArgument(format!(
                "--structured-output-ratio must be in [0, 1], got {}",
                self.structured_output_ratio
            )));
        }
        match self.dataset_name {
            DatasetName::Random
            | DatasetName::PrefixRepetition
            | DatasetName::InputGrounded
            | DatasetName::Json
            | DatasetName::JsonUnique => {
                if let Some(path) = &self.dataset_path {
                    return Err(BenchError::InvalidArgument(format!(
                        "cannot use the {:?} dataset with --dataset-path {}",
                        self.dataset_name,
                        path.display()
                    )));
                }
            }
            DatasetName::Sharegpt | DatasetName::Custom => {
                if self.dataset_path.is_none() {
                    return Err(BenchError::InvalidArgument(
                        "--dataset-path is required for the sharegpt and custom datasets".into(),
                    ));
                }
            }
        }
        if self.dataset_name == DatasetName::PrefixRepetition
            && self.num_prompts < self.prefix_repetition_num_prefixes.max(1)
        {
            return Err(BenchError::InvalidArgument(format!(
                "num_prompts ({}) must be greater than or equal to num_prefixes ({})",
                self.num_prompts, self.prefix_repetition_num_prefixes
            )));
        }
        // vLLM: the random dataset runs to the requested length.
        let ignore_eos = self.ignore_eos || self.dataset_name == DatasetName::Random;

        let base_url = match &self.base_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None if self.host.contains(':') => format!("http://[{}]:{}", self.host, self.port),
            None => format!("http://{}:{}", self.host, self.port),
        };
        let endpoint = if self.endpoint.starts_with('/') {
            self.endpoint.clone()
        } else {
            format!("/{}", self.endpoint)
        };
        let endpoint_kind = if endpoint.ends_with("chat/completions") {
            EndpointKind::ChatCompletions
        } else if endpoint.ends_with("completions") {
            EndpointKind::Completions
        } else if endpoint.ends_with("messages") {
            if self.ignore_eos {
                return Err(BenchError::InvalidArgument(
                    "--ignore-eos is not part of Anthropic's Messages API (/v1/messages \
                     refuses unknown fields)"
                        .into(),
                ));
            }
            EndpointKind::Messages
        } else if endpoint.ends_with("responses") {
            EndpointKind::Responses
        } else if endpoint.ends_with("embeddings") {
            if structured {
                return Err(BenchError::InvalidArgument(
                    "the json datasets need a generation endpoint, not /v1/embeddings".into(),
                ));
            }
            EndpointKind::Embeddings
        } else {
            return Err(BenchError::InvalidArgument(format!(
                "--endpoint {endpoint} must end with completions, chat/completions, messages, \
                 responses or embeddings"
            )));
        };

        let default_metrics = match endpoint_kind {
            EndpointKind::Embeddings => "e2el",
            _ => "ttft,tpot,itl",
        };
        let percentile_metrics = self
            .percentile_metrics
            .as_deref()
            .unwrap_or(default_metrics)
            .split(',')
            .filter(|name| !name.trim().is_empty())
            .map(PercentileMetric::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let percentiles = parse_percentiles(&self.metric_percentiles)?;
        let goodput = GoodputSlo::parse(&self.goodput)?;

        let mut extra_body = serde_json::Map::new();
        let sampling: BTreeMap<&str, Option<serde_json::Value>> = BTreeMap::from([
            ("temperature", self.temperature.map(serde_json::Value::from)),
            ("top_p", self.top_p.map(serde_json::Value::from)),
            ("top_k", self.top_k.map(serde_json::Value::from)),
            ("min_p", self.min_p.map(serde_json::Value::from)),
        ]);
        for (key, value) in sampling {
            if let Some(value) = value {
                extra_body.insert(key.to_string(), value);
            }
        }
        if let Some(text) = &self.extra_body {
            match serde_json::from_str::<serde_json::Value>(text)? {
                serde_json::Value::Object(map) => extra_body.extend(map),
                _ => {
                    return Err(BenchError::InvalidArgument(
                        "--extra-body must be a JSON object".into(),
                    ))
                }
            }
        }

        Ok(BenchPlan {
            api_url: format!("{base_url}{endpoint}"),
            base_url,
            endpoint_kind,
            percentile_metrics,
            percentiles,
            goodput,
            extra_body,
            ignore_eos,
        })
    }
}

/// Parses `--metric-percentiles` ("50,90,99"): each in [0, 100].
pub fn parse_percentiles(text: &str) -> Result<Vec<f64>, BenchError> {
    text.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let value: f64 = item
                .trim()
                .parse()
                .map_err(|_| BenchError::InvalidArgument(format!("invalid percentile {item:?}")))?;
            if (0.0..=100.0).contains(&value) {
                Ok(value)
            } else {
                Err(BenchError::InvalidArgument(format!(
                    "percentile {value} is outside [0, 100]"
                )))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchServeArgs,
    }

    fn parse(argv: &[&str]) -> BenchServeArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(argv.iter().copied()))
            .expect("arguments parse")
            .args
    }

    #[test]
    fn defaults_match_vllm() {
        let mut args = parse(&[]);
        assert_eq!(args.num_prompts, 1000);
        assert_eq!(args.random_input_len, 1024);
        assert_eq!(args.random_output_len, 128);
        assert!(args.request_rate.is_infinite());
        assert_eq!(args.metric_percentiles, "99");
        let plan = args.plan().expect("plan");
        assert_eq!(plan.api_url, "http://127.0.0.1:8000/v1/completions");
        assert_eq!(
            plan.percentile_metrics,
            vec![
                PercentileMetric::Ttft,
                PercentileMetric::Tpot,
                PercentileMetric::Itl
            ]
        );
        assert_eq!(plan.percentiles, vec![99.0]);
        assert!(plan.ignore_eos, "random dataset implies ignore_eos");
        assert!(plan.extra_body.is_empty());
    }

    #[test]
    fn vllm_spellings_parse() {
        let mut args = parse(&[
            "--base-url",
            "http://localhost:9000/",
            "--endpoint",
            "/v1/chat/completions",
            "--dataset-name",
            "prefix_repetition",
            "--num-prompts",
            "20",
            "--request-rate",
            "20",
            "--goodput",
            "ttft:500",
            "tpot:50",
            "--percentile-metrics",
            "ttft,e2el",
            "--metric-percentiles",
            "50,90,99.9",
            "--temperature",
            "0",
            "--sweep-concurrency",
            "1,2,4",
        ]);
        let plan = args.plan().expect("plan");
        assert_eq!(plan.api_url, "http://localhost:9000/v1/chat/completions");
        assert_eq!(plan.endpoint_kind, EndpointKind::ChatCompletions);
        assert_eq!(plan.percentiles, vec![50.0, 90.0, 99.9]);
        assert_eq!(plan.goodput.ttft_ms, Some(500.0));
        assert_eq!(plan.goodput.tpot_ms, Some(50.0));
        assert_eq!(plan.goodput.e2el_ms, None);
        assert_eq!(plan.extra_body["temperature"], serde_json::json!(0.0));
        assert_eq!(args.sweep_concurrency, vec![1, 2, 4]);
        assert!(!plan.ignore_eos);
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(GoodputSlo::parse(&["latency:5".into()]).is_err());
        assert!(GoodputSlo::parse(&["ttft".into()]).is_err());
        assert!(GoodputSlo::parse(&["ttft:-1".into()]).is_err());
        assert!(parse_percentiles("101").is_err());
        assert!(parse(&["--percentile-metrics", "ttfb"]).plan().is_err());
        assert!(parse(&["--max-concurrency", "0"]).plan().is_err());
        assert!(parse(&["--dataset-name", "sharegpt"]).plan().is_err());
        assert!(parse(&["--endpoint", "/v1/rerank"]).plan().is_err());
        let plan = parse(&["--endpoint", "/v1/messages"]).plan().unwrap();
        assert_eq!(plan.endpoint_kind, EndpointKind::Messages);
        let plan = parse(&["--endpoint", "/v1/responses"]).plan().unwrap();
        assert_eq!(plan.endpoint_kind, EndpointKind::Responses);
        assert!(parse(&["--endpoint", "/v1/messages", "--ignore-eos"])
            .plan()
            .is_err());
        let plan = parse(&["--endpoint", "/v1/embeddings"]).plan().unwrap();
        assert_eq!(plan.endpoint_kind, EndpointKind::Embeddings);
        // vLLM's default for pooling: E2EL percentiles only.
        assert_eq!(plan.percentile_metrics, vec![PercentileMetric::E2el]);
        assert!(
            parse(&["--dataset-name", "json", "--endpoint", "/v1/embeddings"])
                .plan()
                .is_err()
        );
        assert!(parse(&["--json-schema-path", "s.json"]).plan().is_err());
        assert!(
            parse(&["--dataset-name", "json", "--structured-output-ratio", "2"])
                .plan()
                .is_err()
        );
        let mut json = parse(&["--dataset-name", "json-unique", "--output-len", "99"]);
        let plan = json.plan().unwrap();
        assert!(!plan.ignore_eos);
        assert_eq!(json.structured_output_len, 99);
    }
}
