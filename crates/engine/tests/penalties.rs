//! Repetition, presence and frequency penalties, logit bias and the min-tokens ban on the real
//! default model: the output of each (greedy, plus one seeded sampled case) is pinned to the
//! token ids main's sampler produced, recorded before the penalties became incremental counts
//! in the logits-processor chain; alone and batched together. Those ids were recorded with an
//! f32 KV cache (the `auto` of that time), so the engine here asks for `float32` explicitly.

mod common;

use common::{config, greedy, run_all};
use tokenmill_engine::{Engine, GenerateRequest};
use tokenmill_models::CacheDtype;

const MAX_TOKENS: u32 = 32;
const PROMPT: &str = "The cat sat on the mat. The cat sat on the mat. The cat sat on the";

/// Each case's ids from main's sampler (commit c8b4416), which rebuilt the penalty counts over
/// the whole history every step.
const EXPECTED: &[(&str, &[u32])] = &[
    (
        "none",
        &[
            1171, 30, 378, 2644, 2643, 335, 260, 1171, 30, 198, 198, 788, 451, 1183, 28, 260, 2644,
            314, 8001, 335, 260, 1171, 28, 527, 314, 253, 8170, 1183, 282, 253, 2644, 506,
        ],
    ),
    (
        "repetition",
        &[
            6289, 28, 284, 357, 436, 253, 3953, 1194, 327, 601, 288, 325, 1592, 1270, 198, 29, 669,
            314, 354, 1183, 282, 1015, 476, 11518, 18, 2489, 282, 476, 25408, 1002, 527, 416,
        ],
    ),
    (
        "presence",
        &[
            1171, 30, 378, 2644, 2643, 335, 260, 1171, 30, 198, 198, 788, 451, 1183, 28, 260, 6330,
            314, 12498, 281, 253, 970, 338, 5593, 253, 9619, 5972, 282, 2466, 30, 378, 808,
        ],
    ),
    (
        "frequency",
        &[
            1171, 30, 378, 2644, 2643, 335, 260, 1171, 30, 198, 198, 788, 451, 1183, 28, 260, 2644,
            314, 8001, 335, 253, 9192, 28, 284, 260, 9192, 314, 8001, 335, 253, 3252, 30,
        ],
    ),
    (
        "all",
        &[
            6289, 28, 284, 260, 2644, 2643, 281, 253, 9192, 1270, 198, 29, 669, 314, 354, 1183,
            282, 638, 288, 722, 476, 254, 18, 2489, 282, 476, 258, 1002, 527, 416, 2406, 919,
        ],
    ),
    (
        "seeded",
        &[
            6644, 282, 253, 2291, 28, 527, 436, 33159, 411, 20686, 1270, 198, 1348, 314, 441, 805,
            354, 3684, 1977, 564, 357, 597, 5860, 347, 253, 14795, 327, 1029, 506, 2529, 284, 469,
        ],
    ),
    (
        "bias",
        &[
            9192, 30, 378, 9192, 2643, 335, 260, 1171, 30, 378, 9192, 2643, 335, 260, 9192, 30,
            378, 9192, 2643, 335, 260, 9192, 30, 378, 9192, 2643, 335, 260, 9192, 30, 378, 9192,
        ],
    ),
    (
        "min_tokens",
        &[1171, 28, 284, 260, 2644, 2643, 335, 260, 1171, 30],
    ),
];

fn requests(prompt: &[u32]) -> Vec<(&'static str, GenerateRequest)> {
    let with = |name, edit: fn(&mut GenerateRequest)| {
        let mut request = greedy(prompt.to_vec(), MAX_TOKENS);
        edit(&mut request);
        (name, request)
    };
    vec![
        with("none", |_| {}),
        with("repetition", |r| r.sampling.repetition_penalty = 1.3),
        with("presence", |r| r.sampling.presence_penalty = 1.5),
        with("frequency", |r| r.sampling.frequency_penalty = 0.9),
        with("all", |r| {
            r.sampling.repetition_penalty = 1.15;
            r.sampling.presence_penalty = 0.4;
            r.sampling.frequency_penalty = 0.6;
        }),
        with("seeded", |r| {
            r.sampling.temperature = 0.8;
            r.sampling.top_p = 0.9;
            r.sampling.seed = Some(42);
            r.sampling.repetition_penalty = 1.2;
            r.sampling.frequency_penalty = 0.3;
        }),
        with("bias", |r| {
            r.sampling.logit_bias = vec![(2644, -5.0), (9192, 3.0)]
        }),
        // "." (30) is a stop token that may not come before the fifth token.
        with("min_tokens", |r| {
            r.stop.stop_token_ids = vec![30];
            r.sampling.min_tokens = 5;
        }),
    ]
}

#[test]
fn penalised_greedy_output_matches_the_rebuild_per_step_sampler() {
    let mut engine_config = config(256, 256);
    engine_config.max_num_seqs = 8;
    engine_config.kv_cache_dtype = CacheDtype::Float32;
    let engine = Engine::start(&engine_config).unwrap();
    let prompt = engine.model().tokenizer.encode(PROMPT, true).unwrap();
    let cases = requests(&prompt);
    let alone: Vec<Vec<u32>> = cases
        .iter()
        .map(|(_, request)| {
            run_all(&engine.client(), vec![request.clone()])[0]
                .token_ids
                .clone()
        })
        .collect();
    for ((name, _), ids) in cases.iter().zip(&alone) {
        let expected = EXPECTED
            .iter()
            .find(|(case, _)| case == name)
            .map(|(_, ids)| ids.to_vec());
        assert_eq!(Some(ids.clone()), expected, "{name}");
    }
    let together = run_all(
        &engine.client(),
        cases.iter().map(|(_, request)| request.clone()).collect(),
    );
    for (((name, _), ids), out) in cases.iter().zip(&alone).zip(&together) {
        assert_eq!(&out.token_ids, ids, "{name} differs when batched");
    }
    engine.shutdown();
}
