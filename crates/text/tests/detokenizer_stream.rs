//! Streaming detokenization and stop strings on the default model's tokenizer.

// Test helpers outside #[test] functions panic on broken fixtures by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::{default_tokenizer, tokenizer_cases};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenmill_text::{DecodeOptions, IncrementalDetokenizer, StopStringMatcher, Tokenizer};

/// Pieces emitted for `ids` one at a time, then the final flush.
fn stream(
    tokenizer: &Arc<Tokenizer>,
    prompt: &[u32],
    ids: &[u32],
    skip_special_tokens: bool,
) -> (Vec<String>, String) {
    let mut detokenizer = IncrementalDetokenizer::new(
        Arc::clone(tokenizer),
        prompt,
        DecodeOptions::skipping_special_tokens(skip_special_tokens),
    );
    let pieces = ids
        .iter()
        .map(|&id| detokenizer.push(id).unwrap())
        .collect();
    (pieces, detokenizer.finish().unwrap())
}

#[test]
fn streaming_equals_full_decode_on_fixture_prompts() {
    let tokenizer = Arc::new(default_tokenizer());
    for (prompt, ids) in tokenizer_cases() {
        for skip in [false, true] {
            let (pieces, tail) = stream(&tokenizer, &[], &ids, skip);
            let full = tokenizer.decode(&ids, skip).unwrap();
            assert_eq!(pieces.concat() + &tail, full, "{prompt:?} skip={skip}");
            if !full.contains(char::REPLACEMENT_CHARACTER) {
                assert!(
                    tail.is_empty(),
                    "{prompt:?}: complete text left {tail:?} for finish"
                );
                for piece in &pieces {
                    assert!(
                        !piece.contains(char::REPLACEMENT_CHARACTER),
                        "{prompt:?}: broken piece {piece:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn emoji_split_across_tokens_is_held_until_complete() {
    let tokenizer = Arc::new(default_tokenizer());
    let ids = tokenizer.encode("ok 🦀!", false).unwrap();
    // The crab is several byte-level tokens: at least one push must return nothing.
    let (pieces, tail) = stream(&tokenizer, &[], &ids, false);
    assert!(ids.len() > 3, "{ids:?}");
    assert!(pieces.iter().any(String::is_empty), "{pieces:?}");
    assert!(
        pieces.iter().any(|piece| piece.contains('🦀')),
        "{pieces:?}"
    );
    assert_eq!(pieces.concat(), "ok 🦀!");
    assert!(tail.is_empty());
}

#[test]
fn prompt_context_does_not_leak_into_output() {
    let tokenizer = Arc::new(default_tokenizer());
    let prompt = tokenizer
        .encode(
            "<|im_start|>user\nHi 🦀<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .unwrap();
    let generated = tokenizer.encode("Hello there 👋🏽<|im_end|>", false).unwrap();
    let (pieces, tail) = stream(&tokenizer, &prompt, &generated, true);
    assert_eq!(pieces.concat() + &tail, "Hello there 👋🏽");
}

#[test]
fn streaming_equals_full_decode_on_random_token_sequences() {
    let tokenizer = Arc::new(default_tokenizer());
    let vocab_size = tokenizer.vocab_size() as u32;
    let mut rng = StdRng::seed_from_u64(0x70c3_4111);
    for round in 0..300 {
        let length = rng.random_range(1..48);
        let ids: Vec<u32> = (0..length)
            .map(|_| match rng.random_range(0..4) {
                // Bias towards the byte tokens (ids 17..252 are the single-byte pieces) so
                // multi-byte characters get split and completed across tokens often.
                0 | 1 => rng.random_range(17..252),
                _ => rng.random_range(0..vocab_size),
            })
            .collect();
        for skip in [false, true] {
            let (pieces, tail) = stream(&tokenizer, &[], &ids, skip);
            assert_eq!(
                pieces.concat() + &tail,
                tokenizer.decode(&ids, skip).unwrap(),
                "round {round} ids {ids:?}"
            );
        }
    }
}

#[test]
fn stop_strings_match_across_token_boundaries() {
    let tokenizer = Arc::new(default_tokenizer());
    let text = "The answer is 42.\nQuestion: what is 6 × 7? 🦀 Answer: forty-two";
    let ids = tokenizer.encode(text, false).unwrap();
    let cases: &[(&[&str], bool, &str)] = &[
        (&["\nQuestion"], false, "The answer is 42."),
        (&["\nQuestion"], true, "The answer is 42.\nQuestion"),
        (
            &["🦀 Ans", "is 6"],
            false,
            "The answer is 42.\nQuestion: what ",
        ),
        (
            &["× 7? 🦀"],
            true,
            "The answer is 42.\nQuestion: what is 6 × 7? 🦀",
        ),
        (&["never appears"], false, text),
    ];
    for &(stops, include, expected) in cases {
        let mut detokenizer = IncrementalDetokenizer::new(
            Arc::clone(&tokenizer),
            &[],
            DecodeOptions::skipping_special_tokens(false),
        );
        let mut matcher =
            StopStringMatcher::new(stops.iter().map(|s| s.to_string()).collect(), include);
        let mut output = String::new();
        let mut stopped = false;
        for &id in &ids {
            let step = matcher.push(&detokenizer.push(id).unwrap());
            output.push_str(&step.text);
            if step.stopped.is_some() {
                stopped = true;
                break;
            }
        }
        if !stopped {
            output.push_str(&matcher.push(&detokenizer.finish().unwrap()).text);
            output.push_str(&matcher.finish());
        }
        assert_eq!(output, expected, "stops {stops:?} include={include}");
        assert_eq!(stopped, expected != text);
    }
}
