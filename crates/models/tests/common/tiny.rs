//! A random-weight tiny Llama-family model, written by the tests themselves in every supported
//! container, and a deliberately naive reference forward pass (contiguous KV, materialized
//! softmax, f64 accumulation) to compare the paged model against.

use std::collections::BTreeMap;
use std::path::Path;

use tokenmill_gguf::{GgufWriter, MetadataValue};
use tokenmill_kernels::{bf16_to_f32, f32_to_bf16};

#[derive(Debug, Clone, Copy)]
pub struct TinyConfig {
    /// GGUF architecture and HF `model_type`: `llama`, `mistral` (the same block, no window
    /// here) or `qwen2` (with `qwen2` set).
    pub arch: &'static str,
    pub qwen2: bool,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub theta: f64,
    pub eps: f64,
    pub tied: bool,
}

impl TinyConfig {
    pub fn llama() -> TinyConfig {
        TinyConfig {
            arch: "llama",
            qwen2: false,
            vocab: 96,
            hidden: 32,
            intermediate: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            theta: 10_000.0,
            eps: 1e-5,
            tied: false,
        }
    }

    pub fn qwen2() -> TinyConfig {
        TinyConfig {
            arch: "qwen2",
            qwen2: true,
            tied: true,
            ..TinyConfig::llama()
        }
    }

    /// Llama's block under Mistral's names (no sliding window).
    pub fn mistral() -> TinyConfig {
        TinyConfig {
            arch: "mistral",
            ..TinyConfig::llama()
        }
    }

    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

pub struct TinyLayer {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub bq: Vec<f32>,
    pub bk: Vec<f32>,
    pub bv: Vec<f32>,
    pub wo: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Vec<f32>,
    pub w_up: Vec<f32>,
    pub w_down: Vec<f32>,
}

/// HF-layout weights (`[out, in]`, Q/K rows in HF's rotate-half order).
pub struct TinyModel {
    pub config: TinyConfig,
    pub embed: Vec<f32>,
    pub layers: Vec<TinyLayer>,
    pub norm: Vec<f32>,
    pub lm_head: Vec<f32>,
}

/// A small deterministic PRNG so the weights need no extra dependency.
pub struct SplitMix(pub u64);

impl SplitMix {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next() * scale).collect()
    }

    fn norm(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| 1.0 + 0.2 * self.next()).collect()
    }
}

impl TinyModel {
    pub fn random(config: TinyConfig, seed: u64) -> TinyModel {
        let mut rng = SplitMix(seed);
        let (h, i) = (config.hidden, config.intermediate);
        let (q, kv) = (config.q_dim(), config.kv_dim());
        let bias = |rng: &mut SplitMix, len| {
            if config.qwen2 {
                rng.vec(len, 0.3)
            } else {
                vec![0.0; len]
            }
        };
        let layers = (0..config.layers)
            .map(|_| TinyLayer {
                attn_norm: rng.norm(h),
                wq: rng.vec(q * h, 0.4),
                wk: rng.vec(kv * h, 0.4),
                wv: rng.vec(kv * h, 0.4),
                bq: bias(&mut rng, q),
                bk: bias(&mut rng, kv),
                bv: bias(&mut rng, kv),
                wo: rng.vec(h * q, 0.3),
                ffn_norm: rng.norm(h),
                w_gate: rng.vec(i * h, 0.3),
                w_up: rng.vec(i * h, 0.3),
                w_down: rng.vec(h * i, 0.3),
            })
            .collect();
        let embed = rng.vec(config.vocab * h, 1.0);
        let lm_head = if config.tied {
            embed.clone()
        } else {
            rng.vec(config.vocab * h, 0.5)
        };
        TinyModel {
            config,
            embed,
            layers,
            norm: rng.norm(h),
            lm_head,
        }
    }

    /// Every weight rounded to bf16, so a bf16 checkpoint of this model is exact.
    pub fn rounded_to_bf16(&self) -> TinyModel {
        let round = |v: &Vec<f32>| v.iter().map(|&x| bf16_to_f32(f32_to_bf16(x))).collect();
        TinyModel {
            config: self.config,
            embed: round(&self.embed),
            layers: self
                .layers
                .iter()
                .map(|l| TinyLayer {
                    attn_norm: round(&l.attn_norm),
                    wq: round(&l.wq),
                    wk: round(&l.wk),
                    wv: round(&l.wv),
                    bq: round(&l.bq),
                    bk: round(&l.bk),
                    bv: round(&l.bv),
                    wo: round(&l.wo),
                    ffn_norm: round(&l.ffn_norm),
                    w_gate: round(&l.w_gate),
                    w_up: round(&l.w_up),
                    w_down: round(&l.w_down),
                })
                .collect(),
            norm: round(&self.norm),
            lm_head: round(&self.lm_head),
        }
    }

    fn config_json(&self) -> String {
        let c = &self.config;
        serde_json::json!({
            "architectures": [match c.arch {
                "qwen2" => "Qwen2ForCausalLM",
                "mistral" => "MistralForCausalLM",
                _ => "LlamaForCausalLM",
            }],
            "model_type": c.arch,
            "vocab_size": c.vocab,
            "hidden_size": c.hidden,
            "intermediate_size": c.intermediate,
            "num_hidden_layers": c.layers,
            "num_attention_heads": c.heads,
            "num_key_value_heads": c.kv_heads,
            "rms_norm_eps": c.eps,
            "rope_theta": c.theta,
            "max_position_embeddings": 256,
            "tie_word_embeddings": c.tied,
        })
        .to_string()
    }

    /// `(HF name, shape, values)` of every tensor of the checkpoint.
    fn hf_tensors(&self) -> Vec<(String, Vec<usize>, &[f32])> {
        let c = &self.config;
        let (h, i, q, kv) = (c.hidden, c.intermediate, c.q_dim(), c.kv_dim());
        let mut tensors: Vec<(String, Vec<usize>, &[f32])> = vec![
            (
                "model.embed_tokens.weight".into(),
                vec![c.vocab, h],
                &self.embed,
            ),
            ("model.norm.weight".into(), vec![h], &self.norm),
        ];
        if !c.tied {
            tensors.push(("lm_head.weight".into(), vec![c.vocab, h], &self.lm_head));
        }
        for (index, l) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{index}.");
            tensors.extend([
                (
                    format!("{p}input_layernorm.weight"),
                    vec![h],
                    &l.attn_norm[..],
                ),
                (format!("{p}self_attn.q_proj.weight"), vec![q, h], &l.wq[..]),
                (
                    format!("{p}self_attn.k_proj.weight"),
                    vec![kv, h],
                    &l.wk[..],
                ),
                (
                    format!("{p}self_attn.v_proj.weight"),
                    vec![kv, h],
                    &l.wv[..],
                ),
                (format!("{p}self_attn.o_proj.weight"), vec![h, q], &l.wo[..]),
                (
                    format!("{p}post_attention_layernorm.weight"),
                    vec![h],
                    &l.ffn_norm[..],
                ),
                (
                    format!("{p}mlp.gate_proj.weight"),
                    vec![i, h],
                    &l.w_gate[..],
                ),
                (format!("{p}mlp.up_proj.weight"), vec![i, h], &l.w_up[..]),
                (
                    format!("{p}mlp.down_proj.weight"),
                    vec![h, i],
                    &l.w_down[..],
                ),
            ]);
            if c.qwen2 {
                tensors.extend([
                    (format!("{p}self_attn.q_proj.bias"), vec![q], &l.bq[..]),
                    (format!("{p}self_attn.k_proj.bias"), vec![kv], &l.bk[..]),
                    (format!("{p}self_attn.v_proj.bias"), vec![kv], &l.bv[..]),
                ]);
            }
        }
        tensors
    }

    /// Writes `config.json` and the weights as safetensors, `dtype` "F32" or "BF16", in
    /// `shards` files (with an index when more than one).
    pub fn write_hf_directory(&self, dir: &Path, dtype: &str, shards: usize) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), self.config_json()).unwrap();
        let tensors = self.hf_tensors();
        let per_shard = tensors.len().div_ceil(shards);
        let mut weight_map = BTreeMap::new();
        for (shard_index, chunk) in tensors.chunks(per_shard).enumerate() {
            let file_name = if shards == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", shard_index + 1, shards)
            };
            for (name, _, _) in chunk {
                weight_map.insert(name.clone(), file_name.clone());
            }
            write_safetensors(&dir.join(&file_name), chunk, dtype);
        }
        if shards > 1 {
            let index =
                serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
            std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        }
    }

    /// Writes a GGUF with f32 tensors as llama.cpp's converter would: GGML dim order, and for
    /// Llama the Q/K rows permuted so adjacent-pair RoPE reproduces HF's rotate-half.
    pub fn write_gguf(&self, path: &Path) {
        self.write_gguf_with(path, |_| {});
    }

    /// [`TinyModel::write_gguf`] with extra metadata or tensors added by `extra`.
    pub fn write_gguf_with(&self, path: &Path, extra: impl FnOnce(&mut GgufWriter)) {
        let c = &self.config;
        let arch = c.arch;
        let (h, i, q, kv) = (
            c.hidden as u64,
            c.intermediate as u64,
            c.q_dim() as u64,
            c.kv_dim() as u64,
        );
        let mut writer = GgufWriter::new();
        let u32v = |v: usize| MetadataValue::U32(v as u32);
        writer
            .add_metadata("general.architecture", MetadataValue::String(arch.into()))
            .add_metadata(&format!("{arch}.block_count"), u32v(c.layers))
            .add_metadata(&format!("{arch}.context_length"), u32v(256))
            .add_metadata(&format!("{arch}.embedding_length"), u32v(c.hidden))
            .add_metadata(&format!("{arch}.feed_forward_length"), u32v(c.intermediate))
            .add_metadata(&format!("{arch}.attention.head_count"), u32v(c.heads))
            .add_metadata(&format!("{arch}.attention.head_count_kv"), u32v(c.kv_heads))
            .add_metadata(
                &format!("{arch}.rope.freq_base"),
                MetadataValue::F32(c.theta as f32),
            )
            .add_metadata(
                &format!("{arch}.attention.layer_norm_rms_epsilon"),
                MetadataValue::F32(c.eps as f32),
            )
            .add_metadata(&format!("{arch}.vocab_size"), u32v(c.vocab));
        writer.add_f32_tensor("token_embd.weight", &[h, c.vocab as u64], &self.embed);
        writer.add_f32_tensor("output_norm.weight", &[h], &self.norm);
        if !c.tied {
            writer.add_f32_tensor("output.weight", &[h, c.vocab as u64], &self.lm_head);
        }
        for (index, l) in self.layers.iter().enumerate() {
            let name = |short: &str| format!("blk.{index}.{short}");
            let (wq, wk) = if c.qwen2 {
                (l.wq.clone(), l.wk.clone())
            } else {
                (
                    permute_for_gguf(&l.wq, c.heads, c.head_dim, c.hidden),
                    permute_for_gguf(&l.wk, c.kv_heads, c.head_dim, c.hidden),
                )
            };
            writer
                .add_f32_tensor(&name("attn_norm.weight"), &[h], &l.attn_norm)
                .add_f32_tensor(&name("attn_q.weight"), &[h, q], &wq)
                .add_f32_tensor(&name("attn_k.weight"), &[h, kv], &wk)
                .add_f32_tensor(&name("attn_v.weight"), &[h, kv], &l.wv)
                .add_f32_tensor(&name("attn_output.weight"), &[q, h], &l.wo)
                .add_f32_tensor(&name("ffn_norm.weight"), &[h], &l.ffn_norm)
                .add_f32_tensor(&name("ffn_gate.weight"), &[h, i], &l.w_gate)
                .add_f32_tensor(&name("ffn_up.weight"), &[h, i], &l.w_up)
                .add_f32_tensor(&name("ffn_down.weight"), &[i, h], &l.w_down);
            if c.qwen2 {
                writer
                    .add_f32_tensor(&name("attn_q.bias"), &[q], &l.bq)
                    .add_f32_tensor(&name("attn_k.bias"), &[kv], &l.bk)
                    .add_f32_tensor(&name("attn_v.bias"), &[kv], &l.bv);
            }
        }
        extra(&mut writer);
        writer.write_to(path).unwrap();
    }

    /// Logits for every position of `tokens`, computed the obvious way.
    pub fn reference_logits(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        let c = &self.config;
        let (h, q_dim, kv_dim, hd) = (c.hidden, c.q_dim(), c.kv_dim(), c.head_dim);
        let n = tokens.len();
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                self.embed[t as usize * h..(t as usize + 1) * h]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect()
            })
            .collect();
        for l in &self.layers {
            let mut keys = Vec::with_capacity(n);
            let mut values = Vec::with_capacity(n);
            let mut queries = Vec::with_capacity(n);
            for (position, row) in x.iter().enumerate() {
                let normed = rms_norm(row, &l.attn_norm, c.eps);
                let mut qv = add(&linear(&l.wq, &normed, q_dim), &l.bq);
                let mut kv = add(&linear(&l.wk, &normed, kv_dim), &l.bk);
                let vv = add(&linear(&l.wv, &normed, kv_dim), &l.bv);
                rope_rotate_half(&mut qv, hd, position, c.theta);
                rope_rotate_half(&mut kv, hd, position, c.theta);
                queries.push(qv);
                keys.push(kv);
                values.push(vv);
            }
            let group = c.heads / c.kv_heads;
            for position in 0..n {
                let mut attended = vec![0.0f64; q_dim];
                for head in 0..c.heads {
                    let kv_head = head / group;
                    let qh = &queries[position][head * hd..(head + 1) * hd];
                    let scores: Vec<f64> = (0..=position)
                        .map(|j| {
                            let kh = &keys[j][kv_head * hd..(kv_head + 1) * hd];
                            qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for (j, w) in weights.iter().enumerate() {
                        let vh = &values[j][kv_head * hd..(kv_head + 1) * hd];
                        for d in 0..hd {
                            attended[head * hd + d] += w / total * vh[d];
                        }
                    }
                }
                let projected = linear(&l.wo, &attended, h);
                for d in 0..h {
                    x[position][d] += projected[d];
                }
            }
            for row in &mut x {
                let normed = rms_norm(row, &l.ffn_norm, c.eps);
                let gate = linear(&l.w_gate, &normed, c.intermediate);
                let up = linear(&l.w_up, &normed, c.intermediate);
                let activated: Vec<f64> = gate
                    .iter()
                    .zip(&up)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let down = linear(&l.w_down, &activated, h);
                for d in 0..h {
                    row[d] += down[d];
                }
            }
        }
        x.iter()
            .map(|row| {
                let normed = rms_norm(row, &self.norm, c.eps);
                linear(&self.lm_head, &normed, c.vocab)
                    .iter()
                    .map(|&v| v as f32)
                    .collect()
            })
            .collect()
    }
}

fn rms_norm(x: &[f64], weight: &[f32], eps: f64) -> Vec<f64> {
    let mean = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inverse = 1.0 / (mean + eps).sqrt();
    x.iter()
        .zip(weight)
        .map(|(v, &w)| v * inverse * f64::from(w))
        .collect()
}

fn linear(weight: &[f32], x: &[f64], out: usize) -> Vec<f64> {
    let inner = x.len();
    (0..out)
        .map(|row| {
            weight[row * inner..(row + 1) * inner]
                .iter()
                .zip(x)
                .map(|(&w, v)| f64::from(w) * v)
                .sum()
        })
        .collect()
}

fn add(x: &[f64], bias: &[f32]) -> Vec<f64> {
    x.iter().zip(bias).map(|(v, &b)| v + f64::from(b)).collect()
}

/// HF's `rotate_half` RoPE on every head of `x`.
fn rope_rotate_half(x: &mut [f64], head_dim: usize, position: usize, theta: f64) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let angle = position as f64 / theta.powf((2 * i) as f64 / head_dim as f64);
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * angle.cos() - b * angle.sin();
            head[i + half] = a * angle.sin() + b * angle.cos();
        }
    }
}

/// llama.cpp's `permute`: within each head, rows `[x0..x_{d/2}, y0..y_{d/2}]` become
/// interleaved `[x0, y0, x1, y1, ...]`.
pub fn permute_for_gguf(weight: &[f32], heads: usize, head_dim: usize, columns: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0; weight.len()];
    for head in 0..heads {
        for j in 0..half {
            for t in 0..2 {
                let source = head * head_dim + t * half + j;
                let target = head * head_dim + j * 2 + t;
                out[target * columns..(target + 1) * columns]
                    .copy_from_slice(&weight[source * columns..(source + 1) * columns]);
            }
        }
    }
    out
}

/// A minimal safetensors writer: 8-byte header length, JSON header, little-endian data.
pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, &[f32])], dtype: &str) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let start = data.len();
        for &value in values.iter() {
            match dtype {
                "F32" => data.extend_from_slice(&value.to_le_bytes()),
                "BF16" => data.extend_from_slice(&f32_to_bf16(value).to_le_bytes()),
                other => panic!("test writer does not encode {other}"),
            }
        }
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut header_bytes = serde_json::Value::Object(header).to_string().into_bytes();
    while !header_bytes.len().is_multiple_of(8) {
        header_bytes.push(b' ');
    }
    let mut file = (header_bytes.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header_bytes);
    file.extend_from_slice(&data);
    std::fs::write(path, file).unwrap();
}
