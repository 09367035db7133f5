//! Criterion bench for the per-step sampling cost at serving batch sizes: 64 requests, each
//! sampling one row of the default model's 49,152-token vocabulary after a 512-token prompt.
//!
//! - `greedy`: default parameters, an empty logits chain (argmax on the raw row, no copy);
//! - `greedy_penalties`: repetition, presence and frequency penalties (incremental counts);
//! - `greedy_full_chain`: every processor (allowed ids, bad words, min-tokens, bias, penalties);
//! - `top_p`: temperature 0.8, top-p 0.9 (candidate sort).
//!
//! Throughput is in rows. The engine runs these rows in parallel on its pool; this bench runs
//! them on one thread, so the figure is the work per step. Run:
//! `cargo bench -p tokenmill-models --bench sampling`.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tokenmill_models::{History, Sampler, SamplingParams};

const VOCAB: usize = 49_152;
const ROWS: usize = 64;
const PROMPT: usize = 512;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Roughly normal with standard deviation 3, like a model's logits row (a sum of four
    /// uniforms); a flat row would make top-p keep most of the vocabulary, which models
    /// rarely do.
    fn logit(&mut self) -> f32 {
        let sum: f32 = (0..4).map(|_| self.uniform()).sum();
        (sum - 2.0) * 5.2
    }
}

fn cases() -> Vec<(&'static str, SamplingParams)> {
    let penalties = SamplingParams {
        repetition_penalty: 1.1,
        presence_penalty: 0.5,
        frequency_penalty: 0.5,
        ..SamplingParams::greedy()
    };
    let full_chain = SamplingParams {
        allowed_token_ids: Some((0..VOCAB as u32).step_by(2).collect()),
        bad_words_token_ids: vec![vec![10], vec![20, 22], vec![30, 32, 34]],
        min_tokens: 4,
        all_stop_token_ids: vec![2],
        logit_bias: vec![(100, 2.0), (200, -2.0)],
        ..penalties.clone()
    };
    let top_p = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(1),
        ..SamplingParams::default()
    };
    vec![
        ("greedy", SamplingParams::greedy()),
        ("greedy_penalties", penalties),
        ("greedy_full_chain", full_chain),
        ("top_p", top_p),
    ]
}

fn sampling(c: &mut Criterion) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let logits: Vec<f32> = (0..VOCAB * ROWS).map(|_| rng.logit()).collect();
    let prompts: Vec<Vec<u32>> = (0..ROWS)
        .map(|_| {
            (0..PROMPT)
                .map(|_| (rng.next() % VOCAB as u64) as u32)
                .collect()
        })
        .collect();
    let mut group = c.benchmark_group("sampling_step_64x49152");
    group.throughput(Throughput::Elements(ROWS as u64));
    for (name, params) in cases() {
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                || {
                    let samplers: Vec<Sampler> = prompts
                        .iter()
                        .map(|prompt| Sampler::new(params.clone(), prompt))
                        .collect();
                    (samplers, vec![Vec::<u32>::new(); ROWS])
                },
                |(samplers, outputs)| {
                    for (row, (sampler, output)) in samplers.iter_mut().zip(outputs).enumerate() {
                        let history = History {
                            prompt: &prompts[row],
                            output,
                        };
                        let row_logits = &logits[row * VOCAB..(row + 1) * VOCAB];
                        if let Ok(token) = sampler.sample(row_logits, &history) {
                            output.push(token.token_id);
                        }
                    }
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, sampling);
criterion_main!(benches);
