//! The `tokenmill` binary: `serve`, `generate`, `bench serve`, `bench speed`, `triage`.
//!
//! Flag parsing only: each subcommand turns its flags into a library crate's typed config and
//! calls into that crate. Errors are reported with `anyhow` here and nowhere else.

mod embed;
mod engine_args;
mod generate;
mod lora_args;
mod responses_args;
mod runner;
mod serve;
mod structured_args;
mod tokenizer;
mod tool_args;
mod vllm_flags;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tokenmill",
    version,
    about = "A vLLM-class LLM inference and serving engine",
    // A flag given twice takes its last value, so command-line flags override the ones a
    // `--config` file expands to (vLLM's precedence).
    args_override_self = true
)]
struct Cli {
    /// Log lines as text (colours only on a terminal) or as one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a model over the OpenAI-compatible HTTP API.
    Serve(Box<serve::ServeArgs>),
    /// Generate text from a prompt, or run a JSONL file of prompts as an offline batch.
    Generate(Box<generate::GenerateArgs>),
    /// Embed a JSONL file of texts with an embedding model into a JSONL file of vectors.
    Embed(Box<embed::EmbedArgs>),
    /// Benchmarks: serving (against any OpenAI-compatible server) and offline model speed.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Diagnose why a live tokenmill or vLLM server is slow, from its metrics.
    Triage(tokenmill_triage::TriageArgs),
    /// Tokenizer tools: export a model's tokenizer as a Hugging Face tokenizer directory.
    #[command(subcommand)]
    Tokenizer(tokenizer::TokenizerCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Serving benchmark with `vllm bench serve`'s options and result block.
    Serve(Box<tokenmill_bench::BenchServeArgs>),
    /// Offline forward-pass speed: prefill, decode and batched-decode tok/s with achieved
    /// GFLOP/s and weight GB/s next to the machine's measured peaks.
    Speed(tokenmill_bench_speed::BenchSpeedArgs),
}

fn main() -> anyhow::Result<()> {
    let args = vllm_flags::normalize_serve_args(std::env::args().collect())?;
    let cli = Cli::parse_from(args);
    let access_log = match &cli.command {
        Command::Serve(serve) => serve.vllm.access_log_directive(),
        _ => None,
    };
    init_logging(cli.log_format, access_log.as_deref());
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Generate(args) => generate::run(*args),
        Command::Embed(args) => embed::run(*args),
        Command::Tokenizer(command) => tokenizer::run(command),
        Command::Bench(BenchCommand::Serve(args)) => {
            async_runtime()?.block_on(tokenmill_bench::run(*args))?;
            Ok(())
        }
        Command::Bench(BenchCommand::Speed(args)) => {
            tokenmill_bench_speed::run_speed(&args)?;
            Ok(())
        }
        Command::Triage(args) => {
            let json = args.json;
            let report = async_runtime()?.block_on(tokenmill_triage::run(args))?;
            if json {
                println!("{}", report.to_json()?);
            } else {
                print!("{report}");
            }
            Ok(())
        }
    }
}

/// The tokio runtime the async subcommands (serve, bench, triage) run on.
fn async_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Logs to stderr at `RUST_LOG`'s levels (default `info`); `access_log` is a directive for
/// the access log (`--uvicorn-log-level`) added on top. Colours only when stderr is a
/// terminal, so log files stay plain.
fn init_logging(format: LogFormat, access_log: Option<&str>) {
    use std::io::IsTerminal;
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if let Some(directive) = access_log.and_then(|d| d.parse().ok()) {
        filter = filter.add_directive(directive);
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}
