//! The Qwen3.5 fixtures (`fixtures/qwen35_*.json`, written by
//! `scripts/reference/make_qwen35_fixtures.py`): a random-weight `Qwen3_5ForCausalLM`'s
//! config and formula-weight tensors (HF names), with transformers' and llama.cpp's greedy
//! runs of it. Rebuilt here without Python: the HF directory as `save_pretrained` wrote it, and
//! the GGUF as llama.cpp's `convert_hf_to_gguf.py --outtype f32` makes it (renames, `(1 + w)`
//! norms folded, `A_log` as `-exp(A_log)`, the convolution squeezed, value heads reordered from
//! grouped to tiled: the tensors come out bitwise equal to the converter's, checked once
//! against its output); plus the hybrid cache and batch helpers every Qwen3.5 test drives.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokenmill_gguf::{GgufWriter, MetadataValue};
use tokenmill_models::{
    load_model, BatchInput, CausalLm, KvCacheStorage, LoadOptions, ModelSource, StateCacheStorage,
    ThreadPool, Workspace,
};

use super::common::family::{fnv1a, formula_weights, Case};

#[derive(Deserialize)]
pub struct Qwen35Fixture {
    pub config: serde_json::Value,
    pub tensors: Vec<TensorSpec>,
    pub transformers: Vec<Case>,
    pub llama_cpp: Vec<Case>,
}

#[derive(Deserialize, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub scale: f32,
    pub offset: f32,
}

impl TensorSpec {
    pub fn values(&self) -> Vec<f32> {
        let count = self.shape.iter().product();
        formula_weights(fnv1a(&self.name), count, self.scale, self.offset)
    }
}

pub fn load_fixture(name: &str) -> Qwen35Fixture {
    // The models crate's fixtures, also when another crate's tests include this file.
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = if own.join(format!("{name}.json")).exists() {
        own
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
    };
    let path = dir.join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A directory of the test's own under the target's tmp dir.
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(test);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The fixture's checkpoint as an HF directory (`config.json` + F32 safetensors), with
/// `edit(name, values)` applied to each tensor first (a negative control perturbs one).
pub fn write_hf_directory(
    fixture: &Qwen35Fixture,
    dir: &Path,
    edit: impl Fn(&str, &mut Vec<f32>),
) -> PathBuf {
    write_hf_checkpoint(fixture, &fixture.config, dir, |name| name.to_string(), edit)
}

/// [`write_hf_directory`] with another `config.json` and the tensors stored under
/// `rename(name)` (their values still those of `name`).
pub fn write_hf_checkpoint(
    fixture: &Qwen35Fixture,
    config: &serde_json::Value,
    dir: &Path,
    rename: impl Fn(&str) -> String,
    edit: impl Fn(&str, &mut Vec<f32>),
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = fixture
        .tensors
        .iter()
        .map(|spec| {
            let mut values = spec.values();
            edit(&spec.name, &mut values);
            (rename(&spec.name), spec.shape.clone(), values)
        })
        .collect();
    let borrowed: Vec<(String, Vec<usize>, &[f32])> = tensors
        .iter()
        .map(|(name, shape, values)| (name.clone(), shape.clone(), values.as_slice()))
        .collect();
    super::common::tiny::write_safetensors(&dir.join("model.safetensors"), &borrowed, "F32");
    dir.to_path_buf()
}

fn config_usize(config: &serde_json::Value, key: &str) -> usize {
    config[key].as_u64().unwrap() as usize
}

/// The GGUF name of an HF tensor and whether its `(1 + w)` norm gets the 1 added.
fn gguf_name(hf: &str) -> (String, bool) {
    match hf {
        "model.embed_tokens.weight" => return ("token_embd.weight".into(), false),
        "model.norm.weight" => return ("output_norm.weight".into(), true),
        "lm_head.weight" => return ("output.weight".into(), false),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, short) = rest.split_once('.').unwrap();
    let (name, shift) = match short {
        "input_layernorm.weight" => ("attn_norm.weight", true),
        "post_attention_layernorm.weight" => ("post_attention_norm.weight", true),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", false),
        "mlp.up_proj.weight" => ("ffn_up.weight", false),
        "mlp.down_proj.weight" => ("ffn_down.weight", false),
        "self_attn.q_proj.weight" => ("attn_q.weight", false),
        "self_attn.k_proj.weight" => ("attn_k.weight", false),
        "self_attn.v_proj.weight" => ("attn_v.weight", false),
        "self_attn.o_proj.weight" => ("attn_output.weight", false),
        "self_attn.q_norm.weight" => ("attn_q_norm.weight", true),
        "self_attn.k_norm.weight" => ("attn_k_norm.weight", true),
        "linear_attn.in_proj_qkv.weight" => ("attn_qkv.weight", false),
        "linear_attn.in_proj_z.weight" => ("attn_gate.weight", false),
        "linear_attn.in_proj_b.weight" => ("ssm_beta.weight", false),
        "linear_attn.in_proj_a.weight" => ("ssm_alpha.weight", false),
        "linear_attn.conv1d.weight" => ("ssm_conv1d.weight", false),
        "linear_attn.dt_bias" => ("ssm_dt.bias", false),
        "linear_attn.A_log" => ("ssm_a", false),
        "linear_attn.norm.weight" => ("ssm_norm.weight", false),
        "linear_attn.out_proj.weight" => ("ssm_out.weight", false),
        other => panic!("no GGUF name for {other}"),
    };
    (format!("blk.{layer}.{name}"), shift)
}

/// Grouped-to-tiled value-head order of `rows` (each `width` values) in `[k][r][head]` row
/// blocks of `head` rows: llama.cpp's `_reorder_v_heads` along the rows.
fn tile_rows(values: &[f32], k: usize, r: usize, head: usize, width: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    let block = head * width;
    for kh in 0..k {
        for j in 0..r {
            let from = (kh * r + j) * block;
            let to = (j * k + kh) * block;
            out[to..to + block].copy_from_slice(&values[from..from + block]);
        }
    }
    out
}

/// [`tile_rows`] along the columns of a `[rows][k * r * head]` matrix.
fn tile_columns(values: &[f32], k: usize, r: usize, head: usize) -> Vec<f32> {
    let width = k * r * head;
    let mut out = vec![0.0; values.len()];
    for (row, out_row) in values.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        out_row.copy_from_slice(&tile_rows(row, k, r, head, 1));
    }
    out
}

/// The fixture's checkpoint as llama.cpp's converter writes it (F32, no tokenizer: the
/// vocabulary size comes from `token_embd.weight`).
pub fn write_gguf(fixture: &Qwen35Fixture, path: &Path) {
    let c = &fixture.config;
    let arch = "qwen35";
    let (k_heads, v_heads) = (
        config_usize(c, "linear_num_key_heads"),
        config_usize(c, "linear_num_value_heads"),
    );
    let (dk, dv) = (
        config_usize(c, "linear_key_head_dim"),
        config_usize(c, "linear_value_head_dim"),
    );
    let r = v_heads / k_heads;
    let head_dim = config_usize(c, "head_dim");
    let layers = config_usize(c, "num_hidden_layers");
    let partial = c["rope_parameters"]["partial_rotary_factor"]
        .as_f64()
        .unwrap();
    let mut writer = GgufWriter::new();
    writer.add_metadata("general.architecture", MetadataValue::String(arch.into()));
    let u32s = [
        ("block_count", layers),
        ("context_length", config_usize(c, "max_position_embeddings")),
        ("embedding_length", config_usize(c, "hidden_size")),
        ("feed_forward_length", config_usize(c, "intermediate_size")),
        (
            "attention.head_count",
            config_usize(c, "num_attention_heads"),
        ),
        (
            "attention.head_count_kv",
            config_usize(c, "num_key_value_heads"),
        ),
        ("attention.key_length", head_dim),
        ("attention.value_length", head_dim),
        ("ssm.conv_kernel", config_usize(c, "linear_conv_kernel_dim")),
        ("ssm.state_size", dk),
        ("ssm.group_count", k_heads),
        ("ssm.time_step_rank", v_heads),
        ("ssm.inner_size", v_heads * dv),
        ("full_attention_interval", 4),
        ("rope.dimension_count", (head_dim as f64 * partial) as usize),
    ];
    for (key, value) in u32s {
        writer.add_metadata(&format!("{arch}.{key}"), MetadataValue::U32(value as u32));
    }
    let f32s = [
        (
            "rope.freq_base",
            c["rope_parameters"]["rope_theta"].as_f64().unwrap(),
        ),
        (
            "attention.layer_norm_rms_epsilon",
            c["rms_norm_eps"].as_f64().unwrap(),
        ),
    ];
    for (key, value) in f32s {
        writer.add_metadata(&format!("{arch}.{key}"), MetadataValue::F32(value as f32));
    }
    let sections = [11u32, 11, 10, 0].map(MetadataValue::U32).to_vec();
    writer.add_metadata(
        &format!("{arch}.rope.dimension_sections"),
        MetadataValue::Array(sections),
    );
    let recurrent: Vec<MetadataValue> = c["layer_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kind| MetadataValue::Bool(kind == "linear_attention"))
        .collect();
    writer.add_metadata(
        &format!("{arch}.attention.recurrent_layers"),
        MetadataValue::Array(recurrent),
    );
    let key_dim = k_heads * dk;
    for spec in &fixture.tensors {
        let (name, shift) = gguf_name(&spec.name);
        let mut values = spec.values();
        let mut shape = spec.shape.clone();
        if shift {
            values.iter_mut().for_each(|v| *v += 1.0);
        }
        let short = spec.name.rsplit_once("linear_attn.").map(|(_, s)| s);
        match short {
            Some("A_log") => values.iter_mut().for_each(|v| *v = -v.exp()),
            Some("conv1d.weight") => shape.retain(|&d| d != 1),
            _ => {}
        }
        if r > 1 {
            let width = *shape.last().unwrap();
            values = match short {
                Some("in_proj_qkv.weight") => {
                    let (qk, v) = values.split_at(2 * key_dim * width);
                    let mut all = qk.to_vec();
                    all.extend(tile_rows(v, k_heads, r, dv, width));
                    all
                }
                Some("conv1d.weight") => {
                    let (qk, v) = values.split_at(2 * key_dim * width);
                    let mut all = qk.to_vec();
                    all.extend(tile_rows(v, k_heads, r, dv, width));
                    all
                }
                Some("in_proj_z.weight") => tile_rows(&values, k_heads, r, dv, width),
                Some("in_proj_b.weight") | Some("in_proj_a.weight") => {
                    tile_rows(&values, k_heads, r, 1, width)
                }
                Some("dt_bias") | Some("A_log") => tile_rows(&values, k_heads, r, 1, 1),
                Some("out_proj.weight") => tile_columns(&values, k_heads, r, dv),
                _ => values,
            };
        }
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        writer.add_f32_tensor(&name, &dims, &values);
    }
    writer.write_to(path).unwrap();
}

pub fn load(source: ModelSource) -> Box<dyn CausalLm> {
    load_model(&source, &LoadOptions::default()).unwrap()
}

pub fn pool() -> ThreadPool {
    ThreadPool::new(2)
}

/// A KV cache of `blocks` blocks of `block_size` for the attention layers and `slots`
/// recurrent-state slots.
pub fn hybrid_cache(
    model: &dyn CausalLm,
    blocks: usize,
    block_size: usize,
    slots: usize,
) -> KvCacheStorage {
    KvCacheStorage::new(model.kv_layout(), blocks, block_size)
        .with_state(StateCacheStorage::new(model.state_layout(), slots))
}

pub const BLOCK_SIZE: usize = 16;

/// One sequence the runner drives: its tokens, how many are in the cache, its blocks and
/// its state slot.
pub struct Sequence {
    pub tokens: Vec<u32>,
    pub computed: usize,
    pub blocks: Vec<u32>,
    pub slot: u32,
}

/// Runs one step: each `(sequence, count)` contributes its next `count` tokens (logits for
/// the last); returns one logits row per entry.
pub fn step(
    model: &dyn CausalLm,
    pool: &ThreadPool,
    kv: &mut KvCacheStorage,
    workspace: &mut Workspace,
    runs: &mut [(&mut Sequence, usize)],
) -> Vec<Vec<f32>> {
    let mut batch = BatchInput::default();
    for (sequence, count) in runs.iter() {
        let from = sequence.computed;
        batch
            .add_sequence(
                &sequence.tokens[from..from + count],
                from,
                &sequence.blocks,
                BLOCK_SIZE,
                true,
            )
            .unwrap();
        batch.state_slots.push(sequence.slot);
    }
    let mut logits = Vec::new();
    model
        .forward(pool, &batch, kv, workspace, &mut logits)
        .unwrap();
    for (sequence, count) in runs.iter_mut() {
        sequence.computed += *count;
    }
    let vocab = model.config().vocab_size;
    logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

/// Feeds `prompt` in steps of `chunks` tokens (blocks 3, 5, 7 of a 16-block cache), beside
/// `other` (blocks 9, 11) while `other` has tokens left for the same chunk; returns the
/// prompt's logits row of each step.
pub fn prompt_in_chunks(
    model: &dyn CausalLm,
    prompt: &[u32],
    other: Option<&[u32]>,
    chunks: &[usize],
) -> Vec<Vec<f32>> {
    let pool = pool();
    let mut kv = hybrid_cache(model, 16, BLOCK_SIZE, 1);
    let mut workspace = Workspace::new();
    let mut seq = Sequence {
        tokens: prompt.to_vec(),
        computed: 0,
        blocks: vec![3, 5, 7],
        slot: 0,
    };
    let mut second = Sequence {
        tokens: other.unwrap_or_default().to_vec(),
        computed: 0,
        blocks: vec![9, 11],
        slot: 0,
    };
    let mut rows = Vec::new();
    for &count in chunks {
        let out = if other.is_some() && second.computed + count <= second.tokens.len() {
            let mut runs = [(&mut seq, count), (&mut second, count)];
            step(model, &pool, &mut kv, &mut workspace, &mut runs)
        } else {
            let mut runs = [(&mut seq, count)];
            step(model, &pool, &mut kv, &mut workspace, &mut runs)
        };
        rows.push(out[0].clone());
    }
    rows
}

/// The logits after every token of `prompt + forced[..len - 1]` from position `first` on
/// (`prompt.len() - 1`: the rows that predict `forced`), the whole run in one step.
pub fn teacher_forced(model: &dyn CausalLm, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(&forced[..forced.len() - 1]);
    let blocks = tokens.len().div_ceil(BLOCK_SIZE);
    let mut kv = hybrid_cache(model, blocks, BLOCK_SIZE, 1);
    let mut batch = BatchInput::default();
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    batch
        .add_sequence(&tokens, 0, &table, BLOCK_SIZE, false)
        .unwrap();
    batch.state_slots.push(0);
    batch.logits_indices = (prompt.len() as u32 - 1..tokens.len() as u32).collect();
    let mut logits = Vec::new();
    model
        .forward(&pool(), &batch, &mut kv, &mut Workspace::new(), &mut logits)
        .unwrap();
    let vocab = model.config().vocab_size;
    logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

/// The index of the largest value (the first of equals).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (index, &value) in row.iter().enumerate() {
        if value > row[best] {
            best = index;
        }
    }
    best as u32
}

/// The tensors `Qwen3_5ForCausalLM` has for `config` (HF names, shapes, and the formula
/// parameters `make_qwen35_fixtures.py` gives them), for checkpoints of other shapes than the
/// fixtures' (the fixture tests check this against their lists).
pub fn tensor_specs(config: &serde_json::Value) -> Vec<TensorSpec> {
    let get = |key: &str| config_usize(config, key);
    let (hidden, inter, vocab) = (
        get("hidden_size"),
        get("intermediate_size"),
        get("vocab_size"),
    );
    let (heads, kv_heads, head_dim) = (
        get("num_attention_heads"),
        get("num_key_value_heads"),
        get("head_dim"),
    );
    let (k_heads, v_heads, dk, dv) = (
        get("linear_num_key_heads"),
        get("linear_num_value_heads"),
        get("linear_key_head_dim"),
        get("linear_value_head_dim"),
    );
    let conv_dim = 2 * k_heads * dk + v_heads * dv;
    let mut specs = Vec::new();
    let mut push = |name: String, shape: Vec<usize>| {
        let (scale, offset) = if name.ends_with("linear_attn.norm.weight") {
            (0.1, 1.0)
        } else if name.ends_with("norm.weight") || name.ends_with("layernorm.weight") {
            (0.1, 0.0)
        } else if name.ends_with("A_log") || name.ends_with("dt_bias") {
            (1.0, 0.0)
        } else if name.ends_with("conv1d.weight") {
            (0.5, 0.0)
        } else if name.ends_with("embed_tokens.weight") {
            (1.0, 0.0)
        } else {
            ((3.0 / *shape.last().unwrap() as f64).sqrt() as f32, 0.0)
        };
        specs.push(TensorSpec {
            name,
            shape,
            scale,
            offset,
        });
    };
    push("model.embed_tokens.weight".into(), vec![vocab, hidden]);
    for (layer, kind) in config["layer_types"].as_array().unwrap().iter().enumerate() {
        let p = format!("model.layers.{layer}.");
        if kind == "linear_attention" {
            let l = format!("{p}linear_attn.");
            push(format!("{l}dt_bias"), vec![v_heads]);
            push(format!("{l}A_log"), vec![v_heads]);
            push(
                format!("{l}conv1d.weight"),
                vec![conv_dim, 1, get("linear_conv_kernel_dim")],
            );
            push(format!("{l}norm.weight"), vec![dv]);
            push(format!("{l}out_proj.weight"), vec![hidden, v_heads * dv]);
            push(format!("{l}in_proj_qkv.weight"), vec![conv_dim, hidden]);
            push(format!("{l}in_proj_z.weight"), vec![v_heads * dv, hidden]);
            push(format!("{l}in_proj_b.weight"), vec![v_heads, hidden]);
            push(format!("{l}in_proj_a.weight"), vec![v_heads, hidden]);
        } else {
            let a = format!("{p}self_attn.");
            push(
                format!("{a}q_proj.weight"),
                vec![2 * heads * head_dim, hidden],
            );
            push(
                format!("{a}k_proj.weight"),
                vec![kv_heads * head_dim, hidden],
            );
            push(
                format!("{a}v_proj.weight"),
                vec![kv_heads * head_dim, hidden],
            );
            push(format!("{a}o_proj.weight"), vec![hidden, heads * head_dim]);
            push(format!("{a}q_norm.weight"), vec![head_dim]);
            push(format!("{a}k_norm.weight"), vec![head_dim]);
        }
        push(format!("{p}mlp.gate_proj.weight"), vec![inter, hidden]);
        push(format!("{p}mlp.up_proj.weight"), vec![inter, hidden]);
        push(format!("{p}mlp.down_proj.weight"), vec![hidden, inter]);
        push(format!("{p}input_layernorm.weight"), vec![hidden]);
        push(format!("{p}post_attention_layernorm.weight"), vec![hidden]);
    }
    push("model.norm.weight".into(), vec![hidden]);
    if !config["tie_word_embeddings"].as_bool().unwrap_or(false) {
        push("lm_head.weight".into(), vec![vocab, hidden]);
    }
    specs
}

/// Teacher-forces every case along the reference's greedy path; checks its top logits within
/// `max_difference` and the greedy picks where the reference's top two differ by more than
/// `decisive_margin`; returns the largest difference.
pub fn check_cases(
    model: &dyn CausalLm,
    cases: &[Case],
    what: &str,
    max_difference: f32,
    decisive_margin: f32,
) -> f32 {
    let mut worst = 0.0f32;
    for (index, case) in cases.iter().enumerate() {
        let rows = teacher_forced(model, &case.prompt_ids, &case.greedy_ids);
        for (step, (row, top)) in rows.iter().zip(&case.top_logits).enumerate() {
            for &(token, expected) in top {
                let difference = (row[token as usize] - expected).abs();
                worst = worst.max(difference);
                assert!(
                    difference <= max_difference,
                    "{what}: case {index} step {step} token {token}: {} vs {expected}",
                    row[token as usize]
                );
            }
            if top[0].1 - top[1].1 > decisive_margin {
                assert_eq!(argmax(row), top[0].0, "{what}: case {index} step {step}");
            }
        }
    }
    worst
}

/// The largest difference from a reference's top logits over all cases.
pub fn widest_difference(model: &dyn CausalLm, cases: &[Case]) -> f32 {
    let mut worst = 0.0f32;
    for case in cases {
        let rows = teacher_forced(model, &case.prompt_ids, &case.greedy_ids);
        for (row, top) in rows.iter().zip(&case.top_logits) {
            for &(token, expected) in top {
                worst = worst.max((row[token as usize] - expected).abs());
            }
        }
    }
    worst
}
