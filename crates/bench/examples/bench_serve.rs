//! `tokenmill bench serve` without the main binary, for trying the client on its own:
//! `cargo run --release -p tokenmill-bench --example bench_serve -- --base-url http://127.0.0.1:8000 ...`

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "bench_serve",
    about = "Serving benchmark for an OpenAI-compatible server"
)]
struct Cli {
    #[command(flatten)]
    args: tokenmill_bench::BenchServeArgs,
}

#[tokio::main]
async fn main() -> Result<(), tokenmill_bench::BenchError> {
    tokenmill_bench::run(Cli::parse().args).await.map(|_| ())
}
