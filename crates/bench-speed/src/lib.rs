//! tokenmill-bench-speed: `tokenmill bench speed`, the offline forward-pass benchmark, kept
//! out of `tokenmill-bench` so that `bench serve` (an HTTP load generator that drives vLLM as
//! well as tokenmill) builds without the model and kernel crates.
//!
//! It measures throughput on one machine — prefill tok/s, single-stream decode tok/s (from an
//! empty context, like llama-bench's tg, and after the long prompt), speculative verification
//! steps (k + 1 rows with logits at a fixed context, against a one-row step) and batched decode
//! tok/s — each with achieved GFLOP/s and weight GB/s next to the machine's peaks, measured at
//! start-up by two quick probes. `CausalLm::forward` is driven directly over a private paged KV
//! cache: no scheduler, no engine thread. `bench/llamacpp_speed.py` writes the same JSON for
//! llama.cpp, and `bench/compare_speed.sh` puts the two side by side.
//!
//! Key types: [`BenchSpeedArgs`] (the clap options) → [`SpeedSettings`] (checked, with the
//! [`Phase`]s to measure); [`measure_peaks`] gives the [`MachinePeak`]; each phase's runs become
//! a [`PhaseTiming`], turned into a [`PhaseResult`] with [`ModelCost`]'s FLOP and byte
//! accounting; [`SpeedReport`] holds them all (serialized as the JSON result) and
//! [`format_report`] prints the table. Errors are [`SpeedError`].
//!
//! Usage: flatten [`BenchSpeedArgs`] into a clap command and call [`run_speed`], which probes
//! the machine, loads the model, measures, prints and writes `--json` when asked:
//!
//! ```no_run
//! use clap::Parser;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     args: tokenmill_bench_speed::BenchSpeedArgs,
//! }
//!
//! fn main() -> Result<(), tokenmill_bench_speed::SpeedError> {
//!     let report = tokenmill_bench_speed::run_speed(&Cli::parse().args)?;
//!     eprintln!("{} figures", report.phases.len());
//!     Ok(())
//! }
//! ```

mod cost;
mod error;
mod measure;
mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokenmill_models::{
    load_model, resolve_model, write_random_peft_adapter, CacheDtype, KvCacheDType, LoadOptions,
    LoraAdapter, LoraTarget, ModelDtype, ModelError, ModelSource, RandomLoraSpec, ThreadPool,
};

pub use cost::ModelCost;
pub use error::SpeedError;
pub use measure::PhaseTiming;
pub use report::{format_report, median, MachinePeak, PhaseResult, SpeedReport};

/// The figures `--only` can select. `decode` covers both single-stream decode figures,
/// `verify` one figure per `--verify-rows` count (and the one-row step they are compared to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PhaseSelection {
    Prefill,
    Decode,
    Verify,
    Batched,
}

/// One measured figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// One `--prompt-len` prompt in one forward call.
    Prefill,
    /// `--decode-len` single-token steps from an empty context (llama-bench's tg).
    Decode,
    /// `--decode-len` single-token steps right after the `--prompt-len` prompt.
    DecodeLong,
    /// `--decode-len` steps of this many rows (a speculative verification step: the last
    /// token and k drafts, logits for every row) at positions `--prompt-len..` after the
    /// prompt; each step rewrites the same positions (the rows are rolled back, as rejected
    /// drafts are), so the context stays `--prompt-len` throughout.
    Verify(usize),
    /// `--batch-decode-steps` steps of `--batch` sequences after `--batch-prompt-len` prompts.
    Batched,
}

impl Phase {
    /// The key of this figure in the JSON result (shared with `bench/llamacpp_speed.py`).
    pub fn key(self) -> String {
        match self {
            Phase::Prefill => "prefill".into(),
            Phase::Decode => "decode".into(),
            Phase::DecodeLong => "decode_long".into(),
            Phase::Verify(rows) => format!("verify_{rows}"),
            Phase::Batched => "batched".into(),
        }
    }
}

/// The options of `tokenmill bench speed`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchSpeedArgs {
    /// GGUF file, HF directory or repo id (default: the default model, fetched if missing).
    #[arg(long)]
    pub model: Option<String>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Prompt length of the prefill figure, and the context the long decode starts from.
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    /// Single-stream decode steps per run (also the steps per run of each verify figure).
    #[arg(long, default_value_t = 128)]
    pub decode_len: usize,
    /// Rows per step of the verify figures (k + 1 for k draft tokens; comma-separated). A
    /// one-row figure at the same context is always measured too, as the ratio's base.
    #[arg(long, value_delimiter = ',', default_values_t = [2, 5, 9])]
    pub verify_rows: Vec<usize>,
    /// Sequences decoded together in the batched figure.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Prompt length of each batched sequence.
    #[arg(long, default_value_t = 32)]
    pub batch_prompt_len: usize,
    /// Batched decode steps per run.
    #[arg(long, default_value_t = 32)]
    pub batch_decode_steps: usize,
    /// Runs of each figure; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Measure only these figures (repeatable or comma-separated; default: all but verify).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<PhaseSelection>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV cache element type, as `serve --kv-cache-dtype` takes it.
    #[arg(long, default_value_t = CacheDtype::Auto)]
    pub kv_cache_dtype: CacheDtype,
    /// Size of the buffer the memory-bandwidth probe streams through, in MiB.
    #[arg(long, default_value_t = 256)]
    pub probe_mib: usize,
    /// Seconds each peak probe runs.
    #[arg(long, default_value_t = 0.3)]
    pub probe_seconds: f64,
    /// Random LoRA adapters (all seven projections) to run the figures through: the single
    /// stream uses the first, the batched figure spreads its sequences over all of them
    /// (sequence i uses adapter i mod N). 0 = the base model only.
    #[arg(long, default_value_t = 0)]
    pub lora_adapters: usize,
    /// Rank of those adapters.
    #[arg(long, default_value_t = 16)]
    pub lora_rank: usize,
}

/// Checked settings of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedSettings {
    pub threads: usize,
    pub prompt_len: usize,
    pub decode_len: usize,
    pub batch: usize,
    pub batch_prompt_len: usize,
    pub batch_decode_steps: usize,
    pub repeats: usize,
    pub block_size: usize,
    pub kv_cache_dtype: CacheDtype,
    /// The element type it stores for the model measured (`auto` resolved as `serve` does
    /// under `--dtype auto`).
    pub kv_storage: KvCacheDType,
    pub phases: Vec<Phase>,
    /// `--lora-adapters`, `--lora-rank`.
    pub lora_adapters: usize,
    pub lora_rank: usize,
}

impl SpeedSettings {
    pub fn wants(&self, phase: Phase) -> bool {
        self.phases.contains(&phase)
    }

    /// The rows per step of the verify figures, ascending (1 first when any is measured).
    pub fn verify_rows(&self) -> Vec<usize> {
        self.phases
            .iter()
            .filter_map(|phase| match *phase {
                Phase::Verify(rows) => Some(rows),
                _ => None,
            })
            .collect()
    }
}

impl BenchSpeedArgs {
    /// Validates the options for the model at `source`.
    pub fn settings(&self, source: &ModelSource) -> Result<SpeedSettings, SpeedError> {
        let positive = [
            ("--prompt-len", self.prompt_len),
            ("--decode-len", self.decode_len),
            ("--batch", self.batch),
            ("--batch-prompt-len", self.batch_prompt_len),
            ("--batch-decode-steps", self.batch_decode_steps),
            ("--repeats", self.repeats),
            ("--block-size", self.block_size),
            ("--probe-mib", self.probe_mib),
            ("--lora-rank", self.lora_rank),
        ];
        let zero_rows = self
            .verify_rows
            .contains(&0)
            .then_some(("--verify-rows", 0));
        if let Some((name, _)) = positive
            .iter()
            .copied()
            .chain(zero_rows)
            .find(|(_, value)| *value == 0)
        {
            return Err(SpeedError::InvalidArgument(format!(
                "{name} must be at least 1"
            )));
        }
        if !(self.probe_seconds.is_finite() && self.probe_seconds > 0.0) {
            return Err(SpeedError::InvalidArgument(
                "--probe-seconds must be positive".into(),
            ));
        }
        let threads = match self.threads {
            Some(0) => {
                return Err(SpeedError::InvalidArgument(
                    "--threads must be at least 1".into(),
                ))
            }
            Some(threads) => threads,
            None => std::thread::available_parallelism().map_or(1, usize::from),
        };
        let selected = |selection| self.only.is_empty() || self.only.contains(&selection);
        let mut phases = Vec::new();
        if selected(PhaseSelection::Prefill) {
            phases.push(Phase::Prefill);
        }
        if selected(PhaseSelection::Decode) {
            phases.extend([Phase::Decode, Phase::DecodeLong]);
        }
        // Verification is a figure of its own, measured only when asked for by name.
        if self.only.contains(&PhaseSelection::Verify) {
            let mut rows = self.verify_rows.clone();
            rows.push(1);
            rows.sort_unstable();
            rows.dedup();
            phases.extend(rows.into_iter().map(Phase::Verify));
        }
        if selected(PhaseSelection::Batched) {
            phases.push(Phase::Batched);
        }
        Ok(SpeedSettings {
            threads,
            prompt_len: self.prompt_len,
            decode_len: self.decode_len,
            batch: self.batch,
            batch_prompt_len: self.batch_prompt_len,
            batch_decode_steps: self.batch_decode_steps,
            repeats: self.repeats,
            block_size: self.block_size,
            kv_cache_dtype: self.kv_cache_dtype,
            kv_storage: self.kv_cache_dtype.storage_for(ModelDtype::Auto, source)?,
            phases,
            lora_adapters: self.lora_adapters,
            lora_rank: self.lora_rank,
        })
    }
}

/// Measures the machine's peaks with `threads` threads: f32 FMA GFLOP/s and read GB/s.
pub fn measure_peaks(threads: usize, probe_bytes: usize, seconds: f64) -> MachinePeak {
    let duration = Duration::from_secs_f64(seconds);
    MachinePeak {
        cpu: cpu_model(),
        cpu_features: tokenmill_kernels::runtime_summary(),
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        threads,
        peak_gflops: tokenmill_kernels::fma_peak_gflops(threads, duration),
        peak_read_gbs: tokenmill_kernels::read_bandwidth_gbs(threads, probe_bytes, duration),
    }
}

/// The CPU's model name from /proc/cpuinfo, or "unknown".
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// `settings.lora_adapters` random adapters of `settings.lora_rank` on every projection,
/// written under `dir` and read back as the server would.
fn random_adapters(
    config: &tokenmill_models::ModelConfig,
    settings: &SpeedSettings,
    dir: &std::path::Path,
) -> Result<Vec<std::sync::Arc<LoraAdapter>>, SpeedError> {
    (0..settings.lora_adapters)
        .map(|index| {
            let path = dir.join(format!("adapter{index}"));
            let spec = RandomLoraSpec {
                rank: settings.lora_rank,
                alpha: 2.0 * settings.lora_rank as f32,
                targets: LoraTarget::ALL.to_vec(),
                seed: index as u64 + 1,
                a_scale: 0.05,
                b_scale: 0.05,
            };
            write_random_peft_adapter(&path, config, &spec)?;
            let adapter =
                LoraAdapter::load(&path, config, settings.lora_rank).map_err(ModelError::from)?;
            Ok(std::sync::Arc::new(adapter))
        })
        .collect()
}

/// Runs `tokenmill bench speed`: probes the machine, loads the model, measures the selected
/// figures, prints the table and writes the JSON when asked.
pub fn run_speed(args: &BenchSpeedArgs) -> Result<SpeedReport, SpeedError> {
    let source = resolve_model(args.model.as_deref())?;
    let settings = args.settings(&source)?;

    eprintln!(
        "probing machine peaks ({} threads, {:.1} s each)",
        settings.threads, args.probe_seconds
    );
    let machine = measure_peaks(settings.threads, args.probe_mib << 20, args.probe_seconds);

    let started = Instant::now();
    let model = load_model(&source, &LoadOptions::default())?;
    let pool = ThreadPool::new(settings.threads);
    eprintln!(
        "loaded {} in {:.2} s ({:.1} MB of weights)",
        source.path().display(),
        started.elapsed().as_secs_f64(),
        model.weight_bytes() as f64 / 1e6
    );
    let adapter_dir = tempfile::tempdir().map_err(|source| SpeedError::io("tempdir", source))?;
    let adapters = random_adapters(model.config(), &settings, adapter_dir.path())?;
    let timings = measure::measure(model.as_ref(), &pool, &settings, &adapters, |line| {
        eprintln!("measuring {line}")
    })?;
    let report = SpeedReport::new(
        source.path().display().to_string(),
        model.as_ref(),
        &settings,
        machine,
        &timings,
    );
    print!("{}", format_report(&report));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").map_err(|source| SpeedError::io(path, source))?;
        println!("wrote {}", path.display());
    }
    Ok(report)
}
