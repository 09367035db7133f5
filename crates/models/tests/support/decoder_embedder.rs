//! The formula-weight decoders of `scripts/reference/make_decoder_embedding_fixtures.py`,
//! written as HF directories: config.json, model.safetensors (the Qwen3 one as a bare
//! `Qwen3Model`, as Qwen3-Embedding ships) and a word-level tokenizer.json whose token `w{i}`
//! is id `i` (the Qwen3 one's post-processor appends `<|endoftext|>`, id 127, as
//! Qwen3-Embedding's does), plus sentence-transformers' last-token pooling modules for the
//! Qwen3 one. `#[path]`-included by the tests that use it.

use std::path::Path;

use serde_json::{json, Value};

#[path = "formula_safetensors.rs"]
mod formula_safetensors;

/// The fixture: per model its config, tensor shapes and transformers' pooled vectors.
#[allow(clippy::unwrap_used)]
pub fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/decoder_embeddings.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture's model named `name` (`qwen3` or `llama`).
#[allow(clippy::unwrap_used)]
pub fn model(name: &str) -> Value {
    fixture()["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap()
        .clone()
}

/// The script's `decoder_weight`: a sine of the element index with a per-name phase.
#[allow(clippy::unwrap_used)]
pub fn decoder_weight(name: &str, shape: &[usize]) -> Vec<f32> {
    let count: usize = shape.iter().product();
    let phase = name.chars().map(|c| c as u64).sum::<u64>() % 97;
    let last = *shape.last().unwrap() as f64;
    (0..count)
        .map(|i| {
            let v = (i as f64 * 0.731 + phase as f64 * 0.1).sin();
            let v = if name.ends_with("norm.weight") {
                1.0 + 0.1 * v
            } else {
                v * (1.0 / last.sqrt())
            };
            v as f32
        })
        .collect()
}

/// Writes `model` (an entry of the fixture's `models`) and its tokenizer into `dir`.
#[allow(clippy::unwrap_used)]
pub fn write_checkpoint(model: &Value, dir: &Path) {
    std::fs::write(dir.join("config.json"), model["config"].to_string()).unwrap();
    formula_safetensors::write_safetensors(&model["tensors"], dir, decoder_weight);
    let qwen3 = model["name"] == "qwen3";
    let vocab_size = model["config"]["vocab_size"].as_u64().unwrap() as usize;
    let eos = "<|endoftext|>";
    let mut vocab = serde_json::Map::new();
    for id in 0..vocab_size {
        let token = if qwen3 && id == vocab_size - 1 {
            eos.to_string()
        } else {
            format!("w{id}")
        };
        vocab.insert(token, json!(id));
    }
    let mut tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    });
    if qwen3 {
        let id = vocab_size - 1;
        tokenizer["added_tokens"] = json!([{"id": id, "content": eos, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}]);
        tokenizer["post_processor"] = json!({"type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": eos, "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": eos, "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": eos, "type_id": 1}}],
            "special_tokens": {eos: {"id": eos, "ids": [id], "tokens": [eos]}}});
        std::fs::write(
            dir.join("modules.json"),
            json!([
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
            ])
            .to_string(),
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        std::fs::write(
            dir.join("1_Pooling/config.json"),
            json!({"word_embedding_dimension": model["config"]["hidden_size"],
                   "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": false,
                   "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false,
                   "pooling_mode_weightedmean_tokens": false, "pooling_mode_lasttoken": true,
                   "include_prompt": true})
            .to_string(),
        )
        .unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// An item's ids as a text of `w{i}` words (the Qwen3 tokenizer appends the final EOS
/// itself, so it is left out there).
#[allow(clippy::unwrap_used)]
pub fn text_of(ids: &[u32], qwen3: bool) -> String {
    let body = if qwen3 { &ids[..ids.len() - 1] } else { ids };
    body.iter()
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}
