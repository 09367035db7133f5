//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod family;
pub mod tiny;

use tokenmill_models::{
    BatchInput, CausalLm, KvCacheDType, KvCacheStorage, LlamaModel, LoadOptions, ModelSource,
    StateCacheStorage, ThreadPool, Workspace,
};

pub use tokenmill_test_assets::default_model as default_model_path;

/// The default model; with `dequantize_to_f32` its weights are widened to f32, so matmuls
/// stop quantizing activations to int8.
pub fn load_default_model(dequantize_to_f32: bool) -> LlamaModel {
    LlamaModel::load(
        &ModelSource::Gguf(default_model_path()),
        &LoadOptions {
            dequantize_to_f32,
            ..LoadOptions::default()
        },
    )
    .unwrap()
}

/// The pool the helpers run forward passes on: two threads.
pub fn test_pool() -> ThreadPool {
    ThreadPool::new(2)
}

/// A JSON fixture from `tests/fixtures/`.
pub fn load_fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Teacher forcing: `prompt` then `forced` in one prefill over a fresh `kv_dtype` cache, with
/// logits at the prompt's last position and at every forced token but the last (row `step` of
/// `logits` predicts `forced[step]`), so each step is compared in the same context.
pub fn teacher_forced_logits(
    model: &dyn CausalLm,
    prompt: &[u32],
    forced: &[u32],
    kv_dtype: KvCacheDType,
    workspace: &mut Workspace,
    logits: &mut Vec<f32>,
) {
    let block_size = 16;
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(&forced[..forced.len() - 1]);
    // Descending block ids: the table is not the identity mapping.
    let blocks: Vec<u32> = (0..tokens.len().div_ceil(block_size) as u32)
        .rev()
        .collect();
    // A hybrid model's recurrent layers keep their state in slot 0.
    let mut kv = KvCacheStorage::with_dtype(model.kv_layout(), blocks.len(), block_size, kv_dtype)
        .with_state(StateCacheStorage::new(model.state_layout(), 1));
    let mut batch = BatchInput::default();
    batch
        .add_sequence(&tokens, 0, &blocks, block_size, false)
        .unwrap();
    batch.state_slots.push(0);
    let first = prompt.len() as u32 - 1;
    batch.logits_indices = (first..tokens.len() as u32).collect();
    model
        .forward(&test_pool(), &batch, &mut kv, workspace, logits)
        .unwrap();
}

/// One sequence's state in a hand-rolled engine loop: its tokens so far and its blocks.
pub struct TestSequence {
    pub tokens: Vec<u32>,
    pub num_computed: usize,
    pub block_table: Vec<u32>,
}

/// Greedy-generates `max_new` tokens for each prompt, scheduling prefill in chunks of at most
/// `chunk` tokens and running every sequence with work in the same forward call (mixed
/// prefill and decode). Returns the generated ids per prompt.
///
/// The cache is f32, chosen explicitly (not `serve`'s `auto`, which is f16 for a GGUF file):
/// the family, MoE and LoRA parity fixtures were recorded with f32 K/V on the reference side,
/// and the exact-arithmetic comparisons need it; [`greedy_generate_with_kv`] picks another type.
pub fn greedy_generate(
    model: &dyn CausalLm,
    prompts: &[Vec<u32>],
    max_new: usize,
    chunk: usize,
    block_size: usize,
) -> Vec<Vec<u32>> {
    greedy_generate_with_kv(
        model,
        prompts,
        max_new,
        chunk,
        block_size,
        KvCacheDType::F32,
    )
}

/// [`greedy_generate`] over a KV cache stored as `kv_dtype`.
pub fn greedy_generate_with_kv(
    model: &dyn CausalLm,
    prompts: &[Vec<u32>],
    max_new: usize,
    chunk: usize,
    block_size: usize,
    kv_dtype: KvCacheDType,
) -> Vec<Vec<u32>> {
    let max_len = prompts.iter().map(Vec::len).max().unwrap_or(0) + max_new;
    let blocks_per_seq = max_len.div_ceil(block_size);
    let mut kv = KvCacheStorage::with_dtype(
        model.kv_layout(),
        blocks_per_seq * prompts.len(),
        block_size,
        kv_dtype,
    );
    // Interleave block ids across sequences so tables are not contiguous ranges.
    let mut sequences: Vec<TestSequence> = prompts
        .iter()
        .enumerate()
        .map(|(index, prompt)| TestSequence {
            tokens: prompt.clone(),
            num_computed: 0,
            block_table: (0..blocks_per_seq)
                .map(|block| (block * prompts.len() + index) as u32)
                .rev()
                .collect(),
        })
        .collect();
    let prompt_lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let pool = test_pool();
    let mut workspace = Workspace::new();
    let mut batch = BatchInput::default();
    let mut logits = Vec::new();
    loop {
        batch.clear();
        let mut sampling = Vec::new();
        for (index, sequence) in sequences.iter().enumerate() {
            let generated = sequence.tokens.len() - prompt_lens[index];
            if generated >= max_new {
                continue;
            }
            let remaining = sequence.tokens.len() - sequence.num_computed;
            let count = remaining.min(chunk);
            let wants_logits = sequence.num_computed + count == sequence.tokens.len();
            batch
                .add_sequence(
                    &sequence.tokens[sequence.num_computed..sequence.num_computed + count],
                    sequence.num_computed,
                    &sequence.block_table,
                    block_size,
                    wants_logits,
                )
                .unwrap();
            if wants_logits {
                sampling.push(index);
            }
        }
        if batch.is_empty() {
            break;
        }
        model
            .forward(&pool, &batch, &mut kv, &mut workspace, &mut logits)
            .unwrap();
        let vocab = model.config().vocab_size;
        let mut row = 0;
        for (index, sequence) in sequences.iter_mut().enumerate() {
            let generated = sequence.tokens.len() - prompt_lens[index];
            if generated >= max_new {
                continue;
            }
            let remaining = sequence.tokens.len() - sequence.num_computed;
            sequence.num_computed += remaining.min(chunk);
            if sampling.contains(&index) {
                let next =
                    tokenmill_models::argmax(&logits[row * vocab..(row + 1) * vocab]).unwrap();
                sequence.tokens.push(next);
                row += 1;
            }
        }
    }
    sequences
        .iter()
        .zip(&prompt_lens)
        .map(|(sequence, &len)| sequence.tokens[len..].to_vec())
        .collect()
}
