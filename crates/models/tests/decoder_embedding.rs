//! Decoders as embedders (`--convert embed`, Qwen3-Embedding's recipe) against transformers:
//! `fixtures/decoder_embeddings.json` (`scripts/reference/make_decoder_embedding_fixtures.py`,
//! versions in the fixture) holds transformers' last-token, mean and first-token pooled,
//! normalized final hidden states of two formula-weight decoders, which
//! `support/decoder_embedder.rs` writes again as HF directories: a Qwen3 saved as the bare
//! `Qwen3Model` with sentence-transformers' last-token modules and an EOS-appending
//! tokenizer (as Qwen3-Embedding), and a Llama `*ForCausalLM` with an untied head and no
//! modules (vLLM's defaults).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/decoder_embedder.rs"]
mod decoder_embedder;

use serde_json::Value;
use tokenmill_models::{
    l2_normalize, load_pooling_model, load_pooling_model_with, ConvertOption, EncoderBatch,
    EncoderWorkspace, ModelSource, PoolerConfig, PoolingMethod, PoolingModel, PoolingOptions,
    PoolingTask, ThreadPool,
};
use tokenmill_text::Tokenizer;

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Pools `sequences` in one batch; one raw row per sequence.
fn run(model: &dyn PoolingModel, pool: &ThreadPool, sequences: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let mut batch = EncoderBatch::default();
    for ids in sequences {
        batch.add_sequence(ids, None).unwrap();
    }
    let mut out = Vec::new();
    model
        .pool(pool, &batch, &mut EncoderWorkspace::new(), &mut out)
        .unwrap();
    out.chunks(model.info().output_dim)
        .map(<[f32]>::to_vec)
        .collect()
}

fn with_pooling(method: &str) -> PoolingOptions {
    PoolingOptions {
        convert: ConvertOption::Embed,
        pooler: PoolerConfig::from_json(&format!("{{\"pooling_type\": \"{method}\"}}")).unwrap(),
        ..PoolingOptions::default()
    }
}

/// Every item's vector, batched, against transformers' `key` vectors: cosine ≥ 0.9999.
fn check(model: &dyn PoolingModel, items: &[Value], key: &str, label: &str) {
    let sequences: Vec<Vec<u32>> = items.iter().map(|item| ids(&item["ids"])).collect();
    let rows = run(model, &ThreadPool::new(2), &sequences);
    let mut worst_cosine: f64 = 1.0;
    let mut max_diff: f32 = 0.0;
    for (item, mut row) in items.iter().zip(rows) {
        l2_normalize(&mut row);
        let want = floats(&item[key]);
        let similarity = cosine(&row, &want);
        assert!(
            similarity >= 0.9999,
            "{label} {key} {:?}: cosine {similarity}",
            item["ids"]
        );
        worst_cosine = worst_cosine.min(similarity);
        for (a, b) in row.iter().zip(&want) {
            max_diff = max_diff.max((a - b).abs());
        }
    }
    eprintln!("{label} {key}: worst cosine {worst_cosine:.9}, max |diff| {max_diff:e}");
}

fn write(name: &str) -> (tempfile::TempDir, Value) {
    let model = decoder_embedder::model(name);
    let dir = tempfile::tempdir().unwrap();
    decoder_embedder::write_checkpoint(&model, dir.path());
    (dir, model)
}

#[test]
fn qwen3_embedder_matches_transformers() {
    let (dir, data) = write("qwen3");
    let source = ModelSource::HfDirectory(dir.path().to_path_buf());
    assert!(
        !tokenmill_models::is_pooling_model(&source),
        "a *ForCausalLM is served by the generate runner unless asked"
    );
    let model = load_pooling_model(&source).unwrap();
    let info = model.info();
    assert_eq!(info.task, PoolingTask::Embed);
    assert_eq!(info.method, PoolingMethod::Last, "modules.json: lasttoken");
    assert!(info.normalize, "modules.json: Normalize");
    assert_eq!(info.output_dim, 64);
    assert_eq!(info.max_model_len, 512);
    assert_eq!(info.architecture, "Qwen3ForCausalLM (as embedder)");
    let items = data["items"].as_array().unwrap();
    check(model.as_ref(), items, "last", "qwen3");
    for (method, key) in [("MEAN", "mean"), ("CLS", "cls")] {
        let model = load_pooling_model_with(&source, &with_pooling(method)).unwrap();
        check(model.as_ref(), items, key, "qwen3");
    }
    // The tokenizer appends <|endoftext|>, as Qwen3-Embedding's: the fixture's ids (whose
    // last token is the EOS) come back from the texts.
    let tokenizer = Tokenizer::from_hf_dir(dir.path()).unwrap();
    for item in items {
        let want = ids(&item["ids"]);
        let text = decoder_embedder::text_of(&want, true);
        let (got, _) = tokenizer
            .encode_for_pooling(&text, None, true, None)
            .unwrap();
        assert_eq!(got, want, "{text:?}");
    }
    let (cut, _) = tokenizer
        .encode_for_pooling("w5 w9 w3", None, true, Some(2))
        .unwrap();
    assert_eq!(cut, [5, 127], "truncation keeps room for the EOS");
}

#[test]
fn llama_embedder_matches_transformers() {
    let (dir, data) = write("llama");
    let source = ModelSource::HfDirectory(dir.path().to_path_buf());
    let model = load_pooling_model(&source).unwrap();
    let info = model.info();
    assert_eq!(
        (info.method, info.normalize),
        (PoolingMethod::Last, true),
        "vLLM's defaults for a converted decoder"
    );
    let items = data["items"].as_array().unwrap();
    check(model.as_ref(), items, "last", "llama");
    let model = load_pooling_model_with(&source, &with_pooling("MEAN")).unwrap();
    assert_eq!(model.info().method, PoolingMethod::Mean);
    check(model.as_ref(), items, "mean", "llama");
    let unnormalized = load_pooling_model_with(
        &source,
        &PoolingOptions {
            convert: ConvertOption::Auto,
            pooler: PoolerConfig::from_json(r#"{"normalize": false}"#).unwrap(),
            ..PoolingOptions::default()
        },
    )
    .unwrap();
    assert!(!unnormalized.info().normalize);
}

/// A text's vector does not depend on what it is batched with, on the batch's size or on the
/// pool's thread count: bitwise.
#[test]
fn decoder_embeddings_are_batch_invariant() {
    let (dir, data) = write("qwen3");
    let model = load_pooling_model(&ModelSource::HfDirectory(dir.path().to_path_buf())).unwrap();
    let mut sequences: Vec<Vec<u32>> = data["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| ids(&item["ids"]))
        .collect();
    // 64 sequences of other lengths around them.
    let mut next = 7u32;
    while sequences.len() < 64 {
        let len = 1 + (next as usize * 13) % 37;
        sequences.push((0..len as u32).map(|i| 3 + (next + i * 5) % 120).collect());
        next += 1;
    }
    let batched = run(model.as_ref(), &ThreadPool::new(2), &sequences);
    for target in [0, 3, 7, 63] {
        let alone = run(
            model.as_ref(),
            &ThreadPool::new(1),
            &sequences[target..=target],
        );
        assert_eq!(alone[0], batched[target], "sequence {target}");
    }
    // A workspace reused across steps of other sizes gives the same rows.
    let mut workspace = EncoderWorkspace::new();
    let pool = ThreadPool::new(2);
    for take in [64, 5, 33] {
        let mut batch = EncoderBatch::default();
        for ids in &sequences[..take] {
            batch.add_sequence(ids, None).unwrap();
        }
        let mut out = Vec::new();
        model.pool(&pool, &batch, &mut workspace, &mut out).unwrap();
        assert_eq!(out[..64], batched[0][..]);
        assert_eq!(out[64 * (take - 1)..], batched[take - 1][..]);
    }
}

#[test]
fn convert_none_and_classify_options_are_refused() {
    let (dir, _) = write("llama");
    let source = ModelSource::HfDirectory(dir.path().to_path_buf());
    let none = PoolingOptions {
        convert: ConvertOption::None,
        pooler: PoolerConfig::default(),
        ..PoolingOptions::default()
    };
    let error = load_pooling_model_with(&source, &none)
        .unwrap_err()
        .to_string();
    assert!(error.contains("--convert none"), "{error}");
    // A pair's second text (token type 1) is a cross-encoder's input, not an embedder's.
    let model = load_pooling_model(&source).unwrap();
    let mut batch = EncoderBatch::default();
    batch.add_sequence(&[5, 6, 7], Some(&[0, 1, 1])).unwrap();
    let error = model
        .pool(
            &ThreadPool::new(1),
            &batch,
            &mut EncoderWorkspace::new(),
            &mut Vec::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(error.contains("token-type"), "{error}");
}
