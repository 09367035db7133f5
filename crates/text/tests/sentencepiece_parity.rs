//! The SentencePiece ("llama" tokenizer model) GGUF path against llama.cpp, on a small trained
//! vocabulary stored in the fixture (scripts/reference/make_tokenizer_fixture.py).

// Test helpers outside #[test] functions panic on broken fixtures by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::fixture;
use tokenmill_text::{DecodeOptions, GgufVocab, IncrementalDetokenizer, Tokenizer};

fn spm_tokenizer() -> (Tokenizer, Vec<(String, Vec<u32>)>) {
    let fixture = fixture("tokenizer_spm_synthetic.json");
    let vocab = &fixture["vocab"];
    let vocab = GgufVocab {
        model: "llama".into(),
        tokens: vocab["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect(),
        scores: vocab["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_f64().unwrap() as f32)
            .collect(),
        token_types: vocab["token_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap() as i32)
            .collect(),
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        unknown_token_id: Some(0),
        add_bos_token: Some(true),
        ..GgufVocab::default()
    };
    let cases = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let ids = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|id| id.as_u64().unwrap() as u32)
                .collect();
            (case["prompt"].as_str().unwrap().to_string(), ids)
        })
        .collect::<Vec<_>>();
    (Tokenizer::from_gguf_vocab(&vocab).unwrap(), cases)
}

#[test]
fn ids_match_llama_cpp() {
    let (tokenizer, cases) = spm_tokenizer();
    assert!(tokenizer.adds_bos());
    let mismatches: Vec<String> = cases
        .iter()
        .filter_map(|(prompt, expected)| {
            let ours = tokenizer.encode(prompt, true).unwrap();
            (&ours != expected)
                .then(|| format!("{prompt:?}\n  llama.cpp: {expected:?}\n  ours:      {ours:?}"))
        })
        .collect();
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn decode_round_trips_and_streams() {
    let (tokenizer, cases) = spm_tokenizer();
    let tokenizer = Arc::new(tokenizer);
    for (prompt, ids) in cases.iter().filter(|(prompt, _)| !prompt.contains("</s>")) {
        assert_eq!(&tokenizer.decode(ids, true).unwrap(), prompt);
        // Byte-fallback tokens of one character arrive one at a time; the stream must hold them.
        let mut detokenizer =
            IncrementalDetokenizer::new(Arc::clone(&tokenizer), &[], DecodeOptions::default());
        let mut streamed = String::new();
        for &id in ids {
            let piece = detokenizer.push(id).unwrap();
            assert!(
                !piece.contains(char::REPLACEMENT_CHARACTER),
                "{prompt:?}: {piece:?}"
            );
            streamed.push_str(&piece);
        }
        streamed.push_str(&detokenizer.finish().unwrap());
        assert_eq!(&streamed, prompt);
    }
    assert_eq!(
        tokenizer
            .token_to_piece(tokenizer.token_to_id("<0x0A>").unwrap())
            .unwrap(),
        b"\n"
    );
    assert_eq!(
        tokenizer
            .token_to_piece(tokenizer.token_to_id("\u{2581}the").unwrap())
            .unwrap(),
        b" the"
    );
    assert_eq!(tokenizer.eos_token_ids(), vec![2]);
}

#[test]
fn spaces_between_special_tokens_false_adds_no_space_after_an_added_token() {
    let (tokenizer, cases) = spm_tokenizer();
    let tokenizer = Arc::new(tokenizer);
    let (prompt, ids) = &cases[0];
    assert_eq!(ids[0], 1, "the case starts with <s>");
    let spaced = DecodeOptions {
        skip_special_tokens: false,
        spaces_between_special_tokens: true,
    };
    let joined = DecodeOptions {
        spaces_between_special_tokens: false,
        ..spaced
    };
    // One decoding pass turns the first word's "▁" into a space after "<s>"; decoding the run
    // after the added token on its own strips it, as the slow tokenizers vLLM follows do.
    assert_eq!(
        tokenizer.decode_with(ids, spaced).unwrap(),
        format!("<s> {prompt}")
    );
    assert_eq!(
        tokenizer.decode_with(ids, joined).unwrap(),
        format!("<s>{prompt}")
    );
    // Between two ordinary runs: "</s>" inside the text.
    let mut inner = ids.clone();
    inner.insert(3, 2);
    let spaced_text = tokenizer.decode_with(&inner, spaced).unwrap();
    let joined_text = tokenizer.decode_with(&inner, joined).unwrap();
    assert_ne!(spaced_text, joined_text);
    assert!(joined_text.contains("</s>b"), "{joined_text:?}");
    // Skipped special tokens split nothing: both settings give the plain text.
    for spaces_between_special_tokens in [true, false] {
        let options = DecodeOptions {
            skip_special_tokens: true,
            spaces_between_special_tokens,
        };
        assert_eq!(&tokenizer.decode_with(ids, options).unwrap(), prompt);
    }
    // The stream concatenates to the full decode under either setting.
    for options in [spaced, joined] {
        let mut detokenizer = IncrementalDetokenizer::new(Arc::clone(&tokenizer), &[], options);
        let mut streamed: String = ids
            .iter()
            .map(|&id| detokenizer.push(id).unwrap())
            .collect();
        streamed.push_str(&detokenizer.finish().unwrap());
        assert_eq!(streamed, tokenizer.decode_with(ids, options).unwrap());
    }
}
