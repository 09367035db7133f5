//! A random-weight tiny model, written by the test in each supported container, loads and
//! matches a naive contiguous-KV reference forward pass: this pins the loaders (names, shapes,
//! dtypes, tied heads, RoPE style per source) and the paged-attention plumbing (block tables,
//! slot mapping, chunked prefill, mixed prefill/decode batches).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::test_pool;
use common::tiny::{TinyConfig, TinyModel};
use tokenmill_models::{
    kv_layout, load_model, resolve_model, BatchInput, CausalLm, KvCacheDType, KvCacheStorage,
    LlamaModel, LoadOptions, ModelSource, RopeStyle, Workspace,
};

const TOLERANCE: f32 = 2e-4;
const PROMPT: [u32; 13] = [5, 17, 3, 88, 42, 42, 7, 0, 95, 61, 23, 9, 30];

fn options() -> LoadOptions {
    LoadOptions {
        dequantize_to_f32: false,
        ..LoadOptions::default()
    }
}

fn assert_close(actual: &[f32], expected: &[f32], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    let worst = actual
        .iter()
        .zip(expected)
        .map(|(a, e)| (a - e).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= TOLERANCE,
        "{what}: max |diff| {worst} > {TOLERANCE}"
    );
}

/// Logits of every prompt position from one forward over a scattered block table.
fn paged_prefill_logits(model: &dyn CausalLm, tokens: &[u32], block_size: usize) -> Vec<Vec<f32>> {
    let blocks = tokens.len().div_ceil(block_size);
    // Blocks deliberately out of order and not starting at 0.
    let block_table: Vec<u32> = (0..blocks as u32)
        .map(|b| 2 * (blocks as u32 - b) + 1)
        .collect();
    let mut kv = KvCacheStorage::new(model.kv_layout(), 2 * blocks + 2, block_size);
    let mut batch = BatchInput::default();
    batch
        .add_sequence(tokens, 0, &block_table, block_size, false)
        .unwrap();
    batch.logits_indices = (0..tokens.len() as u32).collect();
    let mut logits = Vec::new();
    model
        .forward(
            &test_pool(),
            &batch,
            &mut kv,
            &mut Workspace::new(),
            &mut logits,
        )
        .unwrap();
    logits
        .chunks_exact(model.config().vocab_size)
        .map(<[f32]>::to_vec)
        .collect()
}

/// Logits of every position when the prompt is fed as a 4-token prefill, then a 3-token chunk,
/// then one token per step, while a second sequence shares every batch.
fn paged_incremental_logits(model: &LlamaModel, tokens: &[u32]) -> Vec<Vec<f32>> {
    let block_size = 4;
    let vocab = model.config().vocab_size;
    let mut kv = KvCacheStorage::new(model.kv_layout(), 16, block_size);
    let table_a = [9u32, 2, 14, 5];
    let table_b = [0u32, 7, 11, 3];
    let companion: Vec<u32> = (0..tokens.len() as u32)
        .map(|i| (i * 7 + 3) % vocab as u32)
        .collect();
    let pool = test_pool();
    let mut workspace = Workspace::new();
    let mut logits = Vec::new();
    let mut batch = BatchInput::default();
    let mut collected = Vec::new();
    let mut start = 0;
    let steps: Vec<usize> = [4, 3]
        .into_iter()
        .chain(std::iter::repeat_n(1, tokens.len() - 7))
        .collect();
    for (step, &count) in steps.iter().enumerate() {
        batch.clear();
        // The companion sequence decodes one token per step (after a 2-token start), placed
        // first so this sequence's rows do not start at 0.
        let companion_count = if step == 0 { 2 } else { 1 };
        let companion_start = if step == 0 { 0 } else { step + 1 };
        batch
            .add_sequence(
                &companion[companion_start..companion_start + companion_count],
                companion_start,
                &table_b,
                block_size,
                true,
            )
            .unwrap();
        let first_row = batch.num_tokens() as u32;
        batch
            .add_sequence(
                &tokens[start..start + count],
                start,
                &table_a,
                block_size,
                false,
            )
            .unwrap();
        batch
            .logits_indices
            .extend(first_row..first_row + count as u32);
        model
            .forward(&pool, &batch, &mut kv, &mut workspace, &mut logits)
            .unwrap();
        // Row 0 belongs to the companion; the rest are this sequence's positions.
        for row in 1..=count {
            collected.push(logits[row * vocab..(row + 1) * vocab].to_vec());
        }
        start += count;
    }
    collected
}

fn check_model(model: &LlamaModel, reference: &TinyModel, what: &str) {
    let expected = reference.reference_logits(&PROMPT);
    for block_size in [1, 4, 16] {
        let actual = paged_prefill_logits(model, &PROMPT, block_size);
        for (position, (a, e)) in actual.iter().zip(&expected).enumerate() {
            assert_close(
                a,
                e,
                &format!("{what}, block size {block_size}, position {position}"),
            );
        }
    }
    let incremental = paged_incremental_logits(model, &PROMPT);
    assert_eq!(incremental.len(), PROMPT.len());
    for (position, (a, e)) in incremental.iter().zip(&expected).enumerate() {
        assert_close(a, e, &format!("{what}, incremental, position {position}"));
    }
}

fn load(source: &ModelSource) -> LlamaModel {
    LlamaModel::load(source, &options()).unwrap()
}

#[test]
fn hf_directory_f32_matches_reference() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = TinyModel::random(TinyConfig::llama(), 1);
    tiny.write_hf_directory(dir.path(), "F32", 1);
    let source = resolve_model(dir.path().to_str()).unwrap();
    assert_eq!(source, ModelSource::HfDirectory(dir.path().to_path_buf()));
    let model = load(&source);
    assert_eq!(model.config().architecture, "llama");
    assert_eq!(model.config().rope_style, RopeStyle::Neox);
    assert!(!model.config().tie_word_embeddings);
    check_model(&model, &tiny, "hf f32");
}

#[test]
fn hf_directory_bf16_tied_matches_reference() {
    let dir = tempfile::tempdir().unwrap();
    let config = TinyConfig {
        tied: true,
        ..TinyConfig::llama()
    };
    let tiny = TinyModel::random(config, 2).rounded_to_bf16();
    tiny.write_hf_directory(dir.path(), "BF16", 1);
    let model = load(&ModelSource::HfDirectory(dir.path().to_path_buf()));
    assert!(model.config().tie_word_embeddings);
    check_model(&model, &tiny, "hf bf16 tied");
}

#[test]
fn hf_directory_sharded_with_index_matches_reference() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = TinyModel::random(TinyConfig::llama(), 3);
    tiny.write_hf_directory(dir.path(), "F32", 3);
    assert!(dir.path().join("model.safetensors.index.json").is_file());
    assert!(!dir.path().join("model.safetensors").exists());
    let model = load(&ModelSource::HfDirectory(dir.path().to_path_buf()));
    check_model(&model, &tiny, "hf sharded");
}

#[test]
fn qwen2_with_bias_matches_reference_from_hf_and_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = TinyModel::random(TinyConfig::qwen2(), 4);
    tiny.write_hf_directory(&dir.path().join("hf"), "F32", 1);
    let hf = load(&ModelSource::HfDirectory(dir.path().join("hf")));
    assert_eq!(hf.config().architecture, "qwen2");
    assert!(hf.config().attention_bias);
    check_model(&hf, &tiny, "qwen2 hf");
    let gguf_path = dir.path().join("tiny-qwen2.gguf");
    tiny.write_gguf(&gguf_path);
    let gguf = load(&ModelSource::Gguf(gguf_path));
    assert_eq!(gguf.config().rope_style, RopeStyle::Neox);
    check_model(&gguf, &tiny, "qwen2 gguf");
}

#[test]
fn gguf_llama_with_permuted_qk_matches_hf_reference() {
    // The GGUF holds llama.cpp's permuted Q/K rows; loading it with adjacent-pair RoPE must
    // reproduce the HF model's rotate-half outputs exactly.
    let dir = tempfile::tempdir().unwrap();
    let tiny = TinyModel::random(TinyConfig::llama(), 5);
    let path = dir.path().join("tiny-llama.gguf");
    tiny.write_gguf(&path);
    let source = resolve_model(path.to_str()).unwrap();
    assert_eq!(source, ModelSource::Gguf(path.clone()));
    let model = load(&source);
    assert_eq!(model.config().rope_style, RopeStyle::Normal);
    assert_eq!(model.config().num_kv_heads, 2);
    check_model(&model, &tiny, "gguf llama");
}

#[test]
fn gguf_rope_freqs_are_recognised_as_llama3_scaling() {
    // llama.cpp stores Llama 3.x RoPE scaling as per-pair divisors in `rope_freqs.weight`.
    let dir = tempfile::tempdir().unwrap();
    let config = TinyConfig {
        theta: 500_000.0,
        ..TinyConfig::llama()
    };
    let tiny = TinyModel::random(config, 8);
    let (factor, original, head_dim) = (8.0f64, 8192.0f64, config.head_dim);
    let divisors: Vec<f32> = (0..head_dim / 2)
        .map(|pair| {
            let inv_freq = 1.0 / config.theta.powf((2 * pair) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
            let scaled = if wavelen < original / 4.0 {
                inv_freq
            } else if wavelen > original {
                inv_freq / factor
            } else {
                let smooth = (original / wavelen - 1.0) / 3.0;
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            };
            (inv_freq / scaled) as f32
        })
        .collect();
    // The test only means something if the divisors cover all three bands.
    assert!(divisors[0] == 1.0 && divisors[3] == 8.0 && divisors[2] > 1.0 && divisors[2] < 8.0);
    let path = dir.path().join("llama3.gguf");
    tiny.write_gguf_with(&path, |writer| {
        writer.add_f32_tensor("rope_freqs.weight", &[(head_dim / 2) as u64], &divisors);
    });
    let model = LlamaModel::load_gguf(&path, &options()).unwrap();
    assert_eq!(
        model.config().rope_scaling,
        tokenmill_models::RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    );
    // Divisors no Llama 3 parameter set explains are refused, naming the tensor.
    let odd: Vec<f32> = vec![1.0, 3.0, 1.5, 8.0];
    let path = dir.path().join("odd.gguf");
    tiny.write_gguf_with(&path, |writer| {
        writer.add_f32_tensor("rope_freqs.weight", &[(head_dim / 2) as u64], &odd);
    });
    let error = LlamaModel::load_gguf(&path, &options()).unwrap_err();
    assert!(error.to_string().contains("rope_freqs.weight"), "{error}");
}

#[test]
fn unsupported_tensor_type_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = TinyModel::random(TinyConfig::llama(), 6);
    tiny.write_hf_directory(dir.path(), "F32", 1);
    // Rewrite the checkpoint with one I32 tensor among the f32 ones.
    let header = serde_json::json!({
        "model.embed_tokens.weight": {"dtype": "I32", "shape": [96, 32], "data_offsets": [0, 96 * 32 * 4]}
    })
    .to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, 96 * 32 * 4));
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let error = LlamaModel::load_hf_directory(dir.path(), &options()).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("I32") && message.contains("model.embed_tokens.weight"),
        "{message}"
    );
}

#[test]
fn unsupported_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("falcon.gguf");
    let mut writer = tokenmill_gguf::GgufWriter::new();
    writer.add_metadata(
        "general.architecture",
        tokenmill_gguf::MetadataValue::String("falcon".into()),
    );
    writer.write_to(&path).unwrap();
    let error = LlamaModel::load_gguf(&path, &options()).unwrap_err();
    assert!(error.to_string().contains("`falcon`"), "{error}");
    assert!(
        error.to_string().contains(
            "(supported: llama, mistral, qwen2, qwen3, gemma3, gemma4, qwen3moe, phi3, qwen35, gpt-oss)"
        ),
        "{error}"
    );
}

#[test]
fn loader_refuses_an_unknown_architecture_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mystery.gguf");
    let mut writer = tokenmill_gguf::GgufWriter::new();
    writer.add_metadata(
        "general.architecture",
        tokenmill_gguf::MetadataValue::String("mystery".into()),
    );
    writer.write_to(&path).unwrap();
    let error = load_model(&ModelSource::Gguf(path), &options()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("unsupported model architecture `mystery`"),
        "{error}"
    );
    // The same from an HF directory's `model_type`, before any weight is looked for.
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "mystery"}"#,
    )
    .unwrap();
    let error = load_model(&ModelSource::HfDirectory(dir.path().into()), &options()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("unsupported model architecture `mystery`"),
        "{error}"
    );
}

#[test]
fn loader_dispatches_supported_architectures_to_their_family() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = TinyModel::random(TinyConfig::llama(), 8);
    tiny.write_hf_directory(dir.path(), "F32", 1);
    let source = ModelSource::HfDirectory(dir.path().to_path_buf());
    let boxed = load_model(&source, &options()).unwrap();
    let direct = load(&source);
    assert_eq!(boxed.config(), direct.config());
    assert_eq!(boxed.kv_layout(), direct.kv_layout());
    assert_eq!(
        boxed.kv_layout(),
        kv_layout(direct.config()).unwrap().as_slice()
    );
    assert_eq!(boxed.weight_bytes(), direct.weight_bytes());
    // Through the trait object, the same logits as the concrete type.
    assert_eq!(
        paged_prefill_logits(boxed.as_ref(), &PROMPT[..5], 4),
        paged_prefill_logits(&direct, &PROMPT[..5], 4)
    );
}

#[test]
fn invalid_batches_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = TinyModel::random(TinyConfig::llama(), 7);
    tiny.write_hf_directory(dir.path(), "F32", 1);
    let model = load(&ModelSource::HfDirectory(dir.path().to_path_buf()));
    let pool = test_pool();
    let mut kv = KvCacheStorage::new(model.kv_layout(), 4, 4);
    let mut batch = BatchInput::default();
    batch.add_sequence(&[1, 2, 500], 0, &[0], 4, true).unwrap();
    let error = model
        .forward(
            &pool,
            &batch,
            &mut kv,
            &mut Workspace::new(),
            &mut Vec::new(),
        )
        .unwrap_err();
    assert!(error.to_string().contains("500"), "{error}");
    batch.clear();
    batch.add_sequence(&[1, 2], 0, &[9], 4, true).unwrap();
    assert!(model
        .forward(
            &pool,
            &batch,
            &mut kv,
            &mut Workspace::new(),
            &mut Vec::new()
        )
        .is_err());
}

#[test]
fn kv_cache_bytes_per_block() {
    let config = tokenmill_models::ModelConfig::from_hf_config_json(
        r#"{"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3}"#,
    )
    .unwrap();
    // 2 (K and V) * 30 layers * 16 tokens * 3 heads * 64 dims * 4 bytes.
    assert_eq!(
        KvCacheStorage::bytes_per_block(&kv_layout(&config).unwrap(), 16, KvCacheDType::F32),
        737_280
    );
    assert_eq!(
        KvCacheStorage::bytes_per_block(&kv_layout(&config).unwrap(), 16, KvCacheDType::F16),
        737_280 / 2
    );
    assert_eq!(
        KvCacheStorage::bytes_per_block(&kv_layout(&config).unwrap(), 16, KvCacheDType::Fp8E4m3),
        737_280 / 4
    );
}
