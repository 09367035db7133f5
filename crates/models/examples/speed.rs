//! Measures the forward pass on the default model (or `$TOKENMILL_MODEL`): prefill tok/s for a
//! 512-token prompt, single-stream decode tok/s over 128 tokens, and batched decode tok/s with
//! 64 sequences. Not a test: numbers depend on the machine; compare against a peer run on the
//! same machine.
//!
//! `cargo run --release -p tokenmill-models --example speed [-- --threads N]`

use std::time::Instant;

use tokenmill_models::{
    argmax, resolve_model, BatchInput, KvCacheStorage, LlamaModel, LoadOptions, Workspace,
};

const BLOCK_SIZE: usize = 16;
const PREFILL_TOKENS: usize = 512;
const DECODE_TOKENS: usize = 128;
const BATCH_SEQUENCES: usize = 64;
const BATCH_PROMPT: usize = 32;
const BATCH_DECODE_STEPS: usize = 32;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mut options = LoadOptions::default();
    if let Some(position) = args.iter().position(|arg| arg == "--threads") {
        options.num_threads = args
            .get(position + 1)
            .ok_or("--threads needs a value")?
            .parse()?;
    }
    let only = args
        .iter()
        .position(|arg| arg == "--only")
        .and_then(|position| args.get(position + 1).cloned());
    let runs = |phase: &str| only.as_deref().is_none_or(|wanted| wanted == phase);
    let source = resolve_model(std::env::var("TOKENMILL_MODEL").ok().as_deref())?;
    let started = Instant::now();
    let model = LlamaModel::load(&source, &options)?;
    println!(
        "loaded {} in {:.2} s ({} threads, {:.1} MB of weights)",
        source.path().display(),
        started.elapsed().as_secs_f64(),
        options.num_threads,
        model.weight_bytes() as f64 / 1e6
    );
    let vocab = model.config().vocab_size as u32;
    let mut workspace = Workspace::new();
    let mut logits = Vec::new();
    let mut batch = BatchInput::default();

    // Prefill: one 512-token sequence in a single forward call.
    let blocks_per_seq = (PREFILL_TOKENS + DECODE_TOKENS).div_ceil(BLOCK_SIZE);
    let mut kv = KvCacheStorage::new(model.config(), blocks_per_seq, BLOCK_SIZE);
    let table: Vec<u32> = (0..blocks_per_seq as u32).collect();
    let prompt: Vec<u32> = (0..PREFILL_TOKENS as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    batch.add_sequence(&prompt, 0, &table, BLOCK_SIZE, true)?;
    let started = Instant::now();
    model.forward(&batch, &mut kv, &mut workspace, &mut logits)?;
    let prefill = started.elapsed().as_secs_f64();
    println!(
        "prefill: {PREFILL_TOKENS} tokens in {prefill:.3} s = {:.1} tok/s",
        PREFILL_TOKENS as f64 / prefill
    );

    // Single-stream decode after that prompt.
    if runs("decode") {
        let mut next = argmax(&logits).ok_or("no logits")?;
        let started = Instant::now();
        for step in 0..DECODE_TOKENS {
            batch.clear();
            batch.add_sequence(&[next], PREFILL_TOKENS + step, &table, BLOCK_SIZE, true)?;
            model.forward(&batch, &mut kv, &mut workspace, &mut logits)?;
            next = argmax(&logits).ok_or("no logits")?;
        }
        let decode = started.elapsed().as_secs_f64();
        println!(
            "decode (1 sequence): {DECODE_TOKENS} tokens in {decode:.3} s = {:.1} tok/s",
            DECODE_TOKENS as f64 / decode
        );
    }
    if !runs("batched") {
        return Ok(());
    }

    // Batched decode: 64 sequences with short prompts, decoding together.
    let blocks_per_seq = (BATCH_PROMPT + BATCH_DECODE_STEPS).div_ceil(BLOCK_SIZE);
    let mut kv = KvCacheStorage::new(model.config(), blocks_per_seq * BATCH_SEQUENCES, BLOCK_SIZE);
    let tables: Vec<Vec<u32>> = (0..BATCH_SEQUENCES)
        .map(|seq| ((seq * blocks_per_seq) as u32..((seq + 1) * blocks_per_seq) as u32).collect())
        .collect();
    batch.clear();
    for (seq, table) in tables.iter().enumerate() {
        let prompt: Vec<u32> = (0..BATCH_PROMPT as u32)
            .map(|i| (i * 31 + seq as u32 * 977 + 5) % vocab)
            .collect();
        batch.add_sequence(&prompt, 0, table, BLOCK_SIZE, true)?;
    }
    model.forward(&batch, &mut kv, &mut workspace, &mut logits)?;
    let mut next: Vec<u32> = logits
        .chunks_exact(vocab as usize)
        .map(|row| argmax(row).unwrap_or(0))
        .collect();
    let started = Instant::now();
    for step in 0..BATCH_DECODE_STEPS {
        batch.clear();
        for (table, &token) in tables.iter().zip(&next) {
            batch.add_sequence(&[token], BATCH_PROMPT + step, table, BLOCK_SIZE, true)?;
        }
        model.forward(&batch, &mut kv, &mut workspace, &mut logits)?;
        for (slot, row) in next.iter_mut().zip(logits.chunks_exact(vocab as usize)) {
            *slot = argmax(row).unwrap_or(0);
        }
    }
    let batched = started.elapsed().as_secs_f64();
    let tokens = BATCH_SEQUENCES * BATCH_DECODE_STEPS;
    println!(
        "decode ({BATCH_SEQUENCES} sequences): {tokens} tokens in {batched:.3} s = {:.1} tok/s",
        tokens as f64 / batched
    );
    Ok(())
}
