//! Our GGUF-built tokenizer against llama.cpp's ids for the default model
//! (fixture written by scripts/reference/make_tokenizer_fixture.py).

// Test helpers outside #[test] functions panic on broken fixtures by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{default_tokenizer, model_path, tokenizer_cases};
use tokenmill_text::{GgufVocab, Tokenizer};

#[test]
fn ids_match_llama_cpp_for_every_fixture_prompt() {
    let tokenizer = default_tokenizer();
    let cases = tokenizer_cases();
    assert!(cases.len() >= 12, "fixture has {} prompts", cases.len());
    let mut mismatches = Vec::new();
    for (prompt, expected) in &cases {
        // The default model sets add_bos_token = false: special tokens add nothing.
        let with_special = tokenizer.encode(prompt, true).unwrap();
        let without_special = tokenizer.encode(prompt, false).unwrap();
        if &with_special != expected || &without_special != expected {
            mismatches.push(format!(
                "{prompt:?}\n  llama.cpp: {expected:?}\n  ours:      {with_special:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "token id mismatches:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn decode_of_encode_round_trips() {
    let tokenizer = default_tokenizer();
    for (prompt, ids) in tokenizer_cases() {
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), prompt);
        assert_eq!(
            tokenizer
                .decode(&tokenizer.encode(&prompt, false).unwrap(), false)
                .unwrap(),
            prompt
        );
    }
}

#[test]
fn known_prompt_and_special_tokens() {
    let tokenizer = default_tokenizer();
    assert_eq!(
        tokenizer.encode("The capital of France is", true).unwrap(),
        vec![504, 3575, 282, 4649, 314]
    );
    assert_eq!(tokenizer.vocab_size(), 49152);
    assert!(!tokenizer.adds_bos());
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    assert_eq!(tokenizer.bos_token(), "<|im_start|>");
    assert_eq!(tokenizer.eos_token(), "<|im_end|>");
    assert_eq!(tokenizer.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tokenizer.id_to_token(504).as_deref(), Some("The"));
    assert_eq!(tokenizer.token_to_piece(3575).unwrap(), b" capital");
    assert_eq!(tokenizer.token_to_piece(2).unwrap(), b"<|im_end|>");
    assert!(tokenizer.is_special(2) && !tokenizer.is_special(504));
    // llama.cpp ends generation on <|endoftext|> (0) and <|im_end|> (2, EOS and the template's
    // end of turn).
    assert_eq!(tokenizer.eos_token_ids(), vec![0, 2]);
    assert_eq!(tokenizer.decode(&[1, 504, 2], true).unwrap(), "The");
    assert!(tokenizer.decode(&[49152], false).is_err());
}

#[test]
fn hf_directory_with_the_same_vocabulary_gives_the_same_ids() {
    // A tokenizer.json written from the GGUF vocabulary exercises the Hugging Face loading path
    // (tokenizer.json + tokenizer_config.json + generation_config.json) against llama.cpp's ids.
    let file = tokenmill_gguf::GgufFile::open(&model_path()).unwrap();
    let vocab = GgufVocab::from_gguf(&file).unwrap();
    let dir = tempfile::tempdir().unwrap();
    vocab
        .build()
        .unwrap()
        .save(dir.path().join("tokenizer.json"), false)
        .unwrap();
    let template = vocab.chat_template.clone().unwrap();
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "add_bos_token": false,
        "chat_template": [{"name": "tool_use", "template": "unused"}, {"name": "default", "template": template}],
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [2, 0]}"#,
    )
    .unwrap();
    let tokenizer = Tokenizer::from_hf_dir(dir.path()).unwrap();
    for (prompt, ids) in tokenizer_cases() {
        assert_eq!(tokenizer.encode(&prompt, true).unwrap(), ids, "{prompt:?}");
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), prompt);
    }
    assert_eq!(tokenizer.chat_template(), Some(template.as_str()));
    assert_eq!(tokenizer.eos_token_ids(), vec![0, 2]);
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    assert!(!tokenizer.adds_bos());
    assert_eq!(tokenizer.token_to_piece(3575).unwrap(), b" capital");
}

#[test]
fn hf_post_processor_decides_whether_bos_is_added() {
    use tokenizers::processors::template::TemplateProcessing;
    let file = tokenmill_gguf::GgufFile::open(&model_path()).unwrap();
    let mut inner = GgufVocab::from_gguf(&file).unwrap().build().unwrap();
    let post_processor = TemplateProcessing::builder()
        .try_single("<|im_start|> $A")
        .unwrap()
        .special_tokens(vec![("<|im_start|>", 1)])
        .build()
        .unwrap();
    inner.with_post_processor(Some(post_processor));
    let dir = tempfile::tempdir().unwrap();
    inner
        .save(dir.path().join("tokenizer.json"), false)
        .unwrap();
    let config = dir.path().join("tokenizer_config.json");
    std::fs::write(
        &config,
        r#"{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}"#,
    )
    .unwrap();
    let tokenizer =
        Tokenizer::from_file(&dir.path().join("tokenizer.json"), Some(&config)).unwrap();
    assert!(tokenizer.adds_bos());
    assert_eq!(
        tokenizer.encode("The capital of France is", true).unwrap(),
        vec![1, 504, 3575, 282, 4649, 314]
    );
    assert_eq!(
        tokenizer.encode("The capital of France is", false).unwrap(),
        vec![504, 3575, 282, 4649, 314]
    );
    let without_config = Tokenizer::from_file(&dir.path().join("tokenizer.json"), None).unwrap();
    assert_eq!(without_config.eos_token_ids(), Vec::<u32>::new());
}

/// A GGUF vocabulary has no post-processor: pooling inputs get BOS/EOS by hand per
/// `add_bos_token` / `add_eos_token` (Qwen3-Embedding's GGUF appends its EOS), as `encode`
/// does, and truncation keeps room for them.
#[test]
fn gguf_pooling_inputs_get_bos_and_eos_as_the_vocabulary_says() {
    let file = tokenmill_gguf::GgufFile::open(&model_path()).unwrap();
    let mut vocab = GgufVocab::from_gguf(&file).unwrap();
    let text = "The capital of France is";
    let plain = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    let (ids, _) = plain.encode_for_pooling(text, None, true, None).unwrap();
    assert_eq!(ids, plain.encode(text, true).unwrap());
    assert_eq!(ids, [504, 3575, 282, 4649, 314], "SmolLM2 adds neither");
    vocab.add_bos_token = Some(true);
    vocab.add_eos_token = Some(true);
    let both = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    let eos = both.eos_token_id().unwrap();
    let (ids, types) = both.encode_for_pooling(text, None, true, None).unwrap();
    assert_eq!(ids, both.encode(text, true).unwrap());
    assert_eq!(ids, [1, 504, 3575, 282, 4649, 314, eos]);
    assert_eq!(types, [0; 7]);
    let (cut, _) = both.encode_for_pooling(text, None, true, Some(4)).unwrap();
    assert_eq!(cut, [1, 504, 3575, eos]);
    let (bare, _) = both.encode_for_pooling(text, None, false, None).unwrap();
    assert_eq!(bare, [504, 3575, 282, 4649, 314]);
}
