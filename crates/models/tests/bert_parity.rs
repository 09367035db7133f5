//! BERT encoders against sentence-transformers and transformers
//! (`scripts/reference/make_embedding_fixtures.py` wrote the fixtures):
//!
//! - all-MiniLM-L6-v2 (real weights, `scripts/fetch-minilm.sh`; skipped when absent): the
//!   tokenizer's ids equal HF's, every embedding's cosine with sentence-transformers' is
//!   ≥ 0.9999 and both are unit vectors; a text's vector is bitwise the same alone and
//!   batched with 63 others of other lengths.
//! - a formula-weight `BertForSequenceClassification` (written here, as the script wrote
//!   it for transformers): its logits equal transformers' within 1e-4.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::Value;
use tokenmill_models::{
    l2_normalize, load_pooling_model, load_pooling_model_with, EncoderBatch, EncoderPrecision,
    EncoderWorkspace, ModelDtype, ModelSource, PoolingMethod, PoolingModel, PoolingOptions,
    PoolingTask, ThreadPool,
};
use tokenmill_text::Tokenizer;

#[path = "support/cross_encoder.rs"]
mod cross_encoder;

#[allow(clippy::unwrap_used)]
fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// all-MiniLM-L6-v2's directory (`$TOKENMILL_MINILM_MODEL`, else the model cache).
fn minilm_dir() -> Option<PathBuf> {
    tokenmill_test_assets::MINILM.or_skip("bert_parity (all-MiniLM-L6-v2)")
}

#[allow(clippy::unwrap_used)]
fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[allow(clippy::unwrap_used)]
fn f16_vector(encoded: &str) -> Vec<f32> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    bytes
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Pools `sequences` in one batch; one row per sequence.
#[allow(clippy::unwrap_used)]
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

#[test]
fn minilm_matches_sentence_transformers() {
    let Some(dir) = minilm_dir() else { return };
    let data = fixture("minilm_embeddings.json");
    let model = load_pooling_model(&ModelSource::HfDirectory(dir.clone())).unwrap();
    let info = model.info();
    assert_eq!(info.task, PoolingTask::Embed);
    assert_eq!(info.method, PoolingMethod::Mean);
    assert!(info.normalize, "modules.json has a Normalize module");
    assert_eq!(
        info.max_model_len,
        data["max_seq_length"].as_u64().unwrap() as usize
    );
    assert_eq!(
        info.output_dim,
        data["dimension"].as_u64().unwrap() as usize
    );
    let tokenizer = Tokenizer::from_hf_dir(&dir).unwrap();
    let items = data["items"].as_array().unwrap();
    assert!(items.len() >= 50);
    let sequences: Vec<Vec<u32>> = items.iter().map(|item| ids(&item["ids"])).collect();
    for (item, expected) in items.iter().zip(&sequences) {
        let text = item["text"].as_str().unwrap();
        if expected.len() < info.max_model_len {
            assert_eq!(&tokenizer.encode(text, true).unwrap(), expected, "{text:?}");
        }
        // transformers' truncation (`truncate_prompt_tokens`): first tokens, [SEP] kept.
        let (truncated, _) = tokenizer
            .encode_for_pooling(text, None, true, Some(info.max_model_len))
            .unwrap();
        assert_eq!(&truncated, expected, "{text:?}");
    }
    let pool = ThreadPool::new(2);
    let mut vectors = Vec::new();
    for chunk in sequences.chunks(8) {
        vectors.extend(run(model.as_ref(), &pool, chunk));
    }
    for (item, mut vector) in items.iter().zip(vectors) {
        l2_normalize(&mut vector);
        let reference = f16_vector(item["embedding_f16"].as_str().unwrap());
        let similarity = cosine(&vector, &reference);
        let text = item["text"].as_str().unwrap();
        assert!(similarity >= 0.9999, "cosine {similarity} for {text:?}");
        let norm: f64 = vector
            .iter()
            .map(|&x| (x as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let reference_norm = item["norm"].as_f64().unwrap();
        assert!((norm - 1.0).abs() < 1e-5 && (reference_norm - 1.0).abs() < 1e-5);
    }
}

/// all-MiniLM-L6-v2 under `dtype` against sentence-transformers' f32 vectors: every cosine
/// ≥ 0.9999 (the bar) and the mean ≥ `mean_bar`; the vectors differ from the
/// `--dtype float32` path's (so the flag is not ignored) and a text's vector is the same alone
/// and batched. Returns (worst, mean) cosine.
#[allow(clippy::unwrap_used)]
fn check_minilm_dtype(dir: PathBuf, dtype: ModelDtype, mean_bar: f64) -> (f64, f64) {
    let data = fixture("minilm_embeddings.json");
    let source = ModelSource::HfDirectory(dir);
    let with = |dtype| {
        let options = PoolingOptions {
            dtype,
            ..PoolingOptions::default()
        };
        load_pooling_model_with(&source, &options).unwrap()
    };
    let (model, f32_model) = (with(dtype), with(ModelDtype::Float32));
    let items = data["items"].as_array().unwrap();
    let sequences: Vec<Vec<u32>> = items.iter().map(|item| ids(&item["ids"])).collect();
    let pool = ThreadPool::new(2);
    let vectors = run(model.as_ref(), &pool, &sequences);
    let f32_vectors = run(f32_model.as_ref(), &pool, &sequences);
    let (mut worst, mut sum) = (f64::MAX, 0.0);
    for (item, mut vector) in items.iter().zip(vectors.clone()) {
        l2_normalize(&mut vector);
        let reference = f16_vector(item["embedding_f16"].as_str().unwrap());
        let similarity = cosine(&vector, &reference);
        let text = item["text"].as_str().unwrap();
        assert!(
            similarity >= 0.9999,
            "{dtype:?}: cosine {similarity} for {text:?}"
        );
        worst = worst.min(similarity);
        sum += similarity;
    }
    let mean = sum / items.len() as f64;
    eprintln!(
        "{dtype:?} vs sentence-transformers f32 over {} texts: worst cosine {worst:.6}, mean {mean:.6}",
        items.len()
    );
    assert!(mean >= mean_bar, "{dtype:?}: mean cosine {mean}");
    assert_ne!(vectors, f32_vectors, "--dtype {dtype:?} changed nothing");
    for target in [0, sequences.len() - 1] {
        let alone = run(
            model.as_ref(),
            &ThreadPool::new(1),
            &sequences[target..=target],
        );
        assert_eq!(alone[0], vectors[target], "text {target} alone vs batched");
    }
    (worst, mean)
}

/// `--dtype bfloat16` (linear layers in bf16, f32 accumulation): measured worst 0.999963,
/// mean 0.999987; the bf16 kernels' results do not depend on the host, so neither do these.
#[test]
fn minilm_bf16_stays_close_to_sentence_transformers() {
    let Some(dir) = minilm_dir() else { return };
    check_minilm_dtype(dir, ModelDtype::BFloat16, 0.99995);
}

/// `--dtype auto` on a CPU with AMX: the linear layers as int8 pairs (15-bit fixed point),
/// much closer to sentence-transformers' vectors than bf16 (measured: worst cosine 0.999997,
/// mean 0.999999; integer sums, so the same on every AMX host).
#[test]
fn minilm_int8_pairs_stay_close_to_sentence_transformers() {
    let Some(dir) = minilm_dir() else { return };
    if EncoderPrecision::for_dtype(ModelDtype::Auto) != EncoderPrecision::Int8Pair {
        eprintln!("skipped: int8-pair encoder GEMM (no usable AMX here; --dtype auto is f32)");
        return;
    }
    let (worst, _) = check_minilm_dtype(dir, ModelDtype::Auto, 0.999995);
    assert!(worst >= 0.99999, "worst cosine {worst}");
}

#[test]
fn minilm_vector_is_the_same_alone_and_in_a_batch_of_64() {
    let Some(dir) = minilm_dir() else { return };
    let data = fixture("minilm_embeddings.json");
    let model = load_pooling_model(&ModelSource::HfDirectory(dir)).unwrap();
    let items = data["items"].as_array().unwrap();
    let mut sequences: Vec<Vec<u32>> = items.iter().map(|item| ids(&item["ids"])).collect();
    while sequences.len() < 64 {
        // Other lengths again: prefixes of the longer texts, closed by their [SEP].
        let source = &sequences[sequences.len() % items.len()];
        let cut = (source.len() / 2).max(2);
        let mut shorter = source[..cut].to_vec();
        shorter.push(*source.last().unwrap());
        sequences.push(shorter);
    }
    let target = 3;
    let batched = run(model.as_ref(), &ThreadPool::new(2), &sequences);
    let alone = run(
        model.as_ref(),
        &ThreadPool::new(1),
        &sequences[target..=target],
    );
    assert_eq!(alone[0], batched[target]);
    let alone_last = run(model.as_ref(), &ThreadPool::new(2), &sequences[63..]);
    assert_eq!(alone_last[0], batched[63]);
}

#[test]
fn cross_encoder_matches_transformers() {
    let data = fixture("cross_encoder.json");
    let dir = tempfile::tempdir().unwrap();
    cross_encoder::write_checkpoint(dir.path());
    let model = load_pooling_model(&ModelSource::HfDirectory(dir.path().to_path_buf())).unwrap();
    assert_eq!(model.info().task, PoolingTask::Classify);
    assert_eq!(model.info().output_dim, 1);
    let items = data["items"].as_array().unwrap();
    let mut batch = EncoderBatch::default();
    for item in items {
        batch
            .add_sequence(&ids(&item["ids"]), Some(&ids(&item["type_ids"])))
            .unwrap();
    }
    let mut out = Vec::new();
    model
        .pool(
            &ThreadPool::new(2),
            &batch,
            &mut EncoderWorkspace::new(),
            &mut out,
        )
        .unwrap();
    // The written tokenizer joins the pairs' texts back into the fixture's ids and types.
    let tokenizer = Tokenizer::from_hf_dir(dir.path()).unwrap();
    for ((first, second, _), item) in cross_encoder::text_pairs().iter().zip(items) {
        let (ids_got, types_got) = tokenizer
            .encode_for_pooling(first, Some(second), true, None)
            .unwrap();
        assert_eq!(ids_got, ids(&item["ids"]));
        assert_eq!(types_got, ids(&item["type_ids"]));
    }
    for (item, &got) in items.iter().zip(&out) {
        let want = item["logits"][0].as_f64().unwrap();
        assert!((got as f64 - want).abs() < 1e-4, "{got} vs {want}");
    }
}

/// The GGUF of all-MiniLM-L6-v2 (`scripts/make-minilm-gguf.sh`, llama.cpp's converter):
/// `$TOKENMILL_MINILM_GGUF`, else next to the model in the cache.
fn minilm_gguf() -> Option<PathBuf> {
    tokenmill_test_assets::MINILM_GGUF.or_skip("minilm_gguf_matches_sentence_transformers")
}

/// The GGUF's tokenizer (WordPiece rebuilt from the phantom-space vocabulary) gives HF's ids,
/// and its model sentence-transformers' vectors, truncated to sentence-transformers' 256.
#[test]
#[allow(clippy::unwrap_used)]
fn minilm_gguf_matches_sentence_transformers() {
    let Some(path) = minilm_gguf() else { return };
    let data = fixture("minilm_embeddings.json");
    let source = ModelSource::Gguf(path.clone());
    assert!(tokenmill_models::is_pooling_model(&source));
    let model = load_pooling_model(&source).unwrap();
    let info = model.info();
    assert_eq!(info.method, PoolingMethod::Mean, "bert.pooling_type 1");
    assert!(info.normalize);
    let file = tokenmill_gguf::GgufFile::open(&path).unwrap();
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    let max_len = data["max_seq_length"].as_u64().unwrap() as usize;
    let items = data["items"].as_array().unwrap();
    let pool = ThreadPool::new(2);
    for item in items {
        let text = item["text"].as_str().unwrap();
        let (ids_gguf, _) = tokenizer
            .encode_for_pooling(text, None, true, Some(max_len))
            .unwrap();
        assert_eq!(ids_gguf, ids(&item["ids"]), "{text:?}");
        let mut vector = run(model.as_ref(), &pool, &[ids_gguf]).remove(0);
        l2_normalize(&mut vector);
        let reference = f16_vector(item["embedding_f16"].as_str().unwrap());
        let similarity = cosine(&vector, &reference);
        assert!(similarity >= 0.9999, "cosine {similarity} for {text:?}");
    }
}
