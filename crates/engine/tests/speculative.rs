//! Speculative decoding on the real default model: greedy tokens are identical with and
//! without each method (`ngram`, `suffix`), for requests run alone, batched, with heavy
//! chunking and under preemption, and drafts were really accepted (so the comparison is not
//! vacuous). Prompts repeat a random span, so the model's continuation copies from them, as
//! input-grounded work (code edits, quotes) does.

mod common;

use common::{config, greedy, greedy_run, run_all, samples, value};
use tokenmill_engine::spec::SpeculativeConfig;
use tokenmill_engine::{Engine, EngineConfig, SamplingParams};

const NUM_REQUESTS: usize = 8;
const MAX_TOKENS: u32 = 20;

/// Prompts of a random span of 8..24 ordinary tokens, repeated two or three times.
fn repeating_prompts() -> Vec<Vec<u32>> {
    common::prompts(NUM_REQUESTS, 11)
        .into_iter()
        .enumerate()
        .map(|(i, span)| {
            let span = &span[..span.len().clamp(8, 24)];
            span.iter()
                .copied()
                .cycle()
                .take(span.len() * (2 + i % 2))
                .collect()
        })
        .collect()
}

/// What a run gave: each request's tokens, the drafted and accepted tokens, the preemptions.
struct Run {
    tokens: Vec<Vec<u32>>,
    drafted: f64,
    accepted: f64,
    preemptions: f64,
}

fn run(config: &EngineConfig, prompts: &[Vec<u32>], together: bool) -> Run {
    let (tokens, scrape) = greedy_run(config, prompts, MAX_TOKENS, !together);
    let counter = |name| match config.speculative {
        Some(_) => value(&scrape, name, None),
        None => 0.0,
    };
    Run {
        tokens,
        drafted: counter("vllm:spec_decode_num_draft_tokens_total"),
        accepted: counter("vllm:spec_decode_num_accepted_tokens_total"),
        preemptions: value(&scrape, "vllm:num_preemptions_total", None),
    }
}

/// Greedy tokens with `json`'s speculation equal those without it in every setting, drafts
/// are accepted, and with `all_accepted` every drafted token is.
#[allow(clippy::unwrap_used)]
fn check_method(json: &str, all_accepted: bool) {
    let prompts = repeating_prompts();
    let base = |num_blocks, max_model_len| {
        let mut config = config(num_blocks, max_model_len);
        config.enable_prefix_caching = false;
        config.served_model_name = "tm-test".into();
        config.max_num_seqs = NUM_REQUESTS;
        config
    };
    let reference = run(&base(512, 256), &prompts, true).tokens;
    assert!(reference.iter().all(|t| t.len() == MAX_TOKENS as usize));
    let speculative = SpeculativeConfig::from_json(json).unwrap();
    let with_spec = |mut config: EngineConfig| {
        config.speculative = Some(speculative.clone());
        config
    };
    let mut chunked = base(512, 256);
    chunked.max_num_batched_tokens = Some(16);
    // 14 blocks of 16 tokens: fewer than the requests need together.
    let tiny = base(14, 128);
    for (name, config, together) in [
        ("alone", with_spec(base(512, 256)), false),
        ("batched", with_spec(base(512, 256)), true),
        ("chunked", with_spec(chunked), true),
        ("preempted", with_spec(tiny), true),
    ] {
        let outcome = run(&config, &prompts, together);
        if name == "preempted" {
            assert!(outcome.preemptions > 0.0, "{json}: nothing was preempted");
        }
        for (i, tokens) in outcome.tokens.iter().enumerate() {
            assert_eq!(tokens, &reference[i], "{json} {name}: request {i} differs");
        }
        assert!(
            outcome.accepted > 0.0,
            "{json} {name}: no draft token was accepted"
        );
        if all_accepted {
            assert_eq!(outcome.accepted, outcome.drafted, "{json} {name}");
        }
    }
}

#[test]
fn ngram_greedy_tokens_are_identical_alone_batched_chunked_and_preempted() {
    check_method(
        r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4, "disable_by_batch_size": 64}"#,
        false,
    );
}

#[test]
fn suffix_greedy_tokens_are_identical_alone_batched_chunked_and_preempted() {
    check_method(
        r#"{"method": "suffix", "num_speculative_tokens": 6, "disable_by_batch_size": 64}"#,
        false,
    );
}

/// The default model as its own draft: the draft's greedy tokens are the target's, so every
/// draft token is accepted (the draft's cache and forward passes are its own).
#[test]
fn the_model_as_its_own_draft_is_always_accepted_and_changes_nothing() {
    let json = format!(
        r#"{{"method": "draft_model", "model": {}, "num_speculative_tokens": 3,
            "disable_by_batch_size": 64}}"#,
        serde_json::Value::String(common::model_path().display().to_string())
    );
    check_method(&json, true);
}

/// Sampled requests verify by rejection sampling: they run to completion with drafts accepted,
/// and a seeded request repeats itself exactly.
#[test]
#[allow(clippy::unwrap_used)]
fn seeded_sampled_requests_speculate_and_repeat() {
    let prompts = repeating_prompts();
    let mut config = config(512, 256);
    config.served_model_name = "tm-test".into();
    config.speculative = Some(
        SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}"#,
        )
        .unwrap(),
    );
    let engine = Engine::start(&config).unwrap();
    let client = engine.client();
    let request = |seed| {
        let mut request = greedy(prompts[0].clone(), MAX_TOKENS);
        request.sampling = SamplingParams {
            temperature: 0.3,
            top_k: Some(20),
            seed: Some(seed),
            logprobs: Some(1),
            ..SamplingParams::default()
        };
        request
    };
    let first = run_all(&client, vec![request(5), request(5)]);
    assert_eq!(first[0].token_ids, first[1].token_ids);
    assert_eq!(first[0].token_ids.len(), MAX_TOKENS as usize);
    common::wait_idle(&client);
    let accepted = value(
        &samples(&engine.metrics().encode().unwrap()),
        "vllm:spec_decode_num_accepted_tokens_total",
        None,
    );
    assert!(accepted > 0.0);
    engine.shutdown();
}

/// One request's whole output: tokens, text, logprobs, finish reason.
#[derive(Debug, Clone, PartialEq)]
struct Full {
    tokens: Vec<u32>,
    text: String,
    logprobs: Vec<tokenmill_engine::TokenLogprob>,
    finish: Option<tokenmill_engine::FinishReason>,
}

#[allow(clippy::unwrap_used, clippy::panic)]
fn run_full(config: &EngineConfig, requests: Vec<tokenmill_engine::GenerateRequest>) -> Vec<Full> {
    let engine = Engine::start(config).unwrap();
    let client = engine.client();
    let mut streams: Vec<_> = requests
        .into_iter()
        .map(|r| client.add_request(r).unwrap())
        .collect();
    let outputs = streams
        .iter_mut()
        .map(|stream| {
            let mut full = Full {
                tokens: Vec::new(),
                text: String::new(),
                logprobs: Vec::new(),
                finish: None,
            };
            while let Some(event) = stream.blocking_recv() {
                match event {
                    tokenmill_engine::RequestEvent::Output(o) => {
                        full.tokens.extend(o.new_token_ids);
                        full.text.push_str(&o.new_text);
                        full.logprobs.extend(o.logprobs);
                        full.finish = o.finish_reason.or(full.finish);
                    }
                    tokenmill_engine::RequestEvent::Rejected(e)
                    | tokenmill_engine::RequestEvent::Error(e) => panic!("request failed: {e}"),
                    tokenmill_engine::RequestEvent::Failed(failure) => {
                        panic!("request failed: {failure:?}")
                    }
                }
            }
            full
        })
        .collect();
    engine.shutdown();
    outputs
}

/// Stop strings are matched on the text of an accepted run token by token, so nothing after
/// one is emitted (text, token ids or logprobs); logprobs of emitted tokens are those of
/// plain decoding.
#[test]
#[allow(clippy::unwrap_used)]
fn stop_strings_and_logprobs_inside_accepted_runs_match_plain_decoding() {
    let prompts = repeating_prompts();
    let request = |prompt: &Vec<u32>, stop: Option<String>| {
        let mut request = greedy(prompt.clone(), MAX_TOKENS);
        request.sampling.logprobs = Some(2);
        request.stop.stop_strings = stop.into_iter().collect();
        request
    };
    let mut plain = config(512, 256);
    plain.max_num_seqs = NUM_REQUESTS;
    let mut speculative = plain.clone();
    speculative.speculative = Some(
        SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1,
                "disable_by_batch_size": 64}"#,
        )
        .unwrap(),
    );
    let free = run_full(&plain, prompts.iter().map(|p| request(p, None)).collect());
    // A stop string from the middle of each reference text.
    let stops: Vec<Option<String>> = free
        .iter()
        .map(|full| {
            let chars: Vec<char> = full.text.chars().collect();
            let start = chars.len() / 2;
            let stop: String = chars[start..(start + 3).min(chars.len())].iter().collect();
            (!stop.trim().is_empty()).then_some(stop)
        })
        .collect();
    let with_stops = |config: &EngineConfig| {
        run_full(
            config,
            prompts
                .iter()
                .zip(&stops)
                .map(|(p, stop)| request(p, stop.clone()))
                .collect(),
        )
    };
    let expected = with_stops(&plain);
    let got = with_stops(&speculative);
    assert_eq!(got, expected);
    assert_eq!(
        run_full(
            &speculative,
            prompts.iter().map(|p| request(p, None)).collect()
        ),
        free
    );
    // The stops did cut the outputs short.
    assert!(expected
        .iter()
        .zip(&free)
        .any(|(cut, whole)| cut.tokens.len() < whole.tokens.len()));
    assert!(expected
        .iter()
        .all(|full| full.logprobs.len() == full.tokens.len()));
}

/// A grammar sees only emitted tokens: drafts are checked against the masked rows one by one,
/// and the matcher accepts a token only once it is emitted, so a constrained request gives the
/// tokens of plain decoding, ends where the grammar does, and still accepts drafts.
#[test]
#[allow(clippy::unwrap_used)]
fn structured_outputs_with_speculation_match_plain_decoding() {
    let mut request = greedy(vec![504, 3575, 282, 1116, 30], 64);
    request.stop.ignore_eos = false;
    request.sampling.structured_output = Some(tokenmill_models::StructuredOutput::Regex(
        "(the cat sat on the mat\\. ){3}".into(),
    ));
    let mut plain = config(512, 256);
    plain.served_model_name = "tm-test".into();
    let mut speculative = plain.clone();
    speculative.speculative = Some(
        SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2}"#,
        )
        .unwrap(),
    );
    let expected = run_full(&plain, vec![request.clone()]);
    assert_eq!(expected[0].text, "the cat sat on the mat. ".repeat(3));
    assert_eq!(
        expected[0].finish,
        Some(tokenmill_engine::FinishReason::Stop)
    );
    let engine = Engine::start(&speculative).unwrap();
    let got = run_all(&engine.client(), vec![request]);
    common::wait_idle(&engine.client());
    let accepted = value(
        &samples(&engine.metrics().encode().unwrap()),
        "vllm:spec_decode_num_accepted_tokens_total",
        None,
    );
    engine.shutdown();
    assert_eq!(got[0].token_ids, expected[0].tokens);
    assert_eq!(got[0].text, expected[0].text);
    assert!(accepted > 0.0, "no draft accepted under the grammar");
}

/// The default model with every layer's weights taken from the next layer (the last from the
/// first): same shapes, vocabulary and tokenizer, finite weights, different predictions.
#[allow(clippy::unwrap_used)]
fn scrambled_draft_path() -> std::path::PathBuf {
    common::derived_gguf("draft-scrambled.gguf", || {
        let file = tokenmill_gguf::GgufFile::open(&common::model_path()).unwrap();
        let mut writer = tokenmill_gguf::GgufWriter::new();
        for (key, value) in file.metadata() {
            writer.add_metadata(key, value.clone());
        }
        let by_name: std::collections::HashMap<&str, &tokenmill_gguf::TensorInfo> = file
            .tensors()
            .iter()
            .map(|info| (info.name.as_str(), info))
            .collect();
        let num_layers = (0..)
            .take_while(|i| by_name.keys().any(|n| n.starts_with(&format!("blk.{i}."))))
            .count();
        for info in file.tensors() {
            let source = info
                .name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(layer, tail)| {
                    let next = (layer.parse::<usize>().ok()? + 1) % num_layers;
                    by_name.get(format!("blk.{next}.{tail}").as_str()).copied()
                })
                .filter(|other| other.dims == info.dims && other.ggml_type == info.ggml_type)
                .unwrap_or(info);
            let data = file.tensor_data(source).unwrap().to_vec();
            writer.add_tensor(&info.name, &info.dims, info.ggml_type, data);
        }
        writer
    })
}

/// A draft that mostly guesses wrong: drafts are rejected, and greedy output is still exactly
/// that of plain decoding.
#[test]
#[allow(clippy::unwrap_used)]
fn a_wrong_draft_model_is_rejected_without_changing_the_output() {
    let draft = scrambled_draft_path();
    let prompts = repeating_prompts();
    let mut plain = config(512, 256);
    plain.served_model_name = "tm-test".into();
    plain.max_num_seqs = NUM_REQUESTS;
    let reference = run(&plain, &prompts, true);
    let mut speculative = plain.clone();
    speculative.speculative = Some(
        SpeculativeConfig::from_json(&format!(
            r#"{{"method": "draft_model", "model": {}, "num_speculative_tokens": 3,
                "disable_by_batch_size": 64}}"#,
            serde_json::Value::String(draft.display().to_string())
        ))
        .unwrap(),
    );
    let outcome = run(&speculative, &prompts, true);
    std::fs::remove_file(&draft).unwrap();
    assert_eq!(outcome.tokens, reference.tokens);
    assert!(outcome.drafted > 0.0);
    assert!(
        outcome.accepted < outcome.drafted,
        "{} of {} accepted",
        outcome.accepted,
        outcome.drafted
    );
}

/// Three drafting steps for each of `ids`' requests (prompts `prompts[id]`) on `proposer`, all
/// of them in the same calls: each step's drafts, per request. After a step a request grows
/// by its first draft and a token the draft did not propose (one draft accepted, the second
/// rejected), so the next step feeds the draft model two unseen tokens.
#[allow(clippy::unwrap_used)]
fn draft_steps(
    proposer: &mut tokenmill_engine::spec::DraftModelProposer,
    prompts: &[Vec<u32>],
    ids: &[usize],
) -> Vec<Vec<Vec<u32>>> {
    use tokenmill_engine::spec::{DraftRequest, Proposer};
    const K: usize = 3;
    let mut tokens: Vec<Vec<u32>> = ids.iter().map(|&id| prompts[id].clone()).collect();
    let mut steps = vec![Vec::new(); ids.len()];
    for _ in 0..3 {
        let requests: Vec<DraftRequest<'_>> = ids
            .iter()
            .zip(&tokens)
            .map(|(&id, tokens)| DraftRequest {
                request_id: tokenmill_core::RequestId(id as u64),
                tokens,
                num_prompt_tokens: prompts[id].len(),
            })
            .collect();
        let mut drafts = vec![vec![7]; ids.len()];
        proposer.propose_all(&requests, K, &mut drafts);
        for (i, drafts) in drafts.into_iter().enumerate() {
            assert_eq!(drafts.len(), K, "request {}", ids[i]);
            tokens[i].push(drafts[0]);
            tokens[i].push(drafts[1] ^ 1);
            steps[i].push(drafts);
        }
    }
    steps
}

/// The draft model drafts for all of a step's requests in one batched forward pass per
/// position; each request's drafts are exactly those it gets drafting alone, in its first
/// step (the whole prompt fed) and in later ones (only its unseen tokens fed), with prompts
/// of different lengths sharing the passes.
#[test]
#[allow(clippy::unwrap_used)]
fn draft_model_drafts_are_the_same_alone_and_batched() {
    use tokenmill_engine::spec::{DraftModelProposer, DraftSetup};
    let path = common::model_path();
    let file = tokenmill_gguf::GgufFile::open(&path).unwrap();
    let setup = DraftSetup {
        num_blocks: 256,
        block_size: 16,
        vocab_size: tokenmill_models::ModelConfig::from_gguf(&file)
            .unwrap()
            .vocab_size,
        num_threads: None,
        kv_dtype: tokenmill_models::KvCacheDType::F16,
    };
    let prompts = repeating_prompts();
    let ids: Vec<usize> = (0..prompts.len()).collect();
    let mut alone = DraftModelProposer::load(&path, &setup).unwrap();
    let expected: Vec<Vec<Vec<u32>>> = ids
        .iter()
        .flat_map(|&id| draft_steps(&mut alone, &prompts, &[id]))
        .collect();
    let mut batched = DraftModelProposer::load(&path, &setup).unwrap();
    assert_eq!(draft_steps(&mut batched, &prompts, &ids), expected);
    // A different grouping, the requests in reverse order.
    let reversed: Vec<usize> = ids.iter().rev().copied().collect();
    let mut grouped = DraftModelProposer::load(&path, &setup).unwrap();
    let mut got = draft_steps(&mut grouped, &prompts, &reversed);
    got.reverse();
    assert_eq!(got, expected);
}
