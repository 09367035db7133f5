//! The formula-weight `BertForSequenceClassification` of
//! `scripts/reference/make_embedding_fixtures.py`, written as an HF directory (config.json,
//! model.safetensors and a WordPiece tokenizer.json whose token `w{i}` is id `i`, so a text
//! of such words tokenizes to chosen ids). Shared by the models and server tests
//! (`#[path]`-included).

use std::path::Path;

use serde_json::{json, Value};

#[path = "formula_safetensors.rs"]
mod formula_safetensors;

/// The fixture: config, tensor shapes and transformers' logits for token-id pairs.
#[allow(clippy::unwrap_used)]
pub fn fixture() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/cross_encoder.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The script's `formula_weight`: a sine of the element index with a per-name phase.
#[allow(clippy::unwrap_used)]
pub fn formula_weight(name: &str, shape: &[usize]) -> Vec<f32> {
    let count: usize = shape.iter().product();
    let phase = name.chars().map(|c| c as u64).sum::<u64>() % 97;
    let last = *shape.last().unwrap() as f64;
    (0..count)
        .map(|i| {
            let v = (i as f64 * 0.731 + phase as f64 * 0.1).sin();
            let v = if name.ends_with("LayerNorm.weight") {
                1.0 + 0.1 * v
            } else if name.ends_with("bias") {
                0.05 * v
            } else {
                v * (1.0 / last.sqrt())
            };
            v as f32
        })
        .collect()
}

/// Writes the checkpoint and its tokenizer into `dir`.
#[allow(clippy::unwrap_used)]
pub fn write_checkpoint(dir: &Path) {
    let data = fixture();
    std::fs::write(dir.join("config.json"), data["config"].to_string()).unwrap();
    formula_safetensors::write_safetensors(&data["tensors"], dir, formula_weight);
    let vocab_size = data["config"]["vocab_size"].as_u64().unwrap() as usize;
    let specials = ["[PAD]", "[CLS]", "[SEP]"];
    let mut vocab = serde_json::Map::new();
    for id in 0..vocab_size {
        let token = specials
            .get(id)
            .map_or_else(|| format!("w{id}"), |s| s.to_string());
        vocab.insert(token, json!(id));
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let special = |name: &str, id: usize| json!({"id": name, "ids": [id], "tokens": [name]});
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true,
                       "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": special("[CLS]", 1), "[SEP]": special("[SEP]", 2)}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[PAD]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// The fixture's pairs as texts of `w{i}` words: (text_1, text_2, transformers' logit).
#[allow(clippy::unwrap_used)]
pub fn text_pairs() -> Vec<(String, String, f64)> {
    let data = fixture();
    data["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            let ids: Vec<u64> = item["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let types: Vec<u64> = item["type_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let split = types.iter().position(|&t| t == 1).unwrap();
            // [CLS] a… [SEP] | b… [SEP]
            let words = |ids: &[u64]| {
                ids.iter()
                    .map(|i| format!("w{i}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            (
                words(&ids[1..split - 1]),
                words(&ids[split..ids.len() - 1]),
                item["logits"][0].as_f64().unwrap(),
            )
        })
        .collect()
}
