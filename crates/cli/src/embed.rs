//! `tokenmill embed`: a JSONL file of texts through the pooling engine into a JSONL file of
//! vectors (offline, vLLM's `LLM.embed`), with a progress bar.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use tokenmill_engine::PoolingInput;
use tokenmill_models::{l2_normalize, PoolingTask};
use tokenmill_protocol::truncation_limit;

use crate::engine_args::EngineArgs;
use crate::runner::{PoolerArgs, RunnerArg, RunnerArgs, TaskArg};

#[derive(Debug, Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub pooler: PoolerArgs,
    /// JSONL of texts: each line a JSON string or an object with a `text` (or `input`) field.
    #[arg(long)]
    pub input: PathBuf,
    /// One line per input line, in order: `{"index": i, "embedding": [...]}`.
    #[arg(long)]
    pub output: PathBuf,
    /// Keep at most this many tokens per text (-1: the model length); default: longer texts
    /// are an error.
    #[arg(long, allow_hyphen_values = true)]
    pub truncate_prompt_tokens: Option<i64>,
    /// Texts handed to the engine at once (it batches them under its token budget).
    #[arg(long, default_value_t = 256)]
    pub chunk: usize,
    /// The model dtype, as `serve --dtype`: `bfloat16` runs a BERT encoder's linear layers
    /// in bf16; `auto` as int8 pairs (15-bit fixed point on AMX tiles) where AMX is usable,
    /// else f32; float32 (and float16, not computed in f16) keep them f32.
    #[arg(long, default_value = "auto", help_heading = "Model")]
    pub dtype: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Text(String),
    Object {
        #[serde(alias = "input")]
        text: String,
    },
}

pub fn run(args: EmbedArgs) -> anyhow::Result<()> {
    let mut config = args.engine.to_config()?;
    config.served_model_name = "embed".into();
    config.dtype = args.dtype.parse()?;
    if config.dtype == tokenmill_models::ModelDtype::Float16 {
        eprintln!("warning: --dtype float16: the encoder computes in f32 (f16 is not implemented)");
    }
    let runner = RunnerArgs {
        runner: RunnerArg::Pooling,
        task: TaskArg::Embed,
        pooler: args.pooler.clone(),
    };
    let engine = runner.start_pooling(&config)?;
    let model = std::sync::Arc::clone(engine.model());
    if model.info.task != PoolingTask::Embed {
        bail!("{} is not an embedding model", model.info.architecture);
    }
    let truncate = truncation_limit(args.truncate_prompt_tokens, model.max_model_len)
        .map_err(|e| anyhow::anyhow!("--truncate-prompt-tokens: {e}"))?;
    let file = std::fs::File::open(&args.input)
        .with_context(|| format!("cannot open {}", args.input.display()))?;
    let mut texts = Vec::new();
    for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(&line).with_context(|| {
            format!(
                "{} line {}: expected a JSON string or {{\"text\": ...}}",
                args.input.display(),
                number + 1
            )
        })?;
        texts.push(match parsed {
            Line::Text(text) | Line::Object { text } => text,
        });
    }
    let bar = indicatif::ProgressBar::new(texts.len() as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} texts [{elapsed_precise}<{eta_precise}] {per_sec}",
    ) {
        bar.set_style(style);
    }
    let output = std::fs::File::create(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    let mut output = BufWriter::new(output);
    let client = engine.client();
    let started = Instant::now();
    let mut tokens = 0usize;
    for (chunk_index, chunk) in texts.chunks(args.chunk.max(1)).enumerate() {
        let mut inputs = Vec::with_capacity(chunk.len());
        for (offset, text) in chunk.iter().enumerate() {
            let index = chunk_index * args.chunk.max(1) + offset;
            let (ids, _) = model
                .tokenizer
                .encode_for_pooling(text, None, true, truncate)
                .with_context(|| format!("tokenizing text {index}"))?;
            if ids.is_empty() || ids.len() > model.max_model_len {
                bail!(
                    "text {index} has {} tokens; the model takes 1 to {} \
                     (--truncate-prompt-tokens cuts longer ones)",
                    ids.len(),
                    model.max_model_len
                );
            }
            tokens += ids.len();
            inputs.push(PoolingInput::tokens(ids));
        }
        let rows = client.pool_blocking(inputs)?;
        for (offset, mut row) in rows.into_iter().enumerate() {
            if model.info.normalize {
                l2_normalize(&mut row);
            }
            let index = chunk_index * args.chunk.max(1) + offset;
            serde_json::to_writer(
                &mut output,
                &serde_json::json!({"index": index, "embedding": row}),
            )?;
            output.write_all(b"\n")?;
        }
        bar.inc(chunk.len() as u64);
    }
    output.flush()?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "embedded {} texts ({tokens} tokens) in {seconds:.2} s: {:.1} texts/s",
        texts.len(),
        texts.len() as f64 / seconds.max(1e-9)
    );
    engine.shutdown();
    Ok(())
}
