//! The timed forward passes: `CausalLm::forward` driven directly over a private paged KV
//! cache, no scheduler and no engine thread, so the figures are the model's own speed.

use std::sync::Arc;
use std::time::Instant;

use tokenmill_models::{
    argmax, BatchInput, CausalLm, KvCacheStorage, LoraAdapter, ThreadPool, Workspace,
};

use crate::error::SpeedError;
use crate::{Phase, SpeedSettings};

/// One phase's raw measurement: what one run did and how long each run took.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseTiming {
    pub phase: Phase,
    /// Sequences decoded together (1 except batched decode).
    pub sequences: u64,
    /// Forward calls per run.
    pub steps: u64,
    /// Tokens processed per run, all sequences.
    pub tokens: u64,
    /// Rows that produced logits per run.
    pub logit_rows: u64,
    /// Each sequence's positions `context_start..context_end` are processed in a run.
    pub context_start: u64,
    pub context_end: u64,
    /// Wall-clock seconds of every run.
    pub runs_s: Vec<f64>,
}

/// Deterministic, varied prompt ids inside the vocabulary.
fn prompt_tokens(len: usize, seed: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 977 + 13) % vocab) as u32)
        .collect()
}

/// Runs the batch's last sequence through `adapter`, if any.
fn with_adapter(
    batch: &mut BatchInput,
    adapter: Option<&Arc<LoraAdapter>>,
) -> Result<(), SpeedError> {
    if let Some(adapter) = adapter {
        batch.set_last_sequence_adapter(adapter)?;
    }
    Ok(())
}

/// Sequence `seq`'s adapter when the batch is spread over all of them.
fn spread(adapters: &[Arc<LoraAdapter>], seq: usize) -> Option<&Arc<LoraAdapter>> {
    (!adapters.is_empty()).then(|| &adapters[seq % adapters.len()])
}

fn next_token(logits: &[f32]) -> Result<u32, SpeedError> {
    argmax(logits).ok_or_else(|| SpeedError::Task("the forward pass returned no logits".into()))
}

/// Runs every selected phase `settings.repeats` times, in the order prefill → decode after
/// the prompt → decode from an empty context → batched decode (the long decode reuses the
/// prompt's KV; the short decode overwrites its first positions afterwards).
pub fn measure(
    model: &dyn CausalLm,
    pool: &ThreadPool,
    settings: &SpeedSettings,
    adapters: &[Arc<LoraAdapter>],
    mut progress: impl FnMut(&str),
) -> Result<Vec<PhaseTiming>, SpeedError> {
    // The single stream runs through the first adapter, if any.
    let single = adapters.first();
    let block_size = settings.block_size;
    let vocab = model.config().vocab_size;
    let mut workspace = Workspace::new();
    let mut logits = Vec::new();
    let mut batch = BatchInput::default();
    let mut timings = Vec::new();
    let repeats = settings.repeats;

    let verify_rows = settings.verify_rows();
    let single_phases = [Phase::Prefill, Phase::Decode, Phase::DecodeLong];
    if !verify_rows.is_empty() || single_phases.iter().any(|&phase| settings.wants(phase)) {
        let (prompt_len, decode_len) = (settings.prompt_len, settings.decode_len);
        let most_rows = verify_rows.iter().copied().max().unwrap_or(0);
        let blocks = (prompt_len + decode_len.max(most_rows)).div_ceil(block_size);
        let kv_dtype = settings.kv_storage;
        let mut kv = KvCacheStorage::with_dtype(model.kv_layout(), blocks, block_size, kv_dtype);
        let table: Vec<u32> = (0..blocks as u32).collect();
        let prompt = prompt_tokens(prompt_len, 0, vocab);

        // Warm-up (untimed): a short prompt and a few decode steps touch every weight.
        let warm = &prompt[..prompt_len.min(16)];
        batch.clear();
        batch.add_sequence(warm, 0, &table, block_size, true)?;
        with_adapter(&mut batch, single)?;
        model.forward(pool, &batch, &mut kv, &mut workspace, &mut logits)?;
        for step in 0..2 {
            batch.clear();
            batch.add_sequence(&[warm[0]], warm.len() + step, &table, block_size, true)?;
            with_adapter(&mut batch, single)?;
            model.forward(pool, &batch, &mut kv, &mut workspace, &mut logits)?;
        }

        // Prefill: the whole prompt in one forward call, logits for the last token only. It
        // runs (untimed) even when not selected if the long decode or verification needs the
        // prompt's KV.
        let needs_prompt = settings.wants(Phase::DecodeLong) || !verify_rows.is_empty();
        if settings.wants(Phase::Prefill) || needs_prompt {
            let timed = settings.wants(Phase::Prefill);
            let runs = if timed { repeats } else { 1 };
            let mut runs_s = Vec::with_capacity(runs);
            if timed {
                progress(&format!("prefill: {prompt_len} tokens × {runs} runs"));
            }
            for _ in 0..runs {
                batch.clear();
                batch.add_sequence(&prompt, 0, &table, block_size, true)?;
                with_adapter(&mut batch, single)?;
                let started = Instant::now();
                model.forward(pool, &batch, &mut kv, &mut workspace, &mut logits)?;
                runs_s.push(started.elapsed().as_secs_f64());
            }
            if timed {
                timings.push(PhaseTiming {
                    phase: Phase::Prefill,
                    sequences: 1,
                    steps: 1,
                    tokens: prompt_len as u64,
                    logit_rows: 1,
                    context_start: 0,
                    context_end: prompt_len as u64,
                    runs_s,
                });
            }
        }
        let after_prompt = next_token(&logits)?;

        // Decode after the prompt: positions prompt_len.. each run (rewriting the same slots).
        if settings.wants(Phase::DecodeLong) {
            progress(&format!(
                "decode after the prompt: ctx {prompt_len}→{} × {repeats} runs",
                prompt_len + decode_len
            ));
            let runs_s = decode_runs(
                (model, pool),
                (&mut kv, &mut workspace, &mut batch, &mut logits),
                (&table, block_size, single),
                after_prompt,
                prompt_len,
                decode_len,
                repeats,
            )?;
            timings.push(single_decode_timing(
                Phase::DecodeLong,
                prompt_len,
                decode_len,
                runs_s,
            ));
        }

        // Verification steps after the prompt, the row counts interleaved within each repeat
        // so drift on a shared machine spreads over all of them.
        if !verify_rows.is_empty() {
            progress(&format!(
                "verify: rows {verify_rows:?} at ctx {prompt_len}, {decode_len} steps × {repeats} runs"
            ));
            let prompt_rows = prompt_tokens(most_rows, 1, vocab);
            let mut runs_s = vec![Vec::with_capacity(repeats); verify_rows.len()];
            for _ in 0..repeats {
                for (&rows, runs) in verify_rows.iter().zip(&mut runs_s) {
                    let started = Instant::now();
                    for _ in 0..decode_len {
                        batch.clear();
                        // Logits for every row, as the engine asks for a verification.
                        batch.add_sequence(
                            &prompt_rows[..rows],
                            prompt_len,
                            &table,
                            block_size,
                            false,
                        )?;
                        batch.logits_indices.extend(0..rows as u32);
                        with_adapter(&mut batch, single)?;
                        model.forward(pool, &batch, &mut kv, &mut workspace, &mut logits)?;
                        if logits.len() != rows * vocab {
                            return Err(SpeedError::Task(format!(
                                "a {rows}-row verification step returned {} logits",
                                logits.len()
                            )));
                        }
                    }
                    runs.push(started.elapsed().as_secs_f64());
                }
            }
            for (rows, runs_s) in verify_rows.iter().zip(runs_s) {
                timings.push(PhaseTiming {
                    phase: Phase::Verify(*rows),
                    sequences: 1,
                    steps: decode_len as u64,
                    tokens: (rows * decode_len) as u64,
                    logit_rows: (rows * decode_len) as u64,
                    context_start: prompt_len as u64,
                    context_end: (prompt_len + rows) as u64,
                    runs_s,
                });
            }
        }

        // Decode from an empty context, like llama-bench's tg: positions 0..decode_len.
        if settings.wants(Phase::Decode) {
            progress(&format!("decode: ctx 0→{decode_len} × {repeats} runs"));
            let runs_s = decode_runs(
                (model, pool),
                (&mut kv, &mut workspace, &mut batch, &mut logits),
                (&table, block_size, single),
                prompt[0],
                0,
                decode_len,
                repeats,
            )?;
            timings.push(single_decode_timing(Phase::Decode, 0, decode_len, runs_s));
        }
    }

    if settings.wants(Phase::Batched) {
        let (sequences, prompt_len, steps) = (
            settings.batch,
            settings.batch_prompt_len,
            settings.batch_decode_steps,
        );
        progress(&format!(
            "batched decode: {sequences} sequences, ctx {prompt_len}→{} × {repeats} runs",
            prompt_len + steps
        ));
        let blocks_per_seq = (prompt_len + steps).div_ceil(block_size);
        let mut kv = KvCacheStorage::with_dtype(
            model.kv_layout(),
            blocks_per_seq * sequences,
            block_size,
            settings.kv_storage,
        );
        let tables: Vec<Vec<u32>> = (0..sequences)
            .map(|seq| {
                ((seq * blocks_per_seq) as u32..((seq + 1) * blocks_per_seq) as u32).collect()
            })
            .collect();
        // The prompts, all in one untimed forward call.
        batch.clear();
        for (seq, table) in tables.iter().enumerate() {
            let prompt = prompt_tokens(prompt_len, seq + 1, vocab);
            batch.add_sequence(&prompt, 0, table, block_size, true)?;
            with_adapter(&mut batch, spread(adapters, seq))?;
        }
        model.forward(pool, &batch, &mut kv, &mut workspace, &mut logits)?;
        let first: Vec<u32> = logits
            .chunks_exact(vocab)
            .map(next_token)
            .collect::<Result<_, _>>()?;
        let mut runs_s = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            let mut next = first.clone();
            let started = Instant::now();
            for step in 0..steps {
                batch.clear();
                for (seq, (table, &token)) in tables.iter().zip(&next).enumerate() {
                    batch.add_sequence(&[token], prompt_len + step, table, block_size, true)?;
                    with_adapter(&mut batch, spread(adapters, seq))?;
                }
                model.forward(pool, &batch, &mut kv, &mut workspace, &mut logits)?;
                for (slot, row) in next.iter_mut().zip(logits.chunks_exact(vocab)) {
                    *slot = next_token(row)?;
                }
            }
            runs_s.push(started.elapsed().as_secs_f64());
        }
        timings.push(PhaseTiming {
            phase: Phase::Batched,
            sequences: sequences as u64,
            steps: steps as u64,
            tokens: (sequences * steps) as u64,
            logit_rows: (sequences * steps) as u64,
            context_start: prompt_len as u64,
            context_end: (prompt_len + steps) as u64,
            runs_s,
        });
    }
    Ok(timings)
}

fn single_decode_timing(phase: Phase, start: usize, len: usize, runs_s: Vec<f64>) -> PhaseTiming {
    PhaseTiming {
        phase,
        sequences: 1,
        steps: len as u64,
        tokens: len as u64,
        logit_rows: len as u64,
        context_start: start as u64,
        context_end: (start + len) as u64,
        runs_s,
    }
}

/// `repeats` runs of `len` single-token steps at positions `start..start + len`, each feeding
/// the argmax of the previous step's logits; returns each run's seconds.
fn decode_runs(
    (model, pool): (&dyn CausalLm, &ThreadPool),
    (kv, workspace, batch, logits): (
        &mut KvCacheStorage,
        &mut Workspace,
        &mut BatchInput,
        &mut Vec<f32>,
    ),
    (table, block_size, adapter): (&[u32], usize, Option<&Arc<LoraAdapter>>),
    first: u32,
    start: usize,
    len: usize,
    repeats: usize,
) -> Result<Vec<f64>, SpeedError> {
    let mut runs_s = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let mut next = first;
        let started = Instant::now();
        for step in 0..len {
            batch.clear();
            batch.add_sequence(&[next], start + step, table, block_size, true)?;
            with_adapter(batch, adapter)?;
            model.forward(pool, batch, kv, workspace, logits)?;
            next = next_token(logits)?;
        }
        runs_s.push(started.elapsed().as_secs_f64());
    }
    Ok(runs_s)
}
