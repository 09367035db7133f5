//! Batch invariance of the Qwen3.5 hybrid (Gated DeltaNet + attention) model at the models
//! level: a prompt alone, batched with another, prefilled in chunks split anywhere (longer
//! than several chunks), in another state slot, or restarted from position 0 on a slot a
//! preempted run left dirty gives the same logits bit for bit, prefill and decode.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;
#[path = "support/qwen35.rs"]
mod qwen35;

use qwen35::{argmax, hybrid_cache, load, load_fixture, pool, scratch_dir, step, Sequence};
use tokenmill_models::{CausalLm, KvCacheStorage, ModelSource, Workspace};

/// Decode steps after each prefill.
const NEW: usize = 4;

/// How one prompt is run: its tokens, its state slot and its prefill chunk sizes (the last
/// chunk takes whatever is left).
struct Plan {
    prompt: Vec<u32>,
    slot: u32,
    chunks: Vec<usize>,
}

/// Runs every plan in lock step (each step takes every unfinished prompt's next prefill chunk
/// or decode token) and returns, per plan, the bits of the logits rows after its prompt and
/// after each greedy decode token.
fn run(model: &dyn CausalLm, kv: &mut KvCacheStorage, plans: &[Plan]) -> Vec<Vec<Vec<u32>>> {
    let per_sequence = 8;
    let mut sequences: Vec<Sequence> = plans
        .iter()
        .enumerate()
        .map(|(index, plan)| Sequence {
            tokens: plan.prompt.clone(),
            computed: 0,
            blocks: (0..per_sequence)
                .map(|b| (index * per_sequence + b) as u32)
                .collect(),
            slot: plan.slot,
        })
        .collect();
    let mut chunk_index = vec![0; plans.len()];
    let mut rows: Vec<Vec<Vec<u32>>> = vec![Vec::new(); plans.len()];
    let (pool, mut workspace) = (pool(), Workspace::new());
    loop {
        let mut runs = Vec::new();
        let mut owners = Vec::new();
        for (index, sequence) in sequences.iter_mut().enumerate() {
            let plan = &plans[index];
            let prompt_left = plan.prompt.len().saturating_sub(sequence.computed);
            let count = if prompt_left > 0 {
                let chunk = plan.chunks.get(chunk_index[index]).copied();
                chunk_index[index] += 1;
                chunk.unwrap_or(prompt_left).min(prompt_left)
            } else if sequence.tokens.len() - plan.prompt.len() < NEW {
                1
            } else {
                continue;
            };
            owners.push(index);
            runs.push((sequence, count));
        }
        if runs.is_empty() {
            break;
        }
        let logits = step(model, &pool, kv, &mut workspace, &mut runs);
        for ((sequence, _), (row, &index)) in runs.iter_mut().zip(logits.iter().zip(&owners)) {
            if sequence.computed == sequence.tokens.len() {
                rows[index].push(row.iter().map(|v| v.to_bits()).collect());
                sequence.tokens.push(argmax(row));
            }
        }
    }
    rows
}

/// The grouped-values fixture's model, written to a directory of the test's own (`test`), and
/// a 70-token and a 23-token prompt.
fn model_and_prompts(test: &str) -> (Box<dyn CausalLm>, Vec<u32>, Vec<u32>) {
    let fixture = load_fixture("qwen35_grouped_values");
    let dir = scratch_dir(test);
    qwen35::write_hf_directory(&fixture, &dir, |_, _| {});
    let model = load(ModelSource::HfDirectory(dir));
    let vocab = model.config().vocab_size as u32;
    let long: Vec<u32> = (0..70u32).map(|i| (i * 37 + 11) % vocab).collect();
    let short: Vec<u32> = (0..23u32).map(|i| (i * 101 + 5) % vocab).collect();
    (model, long, short)
}

#[test]
fn alone_batched_chunked_and_in_another_slot_are_bitwise_equal() {
    let (model, long, short) = model_and_prompts("qwen35_invariance_batched");
    let model = model.as_ref();
    let cache = || hybrid_cache(model, 16, qwen35::BLOCK_SIZE, 4);
    let plan = |prompt: &[u32], slot, chunks: &[usize]| Plan {
        prompt: prompt.to_vec(),
        slot,
        chunks: chunks.to_vec(),
    };
    let alone = run(model, &mut cache(), &[plan(&long, 0, &[])]);
    let short_alone = run(model, &mut cache(), &[plan(&short, 0, &[])]);
    assert_eq!(alone[0].len(), NEW);
    let batched = run(
        model,
        &mut cache(),
        &[plan(&short, 1, &[]), plan(&long, 0, &[])],
    );
    assert_eq!(batched[1], alone[0], "batched with another prompt");
    assert_eq!(batched[0], short_alone[0], "the other prompt, batched");
    for chunks in [&[1usize, 2, 3][..], &[7, 16, 30], &[16, 16, 16, 16], &[69]] {
        let chunked = run(
            model,
            &mut cache(),
            &[plan(&long, 3, chunks), plan(&short, 2, &[5, 1])],
        );
        assert_eq!(chunked[0], alone[0], "prefill chunks {chunks:?}");
        assert_eq!(
            chunked[1], short_alone[0],
            "the other prompt in chunks [5, 1]"
        );
    }
}

#[test]
fn a_restart_from_position_zero_ignores_what_the_slot_held() {
    let (model, long, short) = model_and_prompts("qwen35_invariance_restart");
    let model = model.as_ref();
    let plan = |prompt: &[u32], slot, chunks: &[usize]| Plan {
        prompt: prompt.to_vec(),
        slot,
        chunks: chunks.to_vec(),
    };
    let alone = run(
        model,
        &mut hybrid_cache(model, 16, qwen35::BLOCK_SIZE, 2),
        &[plan(&long, 0, &[])],
    );
    // A preempted run: the short prompt, then part of the long one, through slot 1; the long
    // prompt is then recomputed from position 0 in that same slot.
    let mut kv = hybrid_cache(model, 16, qwen35::BLOCK_SIZE, 2);
    run(model, &mut kv, &[plan(&short, 1, &[])]);
    run(model, &mut kv, &[plan(&long[..20], 1, &[9])]);
    let restarted = run(model, &mut kv, &[plan(&long, 1, &[33])]);
    assert_eq!(restarted[0], alone[0]);
}
