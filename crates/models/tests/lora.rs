//! LoRA adapters on a random-weight tiny model: a PEFT directory or a GGUF LoRA file applied
//! at run time must give the logits of the naive reference over merged weights
//! `W + scale · B · A`, on a GGUF base (Q/K rows permuted) and an HF base alike; a row's
//! result must not depend on the adapters of the other rows; bad adapters are refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::test_pool;
use common::tiny::{permute_for_gguf, write_safetensors, SplitMix, TinyConfig, TinyModel};
use tokenmill_gguf::{GgufWriter, MetadataValue};
use tokenmill_models::{
    load_model, BatchInput, CausalLm, KvCacheStorage, LoadOptions, LoraAdapter, LoraError,
    ModelSource, MoeConfig, Workspace,
};

const TOLERANCE: f32 = 5e-4;
const PROMPT: [u32; 11] = [5, 17, 3, 88, 42, 42, 7, 0, 95, 61, 23];
const ALL_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// A random adapter in HF layout: per layer and target, `A` `[rank, in]` and `B` `[out, rank]`.
struct TinyAdapter {
    rank: usize,
    alpha: f32,
    rslora: bool,
    weights: Vec<(usize, &'static str, Vec<f32>, Vec<f32>)>,
}

fn dims(config: &TinyConfig, target: &str) -> (usize, usize) {
    let (h, i, q, kv) = (
        config.hidden,
        config.intermediate,
        config.q_dim(),
        config.kv_dim(),
    );
    match target {
        "q_proj" => (h, q),
        "k_proj" | "v_proj" => (h, kv),
        "o_proj" => (q, h),
        "gate_proj" | "up_proj" => (h, i),
        "down_proj" => (i, h),
        other => panic!("no target {other}"),
    }
}

/// Adapters are held in F16 (as vLLM runs them in the model's dtype), so the test draws
/// F16-exact values: the merged reference then checks the update's arithmetic, and the
/// rounding of arbitrary f32 weights is measured by the PEFT parity test instead.
fn f16_exact(values: Vec<f32>) -> Vec<f32> {
    values
        .into_iter()
        .map(|v| tokenmill_kernels::f16_to_f32(tokenmill_kernels::f32_to_f16(v)))
        .collect()
}

fn module_path(target: &str) -> &'static str {
    if ["gate_proj", "up_proj", "down_proj"].contains(&target) {
        "mlp"
    } else {
        "self_attn"
    }
}

impl TinyAdapter {
    fn random(
        config: &TinyConfig,
        targets: &[&'static str],
        rank: usize,
        rslora: bool,
        seed: u64,
    ) -> TinyAdapter {
        let mut rng = SplitMix(seed);
        let mut weights = Vec::new();
        for layer in 0..config.layers {
            for &target in targets {
                let (input, output) = dims(config, target);
                let a = f16_exact(rng.vec(rank * input, 0.3));
                let b = f16_exact(rng.vec(output * rank, 0.3));
                weights.push((layer, target, a, b));
            }
        }
        TinyAdapter {
            rank,
            alpha: 2.0 * rank as f32,
            rslora,
            weights,
        }
    }

    fn scale(&self) -> f32 {
        if self.rslora {
            self.alpha / (self.rank as f32).sqrt()
        } else {
            self.alpha / self.rank as f32
        }
    }

    fn targets(&self) -> Vec<&'static str> {
        let mut targets: Vec<&'static str> = self.weights.iter().map(|w| w.1).collect();
        targets.dedup();
        targets.sort();
        targets.dedup();
        targets
    }

    /// `model` with every adapted weight replaced by `W + scale · B · A`.
    fn merge_into(&self, model: &mut TinyModel) {
        let config = model.config;
        for (layer, target, a, b) in &self.weights {
            let (input, output) = dims(&config, target);
            let l = &mut model.layers[*layer];
            let weight = match *target {
                "q_proj" => &mut l.wq,
                "k_proj" => &mut l.wk,
                "v_proj" => &mut l.wv,
                "o_proj" => &mut l.wo,
                "gate_proj" => &mut l.w_gate,
                "up_proj" => &mut l.w_up,
                _ => &mut l.w_down,
            };
            for row in 0..output {
                for column in 0..input {
                    let delta: f64 = (0..self.rank)
                        .map(|k| b[row * self.rank + k] as f64 * a[k * input + column] as f64)
                        .sum();
                    weight[row * input + column] += (delta * self.scale() as f64) as f32;
                }
            }
        }
    }

    fn write_peft(&self, dir: &Path, dtype: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let config = serde_json::json!({
            "peft_type": "LORA",
            "r": self.rank,
            "lora_alpha": self.alpha,
            "use_rslora": self.rslora,
            "target_modules": self.targets(),
            "lora_dropout": 0.05,
            "bias": "none",
            "task_type": "CAUSAL_LM",
        });
        std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
        let mut tensors = Vec::new();
        for (layer, target, a, b) in &self.weights {
            let (input, output) = (a.len() / self.rank, b.len() / self.rank);
            let prefix = format!(
                "base_model.model.model.layers.{layer}.{}.{target}",
                module_path(target)
            );
            tensors.push((
                format!("{prefix}.lora_A.weight"),
                vec![self.rank, input],
                &a[..],
            ));
            tensors.push((
                format!("{prefix}.lora_B.weight"),
                vec![output, self.rank],
                &b[..],
            ));
        }
        write_safetensors(&dir.join("adapter_model.safetensors"), &tensors, dtype);
    }

    /// llama.cpp's `convert_lora_to_gguf.py` layout: GGML dim order, B's Q/K rows permuted.
    fn write_gguf(&self, path: &Path, config: &TinyConfig) {
        assert!(!self.rslora, "GGUF LoRA files scale by alpha / rank");
        let mut writer = GgufWriter::new();
        writer
            .add_metadata(
                "general.architecture",
                MetadataValue::String("llama".into()),
            )
            .add_metadata("general.type", MetadataValue::String("adapter".into()))
            .add_metadata("adapter.type", MetadataValue::String("lora".into()))
            .add_metadata("adapter.lora.alpha", MetadataValue::F32(self.alpha));
        for (layer, target, a, b) in &self.weights {
            let (input, output) = dims(config, target);
            let gguf = match *target {
                "q_proj" => "attn_q",
                "k_proj" => "attn_k",
                "v_proj" => "attn_v",
                "o_proj" => "attn_output",
                "gate_proj" => "ffn_gate",
                "up_proj" => "ffn_up",
                _ => "ffn_down",
            };
            let b = match *target {
                "q_proj" => permute_for_gguf(b, config.heads, config.head_dim, self.rank),
                "k_proj" => permute_for_gguf(b, config.kv_heads, config.head_dim, self.rank),
                _ => b.clone(),
            };
            let r = self.rank as u64;
            writer
                .add_f32_tensor(
                    &format!("blk.{layer}.{gguf}.weight.lora_a"),
                    &[input as u64, r],
                    a,
                )
                .add_f32_tensor(
                    &format!("blk.{layer}.{gguf}.weight.lora_b"),
                    &[r, output as u64],
                    &b,
                );
        }
        writer.write_to(path).unwrap();
    }
}

fn options() -> LoadOptions {
    LoadOptions {
        dequantize_to_f32: false,
        ..LoadOptions::default()
    }
}

/// Logits of the requested rows of each sequence, all sequences in one step, each with its
/// own adapter (`None`: the base model). `all_rows`: every position, else the last.
fn run(
    model: &dyn CausalLm,
    seqs: &[(&[u32], Option<&Arc<LoraAdapter>>)],
    all_rows: bool,
) -> Vec<Vec<Vec<f32>>> {
    let block_size = 4;
    let blocks_per_seq = 8;
    let mut kv = KvCacheStorage::new(model.kv_layout(), blocks_per_seq * seqs.len(), block_size);
    let mut batch = BatchInput::default();
    let mut rows_per_seq = Vec::new();
    for (index, (tokens, adapter)) in seqs.iter().enumerate() {
        let table: Vec<u32> = (0..blocks_per_seq as u32)
            .map(|b| (index * blocks_per_seq) as u32 + b)
            .collect();
        let start = batch.num_tokens() as u32;
        batch
            .add_sequence(tokens, 0, &table, block_size, !all_rows)
            .unwrap();
        if all_rows {
            batch
                .logits_indices
                .extend(start..start + tokens.len() as u32);
        }
        rows_per_seq.push(if all_rows { tokens.len() } else { 1 });
        if let Some(adapter) = adapter {
            batch.set_last_sequence_adapter(adapter).unwrap();
        }
    }
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
    let vocab = model.config().vocab_size;
    let mut rows = logits.chunks_exact(vocab).map(<[f32]>::to_vec);
    rows_per_seq
        .into_iter()
        .map(|count| rows.by_ref().take(count).collect())
        .collect()
}

fn assert_close(actual: &[Vec<f32>], expected: &[Vec<f32>], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: rows");
    let worst = actual
        .iter()
        .flatten()
        .zip(expected.iter().flatten())
        .map(|(a, e)| (a - e).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= TOLERANCE,
        "{what}: max |diff| {worst} > {TOLERANCE}"
    );
}

/// The adapter changes the logits well beyond the tolerance, so matching the merged
/// reference is not matching the base.
fn assert_differs(a: &[Vec<f32>], b: &[Vec<f32>]) {
    let worst = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst > 100.0 * TOLERANCE, "adapter changed little: {worst}");
}

struct Fixture {
    _dir: tempfile::TempDir,
    base: TinyModel,
    gguf: std::path::PathBuf,
    hf: std::path::PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let base = TinyModel::random(TinyConfig::llama(), 11);
    let gguf = dir.path().join("tiny.gguf");
    base.write_gguf(&gguf);
    let hf = dir.path().join("hf");
    base.write_hf_directory(&hf, "F32", 1);
    Fixture {
        _dir: dir,
        base,
        gguf,
        hf,
    }
}

fn merged(base_seed: u64, adapter: &TinyAdapter) -> TinyModel {
    let mut model = TinyModel::random(TinyConfig::llama(), base_seed);
    adapter.merge_into(&mut model);
    model
}

#[test]
fn peft_adapters_match_the_merged_reference_on_gguf_and_hf_bases() {
    let f = fixture();
    let config = f.base.config;
    let adapters = [
        TinyAdapter::random(&config, &ALL_TARGETS, 4, false, 21),
        TinyAdapter::random(&config, &["q_proj", "v_proj"], 2, true, 22),
    ];
    for (index, adapter) in adapters.iter().enumerate() {
        let dir = f._dir.path().join(format!("peft{index}"));
        adapter.write_peft(&dir, if index == 0 { "F32" } else { "BF16" });
        let mut reference_adapter = TinyAdapter {
            weights: adapter.weights.clone(),
            ..*adapter
        };
        if index == 1 {
            // The bf16 file holds rounded weights; the reference merges those.
            for (_, _, a, b) in &mut reference_adapter.weights {
                for v in a.iter_mut().chain(b.iter_mut()) {
                    *v = tokenmill_kernels::bf16_to_f32(tokenmill_kernels::f32_to_bf16(*v));
                }
            }
        }
        let expected = merged(11, &reference_adapter).reference_logits(&PROMPT);
        for base in [
            ModelSource::Gguf(f.gguf.clone()),
            ModelSource::HfDirectory(f.hf.clone()),
        ] {
            let model = load_model(&base, &options()).unwrap();
            let lora = Arc::new(LoraAdapter::load(&dir, model.config(), 16).unwrap());
            assert_eq!(lora.rank(), adapter.rank);
            let with = run(model.as_ref(), &[(&PROMPT, Some(&lora))], true);
            assert_close(&with[0], &expected, &format!("adapter {index} on {base:?}"));
            let without = run(model.as_ref(), &[(&PROMPT, None)], true);
            assert_close(&without[0], &f.base.reference_logits(&PROMPT), "base");
            assert_differs(&with[0], &without[0]);
        }
    }
}

#[test]
fn gguf_lora_file_matches_the_merged_reference() {
    let f = fixture();
    let config = f.base.config;
    let adapter = TinyAdapter::random(&config, &["k_proj", "o_proj", "up_proj"], 3, false, 31);
    let path = f._dir.path().join("adapter.gguf");
    adapter.write_gguf(&path, &config);
    let expected = merged(11, &adapter).reference_logits(&PROMPT);
    let model = load_model(&ModelSource::Gguf(f.gguf.clone()), &options()).unwrap();
    let lora = Arc::new(LoraAdapter::load(&path, model.config(), 8).unwrap());
    assert_eq!((lora.rank(), lora.scale()), (3, 2.0));
    let with = run(model.as_ref(), &[(&PROMPT, Some(&lora))], true);
    assert_close(&with[0], &expected, "GGUF LoRA on the GGUF base");
}

#[test]
fn a_rows_result_does_not_depend_on_the_other_rows_adapters() {
    let f = fixture();
    let config = f.base.config;
    let model = load_model(&ModelSource::Gguf(f.gguf.clone()), &options()).unwrap();
    let dir = f._dir.path();
    let adapters: Vec<Arc<LoraAdapter>> = [
        (&ALL_TARGETS[..], 4, 41),
        (&["q_proj", "v_proj"][..], 2, 42),
        (&["gate_proj", "down_proj", "o_proj"][..], 8, 43),
    ]
    .into_iter()
    .enumerate()
    .map(|(index, (targets, rank, seed))| {
        let path = dir.join(format!("a{index}"));
        TinyAdapter::random(&config, targets, rank, false, seed).write_peft(&path, "F32");
        Arc::new(LoraAdapter::load(&path, model.config(), 8).unwrap())
    })
    .collect();
    let other: [u32; 5] = [9, 8, 7, 6, 5];
    let alone = run(model.as_ref(), &[(&PROMPT, Some(&adapters[0]))], true);
    let base_alone = run(model.as_ref(), &[(&other, None)], true);
    let mixed = run(
        model.as_ref(),
        &[
            (&other, Some(&adapters[1])),
            (&other, None),
            (&PROMPT, Some(&adapters[0])),
            (&other[..3], Some(&adapters[2])),
            (&other[..2], Some(&adapters[0])),
        ],
        true,
    );
    assert_eq!(
        mixed[2], alone[0],
        "adapted row changed with its neighbours"
    );
    assert_eq!(
        mixed[1], base_alone[0],
        "base row changed with its neighbours"
    );
    assert_ne!(mixed[0], mixed[1], "adapter 1 had no effect");
}

fn load_error(path: &Path, max_rank: usize) -> LoraError {
    let model = load_model(&ModelSource::Gguf(fixture().gguf), &options()).unwrap();
    LoraAdapter::load(path, model.config(), max_rank).unwrap_err()
}

#[test]
fn bad_adapters_are_refused_by_name() {
    let f = fixture();
    let config = f.base.config;
    let dir = f._dir.path();
    let good = dir.join("good");
    TinyAdapter::random(&config, &["q_proj"], 8, false, 51).write_peft(&good, "F32");

    let missing = load_error(&dir.join("nowhere"), 16);
    assert!(matches!(missing, LoraError::MissingPath(_)), "{missing}");

    let rank = load_error(&good, 4);
    assert!(
        matches!(
            rank,
            LoraError::RankTooLarge {
                rank: 8,
                max_rank: 4
            }
        ),
        "{rank}"
    );

    let embed = dir.join("embed");
    TinyAdapter::random(&config, &["q_proj"], 2, false, 52).write_peft(&embed, "F32");
    let text = std::fs::read_to_string(embed.join("adapter_config.json")).unwrap();
    std::fs::write(
        embed.join("adapter_config.json"),
        text.replace("\"q_proj\"", "\"q_proj\",\"embed_tokens\""),
    )
    .unwrap();
    let error = load_error(&embed, 16);
    assert!(
        matches!(&error, LoraError::UnsupportedTarget { module } if module == "embed_tokens"),
        "{error}"
    );

    // A mixture-of-experts base has no adapter hook in its experts: MLP targets are refused
    // at load, attention targets still load.
    let model = load_model(&ModelSource::Gguf(f.gguf.clone()), &options()).unwrap();
    let mut moe_config = model.config().clone();
    moe_config.moe = Some(MoeConfig {
        num_experts: 4,
        experts_used: 2,
        expert_intermediate_size: moe_config.intermediate_size,
    });
    let mlp = dir.join("mlp");
    TinyAdapter::random(&config, &["q_proj", "up_proj"], 2, false, 54).write_peft(&mlp, "F32");
    let error = LoraAdapter::load(&mlp, &moe_config, 16).unwrap_err();
    assert!(
        matches!(&error, LoraError::ExpertTarget { module } if module == "up_proj"),
        "{error}"
    );
    assert!(LoraAdapter::load(&mlp, model.config(), 16).is_ok());
    assert!(LoraAdapter::load(&good, &moe_config, 16).is_ok());

    let wider = TinyConfig {
        hidden: 48,
        ..TinyConfig::llama()
    };
    let mismatch = dir.join("mismatch");
    TinyAdapter::random(&wider, &["v_proj"], 2, false, 53).write_peft(&mismatch, "F32");
    let error = load_error(&mismatch, 16);
    assert!(matches!(error, LoraError::ShapeMismatch { .. }), "{error}");

    let deeper = TinyConfig {
        layers: 3,
        ..TinyConfig::llama()
    };
    let layers = dir.join("layers");
    TinyAdapter::random(&deeper, &["v_proj"], 2, false, 54).write_peft(&layers, "F32");
    let error = load_error(&layers, 16);
    assert!(
        matches!(error, LoraError::LayerOutOfRange { layer: 2, .. }),
        "{error}"
    );

    let corrupt = dir.join("corrupt");
    TinyAdapter::random(&config, &["q_proj"], 2, false, 55).write_peft(&corrupt, "F32");
    let weights = corrupt.join("adapter_model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() - 100]).unwrap();
    let error = load_error(&corrupt, 16);
    assert!(matches!(error, LoraError::Corrupt { .. }), "{error}");
    std::fs::write(&weights, b"not a safetensors file").unwrap();
    let error = load_error(&corrupt, 16);
    assert!(matches!(error, LoraError::Corrupt { .. }), "{error}");

    let base_model = load_error(&f.gguf, 16);
    assert!(
        matches!(base_model, LoraError::NotAnAdapter { .. }),
        "{base_model}"
    );
    let no_config = dir.join("empty");
    std::fs::create_dir_all(&no_config).unwrap();
    let error = load_error(&no_config, 16);
    assert!(matches!(error, LoraError::NotAnAdapter { .. }), "{error}");
}
