//! The gpt-oss fixture (`fixtures/gptoss_20b_like.json`, written by
//! `scripts/reference/make_gptoss_fixtures.py`) as llama.cpp's `convert_hf_to_gguf.py
//! --outtype f32` writes it, with the experts as MXFP4 blocks (the script's rewrite; or as
//! F32 of the same values): renames (the pre-FFN norm stays `post_attention_norm`, the sinks
//! become `attn_sinks.weight`, the router `ffn_gate_inp`), the experts' fused and interleaved
//! gate/up bias split into `ffn_gate_exps.bias` and `ffn_up_exps.bias`, YaRN's keys (metadata
//! and tensors checked once against the converter's output). The experts' values come from
//! [`mxfp4_codes`], the twin of the script's.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;

use tokenmill_gguf::{GgmlType, GgufWriter, MetadataValue};

use super::common::family::{fnv1a, formula_hash};
use super::qwen35::{Qwen35Fixture, TensorSpec};

/// GGML's type id of MXFP4 blocks.
const MXFP4_ID: u32 = 39;

/// ggml's `kvalues_mxfp4` (2 × the E2M1 levels).
const KVALUES: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0,
];

/// An expert tensor of the fixture: its GGUF-layout shape `[experts, rows, columns]` and the
/// base of its blocks' E8M0 scales.
pub struct Mxfp4Spec {
    pub name: String,
    pub shape: [usize; 3],
    pub e_base: u8,
}

impl Mxfp4Spec {
    /// `(codes, scales)`: one 4-bit code per element, one E8M0 scale per 32 (the script's
    /// `mxfp4_codes`).
    pub fn codes(&self) -> (Vec<u8>, Vec<u8>) {
        let count: usize = self.shape.iter().product();
        let seed = fnv1a(&self.name);
        let codes = formula_hash(seed, count)
            .into_iter()
            .map(|x| (x % 16) as u8)
            .collect();
        let scales = formula_hash(seed ^ 0xA5A5_A5A5, count / 32)
            .into_iter()
            .map(|x| self.e_base + (x % 2) as u8)
            .collect();
        (codes, scales)
    }

    /// The values the blocks hold: `KVALUES[code] · 2^(e − 128)`.
    pub fn values(&self) -> Vec<f32> {
        let (codes, scales) = self.codes();
        codes
            .chunks_exact(32)
            .zip(scales)
            .flat_map(|(block, e)| {
                let half = 2f32.powi(i32::from(e) - 128);
                block.iter().map(move |&c| KVALUES[c as usize] * half)
            })
            .collect()
    }

    /// GGUF MXFP4 blocks: `e`, then 16 bytes (element `j`'s code low, `j + 16`'s high).
    pub fn bytes(&self) -> Vec<u8> {
        let (codes, scales) = self.codes();
        let mut out = Vec::with_capacity(codes.len() / 32 * 17);
        for (block, e) in codes.chunks_exact(32).zip(scales) {
            out.push(e);
            out.extend((0..16).map(|j| block[j] | (block[j + 16] << 4)));
        }
        out
    }

    fn dims(&self) -> Vec<u64> {
        self.shape.iter().rev().map(|&d| d as u64).collect()
    }
}

/// The fixture's MXFP4 expert tensors (those with `mxfp4_e_base`).
pub fn expert_specs(name: &str) -> Vec<Mxfp4Spec> {
    let raw: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(format!("{name}.json")),
        )
        .unwrap(),
    )
    .unwrap();
    raw["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| {
            let e_base = t.get("mxfp4_e_base")?.as_u64()? as u8;
            let shape: Vec<usize> = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            Some(Mxfp4Spec {
                name: t["name"].as_str().unwrap().to_string(),
                shape: [shape[0], shape[1], shape[2]],
                e_base,
            })
        })
        .collect()
}

/// The GGUF name of an HF tensor of `GptOssForCausalLM` (the fused expert bias aside).
fn gguf_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, short) = rest.split_once('.').unwrap();
    let name = match short {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.bias" => "attn_output.bias",
        "self_attn.sinks" => "attn_sinks.weight",
        "mlp.router.weight" => "ffn_gate_inp.weight",
        "mlp.router.bias" => "ffn_gate_inp.bias",
        "mlp.experts.down_proj_bias" => "ffn_down_exps.bias",
        other => panic!("no GGUF name for {other}"),
    };
    format!("blk.{layer}.{name}")
}

/// How the experts go into the GGUF.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Experts {
    /// MXFP4 blocks, as the released files (and the script's llama.cpp GGUF) hold them.
    Mxfp4,
    /// F32 of the same values.
    F32,
}

/// The fixture's checkpoint as the converter (and the script's MXFP4 rewrite) writes it; no
/// tokenizer (the vocabulary size comes from `token_embd.weight`). `edit` may change an F32
/// tensor's values (by GGUF name) first.
pub fn write_gguf(
    name: &str,
    fixture: &Qwen35Fixture,
    path: &Path,
    experts: Experts,
    edit: impl Fn(&str, &mut Vec<f32>),
) {
    write_gguf_with(name, fixture, path, experts, edit, 0);
}

/// [`write_gguf`] with MXFP4 experts whose every scale byte is `shift` higher (a negative
/// control: each weight `2^shift` times its value).
pub fn write_gguf_scaled(name: &str, fixture: &Qwen35Fixture, path: &Path, shift: u8) {
    write_gguf_with(name, fixture, path, Experts::Mxfp4, |_, _| {}, shift);
}

fn write_gguf_with(
    name: &str,
    fixture: &Qwen35Fixture,
    path: &Path,
    experts: Experts,
    edit: impl Fn(&str, &mut Vec<f32>),
    shift: u8,
) {
    let c = &fixture.config;
    let arch = "gpt-oss";
    let usize_of = |key: &str| c[key].as_u64().unwrap() as u32;
    let mut writer = GgufWriter::new();
    writer.add_metadata("general.architecture", MetadataValue::String(arch.into()));
    let rope = &c["rope_parameters"];
    let u32s = [
        ("block_count", usize_of("num_hidden_layers")),
        ("context_length", usize_of("max_position_embeddings")),
        ("embedding_length", usize_of("hidden_size")),
        ("feed_forward_length", usize_of("intermediate_size")),
        ("attention.head_count", usize_of("num_attention_heads")),
        ("attention.head_count_kv", usize_of("num_key_value_heads")),
        ("attention.key_length", usize_of("head_dim")),
        ("attention.value_length", usize_of("head_dim")),
        ("attention.sliding_window", usize_of("sliding_window")),
        ("expert_count", usize_of("num_local_experts")),
        ("expert_used_count", usize_of("num_experts_per_tok")),
        ("expert_feed_forward_length", usize_of("intermediate_size")),
        (
            "rope.scaling.original_context_length",
            rope["original_max_position_embeddings"].as_u64().unwrap() as u32,
        ),
    ];
    for (key, value) in u32s {
        writer.add_metadata(&format!("{arch}.{key}"), MetadataValue::U32(value));
    }
    let f32s = [
        ("rope.freq_base", rope["rope_theta"].as_f64().unwrap()),
        ("rope.scaling.factor", rope["factor"].as_f64().unwrap()),
        (
            "rope.scaling.yarn_beta_fast",
            rope["beta_fast"].as_f64().unwrap(),
        ),
        (
            "rope.scaling.yarn_beta_slow",
            rope["beta_slow"].as_f64().unwrap(),
        ),
        (
            "attention.layer_norm_rms_epsilon",
            c["rms_norm_eps"].as_f64().unwrap(),
        ),
    ];
    for (key, value) in f32s {
        writer.add_metadata(&format!("{arch}.{key}"), MetadataValue::F32(value as f32));
    }
    writer.add_metadata(
        &format!("{arch}.rope.scaling.type"),
        MetadataValue::String("yarn".into()),
    );
    let specs: Vec<&TensorSpec> = fixture
        .tensors
        .iter()
        .filter(|t| !t.name.starts_with("blk."))
        .collect();
    for spec in specs {
        let mut values = spec.values();
        if let Some(rest) = spec.name.strip_suffix("mlp.experts.gate_up_proj_bias") {
            // `[experts, 2 * width]`, gate and up interleaved.
            let layer = rest
                .strip_prefix("model.layers.")
                .unwrap()
                .trim_end_matches('.');
            let (count, width) = (spec.shape[0], spec.shape[1] / 2);
            for (part, offset) in [("gate", 0), ("up", 1)] {
                let mut split: Vec<f32> = values.iter().skip(offset).step_by(2).copied().collect();
                let name = format!("blk.{layer}.ffn_{part}_exps.bias");
                edit(&name, &mut split);
                writer.add_f32_tensor(&name, &[width as u64, count as u64], &split);
            }
            continue;
        }
        let dims: Vec<u64> = spec.shape.iter().rev().map(|&d| d as u64).collect();
        let name = gguf_name(&spec.name);
        edit(&name, &mut values);
        writer.add_f32_tensor(&name, &dims, &values);
    }
    for expert in expert_specs(name) {
        match experts {
            Experts::Mxfp4 => {
                let mut bytes = expert.bytes();
                bytes.iter_mut().step_by(17).for_each(|e| *e += shift);
                writer.add_tensor(
                    &expert.name,
                    &expert.dims(),
                    GgmlType::from_id(MXFP4_ID),
                    bytes,
                )
            }
            Experts::F32 => writer.add_f32_tensor(&expert.name, &expert.dims(), &expert.values()),
        };
    }
    writer.write_to(path).unwrap();
}

/// One safetensors tensor: dtype name, shape, bytes.
type RawEntry = (String, &'static str, Vec<usize>, Vec<u8>);

fn write_raw_safetensors(path: &Path, tensors: &[RawEntry]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut header_bytes = serde_json::Value::Object(header).to_string().into_bytes();
    while !header_bytes.len().is_multiple_of(8) {
        header_bytes.push(b' ');
    }
    let mut file = (header_bytes.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header_bytes);
    file.extend_from_slice(&data);
    std::fs::write(path, file).unwrap();
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// How the HF directory holds the experts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum HfExperts {
    /// `save_pretrained`'s F32 `[experts, in, out]`, gate and up columns interleaved.
    Unquantized,
    /// The released checkpoints' `*_blocks` / `*_scales` (rows = outputs, gate and up rows
    /// interleaved, two consecutive elements per byte), with `quantization_config`.
    Mxfp4,
}

/// The fixture as an HF directory of either kind.
pub fn write_hf_directory(name: &str, fixture: &Qwen35Fixture, dir: &Path, experts: HfExperts) {
    std::fs::create_dir_all(dir).unwrap();
    let mut config = fixture.config.clone();
    if experts == HfExperts::Mxfp4 {
        config["quantization_config"] = serde_json::json!({"quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"]});
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<RawEntry> = fixture
        .tensors
        .iter()
        .filter(|t| !t.name.starts_with("blk."))
        .map(|spec| {
            (
                spec.name.clone(),
                "F32",
                spec.shape.clone(),
                f32_bytes(&spec.values()),
            )
        })
        .collect();
    let specs = expert_specs(name);
    let layers = fixture.config["num_hidden_layers"].as_u64().unwrap() as usize;
    for layer in 0..layers {
        let find = |part: &str| {
            specs
                .iter()
                .find(|s| s.name == format!("blk.{layer}.ffn_{part}_exps.weight"))
                .unwrap()
        };
        let (gate, up, down) = (find("gate"), find("up"), find("down"));
        let [e, i, h] = gate.shape;
        let prefix = format!("model.layers.{layer}.mlp.experts.");
        match experts {
            HfExperts::Unquantized => {
                let (g, u, d) = (gate.values(), up.values(), down.values());
                let mut gate_up = vec![0.0f32; e * h * 2 * i];
                for x in 0..e {
                    for r in 0..i {
                        for c in 0..h {
                            gate_up[(x * h + c) * 2 * i + 2 * r] = g[(x * i + r) * h + c];
                            gate_up[(x * h + c) * 2 * i + 2 * r + 1] = u[(x * i + r) * h + c];
                        }
                    }
                }
                let mut down_t = vec![0.0f32; e * i * h];
                for x in 0..e {
                    for c in 0..h {
                        for r in 0..i {
                            down_t[(x * i + r) * h + c] = d[(x * h + c) * i + r];
                        }
                    }
                }
                tensors.push((
                    format!("{prefix}gate_up_proj"),
                    "F32",
                    vec![e, h, 2 * i],
                    f32_bytes(&gate_up),
                ));
                tensors.push((
                    format!("{prefix}down_proj"),
                    "F32",
                    vec![e, i, h],
                    f32_bytes(&down_t),
                ));
            }
            HfExperts::Mxfp4 => {
                // HF packs elements 2k and 2k + 1 into byte k (low, high).
                let hf_blocks = |spec: &Mxfp4Spec| -> (Vec<Vec<u8>>, Vec<u8>) {
                    let (codes, scales) = spec.codes();
                    let rows = codes
                        .chunks_exact(32)
                        .map(|b| (0..16).map(|k| b[2 * k] | (b[2 * k + 1] << 4)).collect())
                        .collect();
                    (rows, scales)
                };
                let (gb, gs) = hf_blocks(gate);
                let (ub, us) = hf_blocks(up);
                let per_row = h / 32;
                let (mut blocks, mut scales) = (Vec::new(), Vec::new());
                for x in 0..e {
                    for r in 0..i {
                        for (b, s) in [(&gb, &gs), (&ub, &us)] {
                            let first = (x * i + r) * per_row;
                            for k in first..first + per_row {
                                blocks.extend_from_slice(&b[k]);
                                scales.push(s[k]);
                            }
                        }
                    }
                }
                tensors.push((
                    format!("{prefix}gate_up_proj_blocks"),
                    "U8",
                    vec![e, 2 * i, per_row, 16],
                    blocks,
                ));
                tensors.push((
                    format!("{prefix}gate_up_proj_scales"),
                    "U8",
                    vec![e, 2 * i, per_row],
                    scales,
                ));
                let (db, ds) = hf_blocks(down);
                tensors.push((
                    format!("{prefix}down_proj_blocks"),
                    "U8",
                    vec![e, h, i / 32, 16],
                    db.concat(),
                ));
                tensors.push((
                    format!("{prefix}down_proj_scales"),
                    "U8",
                    vec![e, h, i / 32],
                    ds,
                ));
            }
        }
    }
    write_raw_safetensors(&dir.join("model.safetensors"), &tensors);
}
