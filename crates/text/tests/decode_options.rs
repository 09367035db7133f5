//! On the default model's byte-level tokenizer: `spaces_between_special_tokens` never changes
//! the text, and `bad_words` tokenize as vLLM's `update_from_tokenizer` does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::default_tokenizer;
use tokenmill_text::DecodeOptions;

#[test]
fn byte_level_text_is_the_same_with_or_without_spaces_between_special_tokens() {
    let tokenizer = default_tokenizer();
    let ids = tokenizer
        .encode(
            "<|im_start|>user\nHi there<|im_end|> <|im_start|>assistant\n Hello!<|im_end|>",
            false,
        )
        .unwrap();
    assert!(ids.iter().filter(|&&id| tokenizer.is_special(id)).count() >= 4);
    for skip_special_tokens in [true, false] {
        let decode = |spaces_between_special_tokens| {
            let options = DecodeOptions {
                skip_special_tokens,
                spaces_between_special_tokens,
            };
            tokenizer.decode_with(&ids, options).unwrap()
        };
        assert_eq!(decode(true), decode(false));
        assert_eq!(
            decode(true),
            tokenizer.decode(&ids, skip_special_tokens).unwrap()
        );
    }
}

#[test]
fn bad_words_are_tokenized_plain_and_after_a_space() {
    let tokenizer = default_tokenizer();
    let words = vec!["Paris".to_string(), "  hello world".to_string()];
    let sequences = tokenizer.bad_words_token_ids(&words).unwrap();
    let paris = tokenizer.encode("Paris", false).unwrap();
    let spaced_paris = tokenizer.encode(" Paris", false).unwrap();
    let hello = tokenizer.encode("hello world", false).unwrap();
    let spaced_hello = tokenizer.encode(" hello world", false).unwrap();
    assert_ne!(paris[0], spaced_paris[0]);
    assert_eq!(hello.len(), spaced_hello.len());
    // Leading whitespace is trimmed before tokenizing; both variants of both words are kept.
    assert_eq!(sequences, vec![paris, spaced_paris, hello, spaced_hello]);
    // A variant that tokenizes into a different number of tokens is dropped (vLLM's rule).
    let plain = tokenizer.encode("(((", false).unwrap();
    let spaced = tokenizer.encode(" (((", false).unwrap();
    let sequences = tokenizer.bad_words_token_ids(&["(((".to_string()]).unwrap();
    if plain.len() == spaced.len() && plain[0] != spaced[0] {
        assert_eq!(sequences, vec![plain, spaced]);
    } else {
        assert_eq!(sequences, vec![plain]);
    }
}
