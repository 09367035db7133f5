//! The Gemma 4 fixtures (`fixtures/gemma4_*.json`, written by
//! `scripts/reference/make_gemma4_fixtures.py`) as llama.cpp's `convert_hf_to_gguf.py
//! --outtype f32` writes them: renames, the per-layer keys (`head_count_kv` and
//! `feed_forward_length` as arrays where layers differ, the sliding layers' head size and
//! RoPE under `*_swa`, the experts' `expert_*` counts), the `rope_freqs.weight` that marks
//! the global layers' unrotated pairs, and the mixture of experts' tensors: the router's
//! scales as `.scale` tensors of `ffn_gate_inp` and `ffn_down_exps`, gate and up fused in
//! `ffn_gate_up_exps` (metadata and tensors checked once against the converter's output). The fixture's
//! HF directory and the runner helpers are the Qwen3.5 support's (`support/qwen35.rs`).
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;

use tokenmill_gguf::{GgufWriter, MetadataValue};

use super::qwen35::Qwen35Fixture;

fn usize_of(config: &serde_json::Value, key: &str) -> usize {
    config[key].as_u64().unwrap() as usize
}

/// The GGUF name of an HF tensor of `Gemma4ForCausalLM`.
fn gguf_name(hf: &str) -> String {
    let global = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        (
            "model.embed_tokens_per_layer.weight",
            "per_layer_token_embd.weight",
        ),
        (
            "model.per_layer_model_projection.weight",
            "per_layer_model_proj.weight",
        ),
        (
            "model.per_layer_projection_norm.weight",
            "per_layer_proj_norm.weight",
        ),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, name)) = global.iter().find(|(from, _)| *from == hf) {
        return (*name).into();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, short) = rest.split_once('.').unwrap();
    let name = match short {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "per_layer_input_gate.weight" => "inp_gate.weight",
        "per_layer_projection.weight" => "proj.weight",
        "post_per_layer_input_norm.weight" => "post_norm.weight",
        "layer_scalar" => "layer_output_scale.weight",
        "router.proj.weight" => "ffn_gate_inp.weight",
        "router.scale" => "ffn_gate_inp.scale",
        "router.per_expert_scale" => "ffn_down_exps.scale",
        "experts.gate_up_proj" => "ffn_gate_up_exps.weight",
        "experts.down_proj" => "ffn_down_exps.weight",
        "post_feedforward_layernorm_1.weight" => "post_ffw_norm_1.weight",
        "pre_feedforward_layernorm_2.weight" => "pre_ffw_norm_2.weight",
        "post_feedforward_layernorm_2.weight" => "post_ffw_norm_2.weight",
        other => panic!("no GGUF name for {other}"),
    };
    format!("blk.{layer}.{name}")
}

/// The fixture's checkpoint as llama.cpp's converter writes it (F32, no tokenizer).
pub fn write_gguf(fixture: &Qwen35Fixture, path: &Path) {
    let c = &fixture.config;
    let arch = "gemma4";
    let layers = usize_of(c, "num_hidden_layers");
    let sliding: Vec<bool> = c["layer_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kind| kind == "sliding_attention")
        .collect();
    let (swa_head, full_head) = (usize_of(c, "head_dim"), usize_of(c, "global_head_dim"));
    let shared = usize_of(c, "num_kv_shared_layers");
    let mut writer = GgufWriter::new();
    writer.add_metadata("general.architecture", MetadataValue::String(arch.into()));
    let u32s = [
        ("block_count", layers),
        ("context_length", usize_of(c, "max_position_embeddings")),
        ("embedding_length", usize_of(c, "hidden_size")),
        ("attention.head_count", usize_of(c, "num_attention_heads")),
        ("attention.key_length", full_head),
        ("attention.value_length", full_head),
        ("attention.key_length_swa", swa_head),
        ("attention.value_length_swa", swa_head),
        ("attention.sliding_window", usize_of(c, "sliding_window")),
        ("attention.shared_kv_layers", shared),
        (
            "embedding_length_per_layer_input",
            usize_of(c, "hidden_size_per_layer_input"),
        ),
        ("rope.dimension_count", full_head),
        ("rope.dimension_count_swa", swa_head),
    ];
    let experts = match c["enable_moe_block"].as_bool().unwrap_or(false) {
        true => vec![
            ("expert_count", usize_of(c, "num_experts")),
            ("expert_used_count", usize_of(c, "top_k_experts")),
            (
                "expert_feed_forward_length",
                usize_of(c, "moe_intermediate_size"),
            ),
        ],
        false => Vec::new(),
    };
    for (key, value) in u32s.into_iter().chain(experts) {
        writer.add_metadata(&format!("{arch}.{key}"), MetadataValue::U32(value as u32));
    }
    let rope = &c["rope_parameters"];
    let f32s = [
        (
            "rope.freq_base",
            rope["full_attention"]["rope_theta"].as_f64().unwrap(),
        ),
        (
            "rope.freq_base_swa",
            rope["sliding_attention"]["rope_theta"].as_f64().unwrap(),
        ),
        (
            "attention.layer_norm_rms_epsilon",
            c["rms_norm_eps"].as_f64().unwrap(),
        ),
        (
            "final_logit_softcapping",
            c["final_logit_softcapping"].as_f64().unwrap(),
        ),
    ];
    for (key, value) in f32s {
        writer.add_metadata(&format!("{arch}.{key}"), MetadataValue::F32(value as f32));
    }
    let intermediate = usize_of(c, "intermediate_size");
    let ffn = if c["use_double_wide_mlp"].as_bool().unwrap_or(false) {
        let widths = (0..layers)
            .map(|layer| {
                let width = intermediate * if layer < layers - shared { 1 } else { 2 };
                MetadataValue::U32(width as u32)
            })
            .collect();
        MetadataValue::Array(widths)
    } else {
        MetadataValue::U32(intermediate as u32)
    };
    writer.add_metadata(&format!("{arch}.feed_forward_length"), ffn);
    let kv_heads = usize_of(c, "num_key_value_heads");
    let heads = match c["num_global_key_value_heads"].as_u64() {
        Some(global) => MetadataValue::Array(
            sliding
                .iter()
                .map(|&swa| MetadataValue::U32(if swa { kv_heads as u32 } else { global as u32 }))
                .collect(),
        ),
        None => MetadataValue::U32(kv_heads as u32),
    };
    writer.add_metadata(&format!("{arch}.attention.head_count_kv"), heads);
    writer.add_metadata(
        &format!("{arch}.attention.sliding_window_pattern"),
        MetadataValue::Array(sliding.iter().map(|&s| MetadataValue::Bool(s)).collect()),
    );
    let partial = rope["full_attention"]["partial_rotary_factor"]
        .as_f64()
        .unwrap();
    let rotated = (full_head as f64 * partial / 2.0) as usize;
    let factors: Vec<f32> = (0..full_head / 2)
        .map(|pair| if pair < rotated { 1.0 } else { 1e30 })
        .collect();
    writer.add_f32_tensor("rope_freqs.weight", &[factors.len() as u64], &factors);
    for spec in &fixture.tensors {
        let dims: Vec<u64> = spec.shape.iter().rev().map(|&d| d as u64).collect();
        writer.add_f32_tensor(&gguf_name(&spec.name), &dims, &spec.values());
    }
    writer.write_to(path).unwrap();
}
