//! Gemma 4's tokenizer model ("gemma4": BPE over raw UTF-8, spaces as "▁", byte fallback)
//! against llama.cpp 0c1e570 (scripts/reference/make_gemma4_tokenizer_fixture.py): ids with
//! BOS, ids without, text without and with special tokens, the streamed text, the
//! end-of-generation set and which tokens decoding hides. Two vocabularies: a small synthetic
//! one the converter wrote (rebuilt here as a GGUF from the fixture's tokenizer.* keys), and
//! Gemma 4's real one (llama.cpp's ggml-vocab-gemma-4.gguf, an asset; skipped without it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use tokenmill_gguf::{GgufFile, GgufWriter, MetadataValue};
use tokenmill_text::{DecodeOptions, IncrementalDetokenizer, Tokenizer};

#[derive(Deserialize)]
struct Fixture {
    bos: u32,
    add_bos: bool,
    end_of_generation: Vec<u32>,
    hidden: Vec<u32>,
    cases: Vec<Case>,
    /// Synthetic vocabulary only: [key, GGUF type, array item type, value].
    #[serde(default)]
    metadata: Vec<(String, String, Option<String>, Value)>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
    decoded_special: String,
}

fn load(name: &str) -> Fixture {
    serde_json::from_value(common::fixture(name)).unwrap()
}

fn metadata_value(kind: &str, value: &Value) -> MetadataValue {
    match kind {
        "STRING" => MetadataValue::String(value.as_str().unwrap().to_string()),
        "UINT32" => MetadataValue::U32(value.as_u64().unwrap() as u32),
        "INT32" => MetadataValue::I32(value.as_i64().unwrap() as i32),
        "FLOAT32" => MetadataValue::F32(value.as_f64().unwrap() as f32),
        "BOOL" => MetadataValue::Bool(value.as_bool().unwrap()),
        other => panic!("GGUF type {other} in the fixture"),
    }
}

/// The synthetic vocabulary's GGUF, rebuilt with tokenmill's writer from the keys the
/// converter wrote.
fn synthetic_gguf(fixture: &Fixture) -> GgufFile {
    let mut writer = GgufWriter::new();
    writer.add_metadata(
        "general.architecture",
        MetadataValue::String("gemma4".into()),
    );
    for (key, kind, item, value) in &fixture.metadata {
        let value = match (kind.as_str(), item) {
            ("ARRAY", Some(item)) => MetadataValue::Array(
                value
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| metadata_value(item, v))
                    .collect(),
            ),
            (kind, _) => metadata_value(kind, value),
        };
        writer.add_metadata(key, value);
    }
    GgufFile::from_bytes(writer.to_bytes()).unwrap()
}

/// Every comparison with llama.cpp; all mismatches are reported at once.
fn assert_matches_llama_cpp(tokenizer: Tokenizer, fixture: &Fixture, what: &str) {
    assert_eq!(tokenizer.adds_bos(), fixture.add_bos, "{what}");
    assert_eq!(tokenizer.bos_token_id(), Some(fixture.bos), "{what}");
    assert_eq!(
        tokenizer.eos_token_ids(),
        fixture.end_of_generation,
        "{what}"
    );
    let hidden: Vec<u32> = (0..tokenizer.vocab_size() as u32)
        .filter(|&id| tokenizer.is_special(id))
        .collect();
    assert_eq!(hidden, fixture.hidden, "{what}: ids decoding hides");

    let tokenizer = Arc::new(tokenizer);
    let mut mismatches = Vec::new();
    for case in &fixture.cases {
        let text = &case.text;
        let ours = tokenizer.encode(text, true).unwrap();
        if ours != case.ids {
            mismatches.push(format!(
                "{text:?}\n  llama.cpp: {:?}\n  ours:      {ours:?}",
                case.ids
            ));
            continue;
        }
        // Text round-trips, BOS written out, except a literal "▁", which is a space.
        let rendered = tokenizer.decode(&case.ids, false).unwrap();
        if !text.contains('\u{2581}') && rendered != format!("{}{text}", tokenizer.bos_token()) {
            mismatches.push(format!("{text:?} does not round-trip: {rendered:?}"));
        }
        let plain = tokenizer.encode(text, false).unwrap();
        if plain != case.ids[1..] {
            mismatches.push(format!("{text:?} without BOS: {plain:?}"));
        }
        let decoded = tokenizer.decode(&case.ids, true).unwrap();
        if decoded != case.decoded {
            mismatches.push(format!(
                "{text:?} decoded: {decoded:?}, llama.cpp {:?}",
                case.decoded
            ));
        }
        let decoded_special = tokenizer.decode(&case.ids, false).unwrap();
        if decoded_special != case.decoded_special {
            mismatches.push(format!(
                "{text:?} decoded with special tokens: {decoded_special:?}, llama.cpp {:?}",
                case.decoded_special
            ));
        }
        // Streamed one id at a time (byte-fallback pieces of one character held back), the
        // text is the whole decode.
        let mut detokenizer =
            IncrementalDetokenizer::new(Arc::clone(&tokenizer), &[], DecodeOptions::default());
        let mut streamed = String::new();
        for &id in &case.ids {
            let piece = detokenizer.push(id).unwrap();
            if piece.contains(char::REPLACEMENT_CHARACTER) {
                mismatches.push(format!("{text:?} streamed a broken character: {piece:?}"));
            }
            streamed.push_str(&piece);
        }
        streamed.push_str(&detokenizer.finish().unwrap());
        if streamed != case.decoded {
            mismatches.push(format!("{text:?} streamed: {streamed:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{what}: {} of {} cases differ from llama.cpp:\n{}",
        mismatches.len(),
        fixture.cases.len(),
        mismatches.join("\n")
    );
}

/// The exported HF tokenizer directory (a `tokenizers` pipeline, no llama.cpp encoder) encodes
/// the cases as the tokenizer does, except where a text holds `unreachable`: a run of newlines
/// that is a token no merge builds, which llama.cpp takes whole and `tokenizers` merges.
fn assert_exports_alike(
    tokenizer: &Tokenizer,
    fixture: &Fixture,
    unreachable: Option<&str>,
    what: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    tokenizer.write_hf_dir(dir.path(), None).unwrap();
    let exported = Tokenizer::from_hf_dir(dir.path()).unwrap();
    let differing: Vec<&str> = fixture
        .cases
        .iter()
        .filter(|case| exported.encode(&case.text, true).unwrap() != case.ids)
        .map(|case| case.text.as_str())
        .collect();
    let unexpected: Vec<&&str> = differing
        .iter()
        .filter(|text| unreachable.is_none_or(|run| !text.contains(run)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{what}: exported tokenizer differs on {unexpected:?}"
    );
    assert_eq!(
        differing.is_empty(),
        unreachable.is_none(),
        "{what}: {differing:?}"
    );
    assert_eq!(
        exported.eos_token_ids(),
        tokenizer.eos_token_ids(),
        "{what}"
    );
}

#[test]
fn synthetic_gemma4_vocabulary_matches_llama_cpp() {
    let fixture = load("tokenizer_gemma4_synthetic.json");
    let file = synthetic_gguf(&fixture);
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    assert!(fixture.cases.len() > 150);
    assert_exports_alike(
        &tokenizer,
        &fixture,
        Some(&"\n".repeat(12)),
        "synthetic vocabulary",
    );
    assert_matches_llama_cpp(tokenizer, &fixture, "synthetic vocabulary");
}

#[test]
fn real_gemma4_vocabulary_matches_llama_cpp() {
    let test = "real_gemma4_vocabulary_matches_llama_cpp";
    let Some(path) = tokenmill_test_assets::GEMMA4_VOCAB.or_skip(test) else {
        return;
    };
    let fixture = load("tokenizer_gemma4_vocab.json");
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!(tokenizer.vocab_size(), 262_144);
    assert_exports_alike(&tokenizer, &fixture, None, "Gemma 4's vocabulary");
    assert_matches_llama_cpp(tokenizer, &fixture, "Gemma 4's vocabulary");
}

#[test]
fn a_gemma4_vocabulary_without_bos_or_merges_is_refused() {
    let fixture = load("tokenizer_gemma4_synthetic.json");
    let without = |dropped: &str| Fixture {
        metadata: fixture
            .metadata
            .iter()
            .filter(|(key, ..)| key != dropped)
            .cloned()
            .collect(),
        bos: fixture.bos,
        add_bos: fixture.add_bos,
        end_of_generation: Vec::new(),
        hidden: Vec::new(),
        cases: Vec::new(),
    };
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.merges"] {
        let error = Tokenizer::from_gguf(&synthetic_gguf(&without(key))).unwrap_err();
        assert!(error.to_string().contains(key), "{key}: {error}");
    }
}
