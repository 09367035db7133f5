//! `tokenmill tokenizer export --model M --out DIR`: a model's tokenizer as a Hugging Face
//! tokenizer directory, for tools that want an HF tokenizer path (GuideLLM, lm-eval's local
//! tokenizers, transformers clients) with no hub.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use tokenmill_gguf::GgufFile;
use tokenmill_models::{read_model_config, resolve_model, ModelSource};
use tokenmill_text::Tokenizer;

#[derive(Debug, Subcommand)]
pub enum TokenizerCommand {
    /// Write tokenizer.json, tokenizer_config.json (with the chat template),
    /// special_tokens_map.json and generation_config.json (the EOS ids) into a directory.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A GGUF file or an HF model directory; default: the default model.
    #[arg(long)]
    pub model: Option<String>,
    /// The directory to write (created if missing).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(command: TokenizerCommand) -> anyhow::Result<()> {
    let TokenizerCommand::Export(args) = command;
    let source = resolve_model(args.model.as_deref()).context("cannot resolve the model")?;
    let tokenizer = match &source {
        ModelSource::Gguf(path) => Tokenizer::from_gguf(&GgufFile::open(path)?)?,
        ModelSource::HfDirectory(dir) => Tokenizer::from_hf_dir(dir)?,
    };
    // The context length is only metadata here; a model whose config cannot be read still
    // exports its tokenizer.
    let max_length = read_model_config(&source)
        .ok()
        .map(|config| config.max_position_embeddings);
    tokenizer
        .write_hf_dir(&args.out, max_length)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!(
        "wrote the tokenizer of {} to {} ({} tokens)",
        source.path().display(),
        args.out.display(),
        tokenizer.vocab_size()
    );
    Ok(())
}
