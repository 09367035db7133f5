//! A GGUF tokenizer exported as an HF tokenizer directory loads back as the same tokenizer:
//! same ids with and without special tokens (BOS/EOS added by the exported post-processor
//! where the GGUF adds them by hand), same text, same EOS set and chat template.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{model_path, tokenizer_cases};
use tokenmill_text::{GgufVocab, Tokenizer};

fn assert_round_trip(original: &Tokenizer, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    original.write_hf_dir(dir.path(), Some(2048)).unwrap();
    let loaded = Tokenizer::from_hf_dir(dir.path()).unwrap();
    let mut prompts: Vec<String> = tokenizer_cases().into_iter().map(|(p, _)| p).collect();
    prompts.push("<|im_start|>user\nHi<|im_end|>\n".into());
    prompts.push(String::new());
    for prompt in &prompts {
        for special in [false, true] {
            let expected = original.encode(prompt, special).unwrap();
            assert_eq!(
                loaded.encode(prompt, special).unwrap(),
                expected,
                "{what}: {prompt:?} (special tokens {special})"
            );
            assert_eq!(
                loaded.decode(&expected, false).unwrap(),
                original.decode(&expected, false).unwrap()
            );
        }
    }
    assert_eq!(loaded.bos_token_id(), original.bos_token_id(), "{what}");
    assert_eq!(loaded.eos_token_id(), original.eos_token_id(), "{what}");
    assert_eq!(loaded.eos_token_ids(), original.eos_token_ids(), "{what}");
    assert_eq!(loaded.adds_bos(), original.adds_bos(), "{what}");
    assert_eq!(loaded.chat_template(), original.chat_template(), "{what}");
    assert_eq!(loaded.vocab_size(), original.vocab_size(), "{what}");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["model_max_length"], 2048);
    assert_eq!(config["eos_token"], original.eos_token());
}

#[test]
fn default_model_tokenizer_round_trips_through_an_hf_directory() {
    let file = tokenmill_gguf::GgufFile::open(&model_path()).unwrap();
    assert_round_trip(&Tokenizer::from_gguf(&file).unwrap(), "as shipped");
}

#[test]
fn bos_and_eos_added_by_hand_become_the_exported_post_processor() {
    let file = tokenmill_gguf::GgufFile::open(&model_path()).unwrap();
    let mut vocab = GgufVocab::from_gguf(&file).unwrap();
    vocab.add_bos_token = Some(true);
    vocab.add_eos_token = Some(true);
    let tokenizer = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    let ids = tokenizer.encode("Hello", true).unwrap();
    assert_eq!(ids.first().copied(), tokenizer.bos_token_id());
    assert_eq!(ids.last().copied(), tokenizer.eos_token_id());
    assert_round_trip(&tokenizer, "BOS and EOS");
}
