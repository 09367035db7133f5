//! Structured-output masks against the default model's real tokenizer: a choice allows
//! exactly the tokens that keep the text a prefix of one of its strings, control tokens are
//! never free text, and EOS comes only where the grammar may end.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Instant;

use common::model_path;
use tokenmill_engine::{grammar_vocabulary, LoadedModel};
use tokenmill_models::{GrammarCompiler, History, LogitsProcessor, ModelSource, StructuredOutput};

#[test]
fn masks_on_the_real_tokenizer_allow_exactly_the_valid_prefixes() {
    let loaded =
        LoadedModel::load(&ModelSource::from_path(model_path()), None, None, Some(1)).unwrap();
    let tokenizer = &loaded.tokenizer;
    let vocabulary = grammar_vocabulary(tokenizer);
    let started = Instant::now();
    let compiler = GrammarCompiler::new(&vocabulary).unwrap();
    eprintln!(
        "token trie + parser factory for {} tokens: {:?}",
        vocabulary.pieces.len(),
        started.elapsed()
    );
    let eos = tokenizer.eos_token_ids();

    // Choice ["yes", "no"]: every token whose bytes start "yes" or "no", nothing else.
    let mut matcher = compiler
        .compile(&StructuredOutput::Choice(vec!["yes".into(), "no".into()]))
        .unwrap();
    let expected: Vec<u32> = (0..tokenizer.vocab_size() as u32)
        .filter(|&id| {
            let piece = &vocabulary.pieces[id as usize];
            !tokenizer.is_special(id)
                && !piece.is_empty()
                && (b"yes".starts_with(piece) || b"no".starts_with(piece))
        })
        .collect();
    assert!(expected.len() >= 4, "{expected:?}");
    assert_eq!(matcher.allowed_tokens().unwrap(), expected);

    // After "y": only what completes "yes".
    let y = tokenizer.encode("y", false).unwrap();
    assert_eq!(y.len(), 1);
    matcher.accept(y[0]).unwrap();
    let expected: Vec<u32> = (0..tokenizer.vocab_size() as u32)
        .filter(|&id| {
            let piece = &vocabulary.pieces[id as usize];
            !tokenizer.is_special(id) && !piece.is_empty() && b"es".starts_with(piece)
        })
        .collect();
    assert_eq!(matcher.allowed_tokens().unwrap(), expected);
    matcher
        .accept(tokenizer.encode("es", false).unwrap()[0])
        .unwrap();
    // Ended: EOS only, and `apply` leaves nothing else pickable in a model-sized row.
    assert!(matcher.is_finished());
    let mut row = vec![0.0f32; loaded.config().vocab_size];
    matcher.apply(&mut row, &History::default()).unwrap();
    let pickable: Vec<u32> = (0..row.len() as u32)
        .filter(|&id| row[id as usize].is_finite())
        .collect();
    assert!(
        !pickable.is_empty() && pickable.iter().all(|id| eos.contains(id)),
        "{pickable:?}"
    );

    // Free text: every non-empty text token, no control token (EOS only as the end).
    let mut free = compiler
        .compile(&StructuredOutput::Regex("(?s:.)*".into()))
        .unwrap();
    let allowed = free.allowed_tokens().unwrap();
    for id in 0..tokenizer.vocab_size() as u32 {
        let text = !tokenizer.is_special(id) && !vocabulary.pieces[id as usize].is_empty();
        let valid_utf8_start = std::str::from_utf8(&vocabulary.pieces[id as usize]).is_ok();
        if tokenizer.is_special(id) {
            assert_eq!(
                allowed.contains(&id),
                eos.contains(&id),
                "control token {id}"
            );
        } else if text && valid_utf8_start {
            assert!(allowed.contains(&id), "text token {id}");
        }
    }
}
