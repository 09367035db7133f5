//! The `tokenmill` binary: `serve`, `generate`, `bench serve`, `bench speed`, `triage`.
//!
//! Flag parsing only: each subcommand turns its flags into a library crate's typed config and
//! calls into that crate. Errors are reported with `anyhow` here and nowhere else.

mod engine_args;
mod generate;
mod serve;
mod tool_args;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tokenmill",
    version,
    about = "A vLLM-class LLM inference and serving engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a model over the OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Generate text from a prompt, or run a JSONL file of prompts as an offline batch.
    Generate(generate::GenerateArgs),
    /// Benchmarks: serving (against any OpenAI-compatible server) and offline model speed.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Diagnose why a live tokenmill or vLLM server is slow, from its metrics.
    Triage(tokenmill_triage::TriageArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Serving benchmark with `vllm bench serve`'s options and result block.
    Serve(Box<tokenmill_bench::BenchServeArgs>),
    /// Offline forward-pass speed: prefill, decode and batched-decode tok/s with achieved
    /// GFLOP/s and weight GB/s next to the machine's measured peaks.
    Speed(tokenmill_bench::BenchSpeedArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Bench(BenchCommand::Serve(args)) => {
            async_runtime()?.block_on(tokenmill_bench::run(*args))?;
            Ok(())
        }
        Command::Bench(BenchCommand::Speed(args)) => {
            tokenmill_bench::run_speed(&args)?;
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

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
