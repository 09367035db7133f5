//! The family fixtures (`fixtures/family_*.json`, written by `scripts/reference/`): a small
//! random-weight model's spec, whose weights both sides compute from a formula, and llama.cpp's
//! runs of it. Written back here as GGUF and as an HF directory.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use tokenmill_gguf::{GgmlType, GgufWriter, MetadataValue};
use tokenmill_kernels::{quantize_row_mxfp4, quantize_row_q8_0, DType};

/// The HF name of a GGUF tensor name, per HF's Qwen3 / Gemma 3 / Qwen3-MoE / Mixtral
/// modeling code (`arch` is the fixture's: Mixtral's is `llama`). Expert tensors are split
/// per expert by the caller, which gives `expert`.
pub fn hf_name(gguf: &str, arch: &str, expert: usize) -> String {
    let gemma3 = arch == "gemma3";
    let phi3 = arch == "phi3";
    let moe = if arch == "llama" {
        "block_sparse_moe"
    } else {
        "mlp"
    };
    match gguf {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output_norm.weight" => return "model.norm.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.").unwrap();
    let (layer, short) = rest.split_once('.').unwrap();
    let hf = match short {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "attn_qkv.weight" => "self_attn.qkv_proj.weight",
        "ffn_up.weight" if phi3 => "mlp.gate_up_proj.weight",
        "ffn_norm.weight" if gemma3 => "pre_feedforward_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        "ffn_gate_inp.weight" => return format!("model.layers.{layer}.{moe}.gate.weight"),
        exps => {
            let projection = match (exps, arch) {
                ("ffn_gate_exps.weight", "llama") => "w1",
                ("ffn_up_exps.weight", "llama") => "w3",
                ("ffn_down_exps.weight", "llama") => "w2",
                ("ffn_gate_exps.weight", _) => "gate_proj",
                ("ffn_up_exps.weight", _) => "up_proj",
                ("ffn_down_exps.weight", _) => "down_proj",
                (other, _) => panic!("no HF name for {other}"),
            };
            return format!("model.layers.{layer}.{moe}.experts.{expert}.{projection}.weight");
        }
    };
    format!("model.layers.{layer}.{hf}")
}

/// The fixture's model as an HF directory (`config.json` + one F32 safetensors file). Qwen
/// and Gemma rotate half-split pairs in GGUF too, so Q/K rows are the same; Mixtral's GGUF
/// (`llama`) rows are llama.cpp's permutation of HF's, undone here. Gemma's norms are stored
/// as `w - 1` (HF computes `x * (1 + w)`), exact for weights in [0.5, 2]. Expert tensors
/// become one 2-D tensor per expert.
pub fn write_hf_directory(fixture: &Fixture, dir: &Path) {
    let gemma3 = fixture.arch == "gemma3";
    let mixtral = fixture.arch == "llama";
    let meta = |key: &str| {
        fixture
            .meta
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, _, value)| value.clone())
    };
    let vocab = fixture.tensors[0].shape[0];
    let (class, model_type) = match fixture.arch.as_str() {
        "gemma3" => ("Gemma3ForCausalLM", "gemma3_text"),
        "qwen3" => ("Qwen3ForCausalLM", "qwen3"),
        "qwen3moe" => ("Qwen3MoeForCausalLM", "qwen3_moe"),
        "llama" => ("MixtralForCausalLM", "mixtral"),
        "phi3" => ("Phi3ForCausalLM", "phi3"),
        other => panic!("no HF class for {other}"),
    };
    let mut config = serde_json::json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": meta("embedding_length"),
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": meta("attention.head_count"),
        "num_key_value_heads": meta("attention.head_count_kv"),
        "head_dim": meta("attention.key_length"),
        "rms_norm_eps": meta("attention.layer_norm_rms_epsilon"),
        "rope_theta": meta("rope.freq_base"),
        "max_position_embeddings": meta("context_length"),
        "tie_word_embeddings": !fixture.tensors.iter().any(|t| t.name == "output.weight"),
    });
    if let Some(experts) = meta("expert_count") {
        let (count_key, width) = if mixtral {
            ("num_local_experts", meta("feed_forward_length"))
        } else {
            ("num_experts", meta("expert_feed_forward_length"))
        };
        let extra = serde_json::json!({
            count_key: experts,
            "num_experts_per_tok": meta("expert_used_count"),
            "moe_intermediate_size": width,
            "norm_topk_prob": true,
        });
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
    }
    if gemma3 {
        let extra = serde_json::json!({
            "sliding_window": meta("attention.sliding_window"),
            "sliding_window_pattern": 6,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": meta("rope.scaling.factor")},
            "query_pre_attn_scalar": meta("attention.key_length"),
            "hidden_activation": "gelu_pytorch_tanh",
        });
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
    }
    if fixture.arch == "phi3" {
        // LongRoPE's factors are tensors in the GGUF and lists in HF's config; partial
        // rotary is a dimension count there and a share of the head here.
        let factors = |name: &str| {
            let spec = fixture.tensors.iter().find(|t| t.name == name).unwrap();
            formula_weights(fnv1a(name), spec.shape[0] as usize, spec.scale, spec.offset)
        };
        let head_dim = meta("embedding_length").unwrap().as_f64().unwrap()
            / meta("attention.head_count").unwrap().as_f64().unwrap();
        let extra = serde_json::json!({
            "partial_rotary_factor":
                meta("rope.dimension_count").unwrap().as_f64().unwrap() / head_dim,
            "original_max_position_embeddings": meta("rope.scaling.original_context_length"),
            "rope_scaling": {
                "type": "longrope",
                "long_factor": factors("rope_factors_long.weight"),
                "short_factor": factors("rope_factors_short.weight"),
            },
        });
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let heads = meta("attention.head_count").unwrap().as_u64().unwrap() as usize;
    let kv_heads = meta("attention.head_count_kv").unwrap().as_u64().unwrap() as usize;
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for tensor in &fixture.tensors {
        if tensor.name.starts_with("rope_factors_") {
            continue;
        }
        let count = tensor.shape.iter().product::<u64>() as usize;
        let mut values = formula_weights(fnv1a(&tensor.name), count, tensor.scale, tensor.offset);
        if gemma3 && tensor.name.ends_with("norm.weight") {
            values.iter_mut().for_each(|v| *v -= 1.0);
        }
        let shape: Vec<usize> = tensor.shape.iter().map(|&d| d as usize).collect();
        if mixtral && tensor.name.ends_with("attn_q.weight") {
            values = unpermute_from_gguf(&values, heads, shape[1]);
        }
        if mixtral && tensor.name.ends_with("attn_k.weight") {
            values = unpermute_from_gguf(&values, kv_heads, shape[1]);
        }
        if let [experts, rows, columns] = shape[..] {
            for (expert, part) in values.chunks_exact(rows * columns).enumerate() {
                let name = hf_name(&tensor.name, &fixture.arch, expert);
                tensors.push((name, vec![rows, columns], part.to_vec()));
            }
            assert_eq!(values.len(), experts * rows * columns);
        } else {
            tensors.push((hf_name(&tensor.name, &fixture.arch, 0), shape, values));
        }
    }
    let borrowed: Vec<(String, Vec<usize>, &[f32])> = tensors
        .iter()
        .map(|(name, shape, values)| (name.clone(), shape.clone(), values.as_slice()))
        .collect();
    super::tiny::write_safetensors(&dir.join("model.safetensors"), &borrowed, "F32");
}

/// HF's Q/K rows from llama.cpp's Llama permutation (each head's rotation pairs interleaved):
/// GGUF row `(h, i, j)` of a `[heads, head_dim / 2, 2]` split is HF row `(h, j, i)`.
pub fn unpermute_from_gguf(gguf: &[f32], heads: usize, columns: usize) -> Vec<f32> {
    let rows = gguf.len() / columns;
    let half = rows / heads / 2;
    let mut hf = vec![0.0; gguf.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let from = (h * half + i) * 2 + j;
                let to = (h * 2 + j) * half + i;
                hf[to * columns..(to + 1) * columns]
                    .copy_from_slice(&gguf[from * columns..(from + 1) * columns]);
            }
        }
    }
    hf
}

#[derive(Deserialize)]
pub struct Fixture {
    pub arch: String,
    /// `(key without the architecture prefix, type, value)`.
    pub meta: Vec<(String, String, serde_json::Value)>,
    pub tensors: Vec<TensorSpec>,
    pub cases: Vec<Case>,
    /// MoE fixtures: llama.cpp on the file `llama-quantize` made Q8_0.
    #[serde(default)]
    pub q8_0: Option<QuantizedRun>,
}

#[derive(Deserialize)]
pub struct QuantizedRun {
    /// GGML type name per tensor (`Q8_0` or `F32`).
    pub tensor_types: HashMap<String, String>,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct TensorSpec {
    pub name: String,
    /// Outermost first.
    pub shape: Vec<u64>,
    pub scale: f32,
    pub offset: f32,
}

#[derive(Deserialize)]
pub struct Case {
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub top_logits: Vec<Vec<(u32, f32)>>,
}

/// `offset + scale * u`, `u` in [-1, 1] from an integer hash of (seed, index): the twin of
/// `formula_weights` in make_family_fixtures.py (same wrapping u64 arithmetic, same f32
/// operations in the same order, so the same bits).
pub fn formula_weights(seed: u64, count: usize, scale: f32, offset: f32) -> Vec<f32> {
    formula_hash(seed, count)
        .into_iter()
        .map(|x| {
            let u = ((x % 20001) as f32 - 10000.0) / 10000.0;
            u * scale + offset
        })
        .collect()
}

/// The integer hash of (seed, index) under [`formula_weights`], 32 bits per element (the
/// twin of `formula_hash` in make_gptoss_fixtures.py; the MXFP4 fixtures draw codes from it).
pub fn formula_hash(seed: u64, count: usize) -> Vec<u64> {
    const MASK: u64 = 0xFFFF_FFFF;
    let add = (seed.wrapping_mul(0x85EB_CA77).wrapping_add(0x1656_67B1)) & MASK;
    (0..count as u64)
        .map(|i| {
            let mut x = (i.wrapping_mul(0x9E37_79B1).wrapping_add(add)) & MASK;
            x ^= x >> 15;
            x = x.wrapping_mul(0x2C1B_3C6D) & MASK;
            x ^= x >> 12;
            x = x.wrapping_mul(0x297A_2D39) & MASK;
            x ^= x >> 15;
            x
        })
        .collect()
}

/// 32-bit FNV-1a of a tensor name: its seed.
pub fn fnv1a(name: &str) -> u64 {
    name.bytes().fold(0x811C_9DC5u64, |h, byte| {
        ((h ^ u64::from(byte)) * 0x0100_0193) & 0xFFFF_FFFF
    })
}

/// Writes the fixture's model as an F32 GGUF (no tokenizer: the vocabulary size comes from
/// `token_embd.weight`).
pub fn write_gguf(fixture: &Fixture, path: &Path) {
    write_gguf_typed(fixture, path, &HashMap::new());
}

/// [`write_gguf`] with the tensors `types` names as `Q8_0` or `MXFP4` quantized (GGML's
/// reference quantizers); the others F32.
pub fn write_gguf_typed(fixture: &Fixture, path: &Path, types: &HashMap<String, String>) {
    let mut writer = GgufWriter::new();
    writer.add_metadata(
        "general.architecture",
        MetadataValue::String(fixture.arch.clone()),
    );
    for (key, kind, value) in &fixture.meta {
        let value = match kind.as_str() {
            "u32" => MetadataValue::U32(value.as_u64().unwrap() as u32),
            "f32" => MetadataValue::F32(value.as_f64().unwrap() as f32),
            "str" => MetadataValue::String(value.as_str().unwrap().into()),
            other => panic!("metadata type {other}"),
        };
        writer.add_metadata(&format!("{}.{key}", fixture.arch), value);
    }
    for tensor in &fixture.tensors {
        let count = tensor.shape.iter().product::<u64>() as usize;
        let values = formula_weights(fnv1a(&tensor.name), count, tensor.scale, tensor.offset);
        let dims: Vec<u64> = tensor.shape.iter().rev().copied().collect();
        match types.get(&tensor.name).map(String::as_str) {
            None | Some("F32") => {
                writer.add_f32_tensor(&tensor.name, &dims, &values);
            }
            Some(name @ ("Q8_0" | "MXFP4")) => {
                let dtype = if name == "Q8_0" {
                    DType::Q8_0
                } else {
                    DType::MXFP4
                };
                let row = dims[0] as usize;
                let row_bytes = dtype.row_bytes(row).unwrap();
                let mut bytes = vec![0u8; count / row * row_bytes];
                for (src, dst) in values
                    .chunks_exact(row)
                    .zip(bytes.chunks_exact_mut(row_bytes))
                {
                    match dtype {
                        DType::Q8_0 => quantize_row_q8_0(src, dst),
                        _ => quantize_row_mxfp4(src, dst),
                    }
                    .unwrap();
                }
                let ggml_type = GgmlType::from_id(dtype.ggml_id());
                writer.add_tensor(&tensor.name, &dims, ggml_type, bytes);
            }
            Some(other) => panic!("{}: type {other}", tensor.name),
        }
    }
    writer.write_to(path).unwrap();
}
