//! BERT-style encoders (all-MiniLM, BGE, E5, cross-encoder rerankers): word + absolute
//! position + token-type embeddings and a LayerNorm, then per layer bidirectional attention
//! and an exact-GELU MLP, each followed by residual add and LayerNorm (post-norm). Pooled
//! per sequence into an embedding, or, for `BertForSequenceClassification`, the `[CLS]` row
//! through the tanh pooler and the classifier into class logits.

use std::path::Path;

use serde::Deserialize;
use tokenmill_gguf::GgufFile;
use tokenmill_kernels::{
    add_inplace, bidirectional_attention, gelu_erf_inplace, Bf16PanelMatrix, EncoderAttentionShape,
    Int8PairMatrix, PanelMatrix, ThreadPool,
};

use crate::cache_dtype::ModelDtype;
use crate::error::{ModelError, Result};
use crate::layers::{embed, LayerNorm, Linear, LinearScratch, StackedLinear};
use crate::loader::{TensorNaming, TensorStore, WeightReader};
use crate::pooling::{
    pool_rows, read_json, sentence_transformers_max_len, sentence_transformers_pooling,
    EncoderBatch, EncoderWorkspace, PoolingMethod, PoolingModel, PoolingModelInfo, PoolingTask,
};

/// The `config.json` fields a BERT encoder needs.
#[derive(Debug, Clone, Deserialize)]
struct BertConfig {
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "default_type_vocab_size")]
    type_vocab_size: usize,
    #[serde(default = "default_layer_norm_eps")]
    layer_norm_eps: f32,
    #[serde(default = "default_hidden_act")]
    hidden_act: String,
    #[serde(default = "default_position_embedding_type")]
    position_embedding_type: String,
    /// Classifiers: `id2label` gives the label count (and names); `num_labels` when absent.
    #[serde(default)]
    id2label: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    num_labels: Option<usize>,
    #[serde(default)]
    is_matryoshka: Option<bool>,
    #[serde(default)]
    matryoshka_dimensions: Option<Vec<usize>>,
}

fn default_type_vocab_size() -> usize {
    2
}
fn default_layer_norm_eps() -> f32 {
    1e-12
}
fn default_hidden_act() -> String {
    "gelu".into()
}
fn default_position_embedding_type() -> String {
    "absolute".into()
}

/// The arithmetic of an encoder's float linear layers, from `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncoderPrecision {
    /// f32 weights and activations, one fused chain per output ([`PanelMatrix`]).
    #[default]
    F32,
    /// Weights rounded to bf16 once at load, activations per product, f32 accumulation
    /// ([`Bf16PanelMatrix`]), as vLLM runs a model under `--dtype bfloat16`.
    Bf16,
    /// Weights and activations in 15-bit fixed point per row, each split into two int8
    /// halves, exact integer sums on AMX tiles ([`Int8PairMatrix`]): 2.5-4x the f32 GEMM's speed
    /// on AMX; all-MiniLM-L6-v2's worst cosine with sentence-transformers 0.999997.
    Int8Pair,
}

impl EncoderPrecision {
    /// `--dtype` for an encoder: `float32` keeps f32 (one fused chain per output);
    /// `bfloat16` runs the linear layers in bf16 (vLLM's numerics for that flag, not faster
    /// here); `auto` runs them as int8 pairs where AMX int8 tiles are usable and f32
    /// elsewhere. vLLM's `auto` downcasts a float32 checkpoint too, on x86 CPUs to float16 for
    /// pooling models; tokenmill's downcast keeps 15 bits per value where float16 keeps 11,
    /// and passes the parity bar (every cosine with sentence-transformers' f32 vectors
    /// ≥ 0.9999, tests/bert_parity.rs). `float16` stays f32 (the CLI warns that it does).
    pub fn for_dtype(dtype: ModelDtype) -> EncoderPrecision {
        match dtype {
            ModelDtype::BFloat16 => EncoderPrecision::Bf16,
            ModelDtype::Auto if Int8PairMatrix::supported() => EncoderPrecision::Int8Pair,
            ModelDtype::Auto | ModelDtype::Float16 | ModelDtype::Float32 => EncoderPrecision::F32,
        }
    }
}

/// A dense layer's weight: float weights (F32/F16/BF16) packed for the encoder GEMM of the
/// [`EncoderPrecision`], which also adds the bias; quantized ones (GGUF) keep their `QMatrix`
/// kernel.
#[derive(Debug)]
enum DenseWeight {
    Panel(PanelMatrix),
    Bf16(Bf16PanelMatrix),
    Int8Pair(Int8PairMatrix),
    Quantized(StackedLinear),
}

/// A dense layer with a bias: `y = x · Wᵀ + b`; several parts over the same input
/// (`[q | k | v]`) are stacked by rows into one layer.
#[derive(Debug)]
struct Dense {
    weight: DenseWeight,
    bias: Vec<f32>,
}

impl Dense {
    fn load(
        reader: &WeightReader<'_>,
        precision: EncoderPrecision,
        name: &str,
        rows: usize,
        columns: usize,
    ) -> Result<Dense> {
        Dense::load_stacked(reader, precision, &[name.to_string()], rows, columns)
    }

    /// `names` (without `.weight` / `.bias`), each `rows` outputs, stacked in order.
    fn load_stacked(
        reader: &WeightReader<'_>,
        precision: EncoderPrecision,
        names: &[String],
        rows: usize,
        columns: usize,
    ) -> Result<Dense> {
        let parts: Vec<(String, usize)> = names
            .iter()
            .map(|name| (format!("{name}.weight"), rows))
            .collect();
        let out_features = names.len() * rows;
        let weight = match (reader.float_rows_named(&parts, columns)?, precision) {
            (Some(values), EncoderPrecision::F32) => {
                DenseWeight::Panel(PanelMatrix::from_rows(out_features, columns, &values)?)
            }
            (Some(values), EncoderPrecision::Bf16) => {
                DenseWeight::Bf16(Bf16PanelMatrix::from_rows(out_features, columns, &values)?)
            }
            (Some(values), EncoderPrecision::Int8Pair) => {
                DenseWeight::Int8Pair(Int8PairMatrix::from_rows(out_features, columns, &values)?)
            }
            (None, _) => DenseWeight::Quantized(reader.stacked_named(&parts, columns)?),
        };
        let mut bias = Vec::with_capacity(names.len() * rows);
        for name in names {
            bias.extend(reader.vector_named(&format!("{name}.bias"), rows)?);
        }
        Ok(Dense { weight, bias })
    }

    fn storage_bytes(&self) -> usize {
        let weight = match &self.weight {
            DenseWeight::Panel(matrix) => matrix.storage_bytes(),
            DenseWeight::Bf16(matrix) => matrix.storage_bytes(),
            DenseWeight::Int8Pair(matrix) => matrix.storage_bytes(),
            DenseWeight::Quantized(linear) => linear.storage_bytes(),
        };
        weight + self.bias.len() * 4
    }

    fn forward(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut LinearScratch,
    ) -> Result<()> {
        match &self.weight {
            DenseWeight::Panel(matrix) => Ok(matrix.matmul(pool, x, n, Some(&self.bias), out)?),
            DenseWeight::Bf16(matrix) => Ok(matrix.matmul(pool, x, n, Some(&self.bias), out)?),
            DenseWeight::Int8Pair(matrix) => {
                Ok(matrix.matmul(pool, x, n, Some(&self.bias), out)?)
            }
            DenseWeight::Quantized(linear) => {
                linear.forward(pool, x, n, out, scratch)?;
                add_bias(out, &self.bias)
            }
        }
    }
}

fn add_bias(out: &mut [f32], bias: &[f32]) -> Result<()> {
    for row in out.chunks_exact_mut(bias.len()) {
        add_inplace(row, bias)?;
    }
    Ok(())
}

fn load_layer_norm(
    reader: &WeightReader<'_>,
    name: &str,
    width: usize,
    eps: f32,
) -> Result<LayerNorm> {
    Ok(LayerNorm::new(
        reader.vector_named(&format!("{name}.weight"), width)?,
        reader.vector_named(&format!("{name}.bias"), width)?,
        eps,
    ))
}

#[derive(Debug)]
struct BertLayer {
    /// Query, key and value stacked (`[q | k | v]`), one matmul.
    qkv: Dense,
    attention_output: Dense,
    attention_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    output_norm: LayerNorm,
}

/// `BertForSequenceClassification`'s head: `tanh(W_p · h_cls + b_p)` then the classifier.
#[derive(Debug)]
struct ClassifierHead {
    pooler: Dense,
    classifier: Dense,
}

/// A BERT encoder (see the module docs).
#[derive(Debug)]
pub struct BertModel {
    pub(crate) info: PoolingModelInfo,
    config: BertConfig,
    word_embeddings: Linear,
    position_embeddings: Linear,
    token_type_embeddings: Linear,
    embeddings_norm: LayerNorm,
    layers: Vec<BertLayer>,
    head: Option<ClassifierHead>,
}

impl BertModel {
    /// Loads an HF directory: `config.json`, `model.safetensors` (names with or without the
    /// `bert.` prefix classification checkpoints use) and, for embedders,
    /// sentence-transformers' `modules.json` for the pooling method and normalization.
    pub fn load_hf_directory(dir: &Path, precision: EncoderPrecision) -> Result<BertModel> {
        let config: BertConfig = read_json(&dir.join("config.json"))?;
        check_config(&config)?;
        let classify = config
            .architectures
            .iter()
            .any(|a| a == "BertForSequenceClassification");
        // vLLM's default for BERT embedders without sentence-transformers modules: CLS,
        // normalized.
        let (method, normalize) = if classify {
            (PoolingMethod::Cls, false)
        } else {
            sentence_transformers_pooling(dir, (PoolingMethod::Cls, true))?
        };
        let labels = match (&config.id2label, config.num_labels) {
            (Some(map), _) => {
                let mut entries: Vec<(usize, String)> = map
                    .iter()
                    .filter_map(|(k, v)| k.parse().ok().map(|k| (k, v.clone())))
                    .collect();
                entries.sort();
                entries.into_iter().map(|(_, v)| v).collect()
            }
            (None, Some(n)) => (0..n).map(|i| format!("LABEL_{i}")).collect(),
            (None, None) => vec!["LABEL_0".to_string()],
        };
        let max_model_len = sentence_transformers_max_len(dir)
            .map_or(config.max_position_embeddings, |len| {
                len.min(config.max_position_embeddings)
            });
        let info = PoolingModelInfo {
            architecture: if classify {
                "BertForSequenceClassification".into()
            } else {
                "BertModel".into()
            },
            task: if classify {
                PoolingTask::Classify
            } else {
                PoolingTask::Embed
            },
            output_dim: if classify {
                labels.len()
            } else {
                config.hidden_size
            },
            labels: if classify { labels } else { Vec::new() },
            vocab_size: config.vocab_size,
            max_model_len,
            method,
            normalize,
            matryoshka_dimensions: match (&config.matryoshka_dimensions, config.is_matryoshka) {
                (Some(dimensions), _) => Some(dimensions.clone()),
                (None, Some(true)) => Some(Vec::new()),
                _ => None,
            },
        };
        let store = TensorStore::from_hf_directory(dir)?;
        let reader = WeightReader::new(&store, TensorNaming::HF, false);
        BertModel::from_reader(config, info, &reader, false, precision)
    }

    /// Loads a GGUF of llama.cpp's `bert` architecture (its converter's tensor names and
    /// `bert.*` keys; `bert.pooling_type` gives the method). Embedders only: llama.cpp's
    /// classifier heads (`cls.*`) are refused. Vectors are normalized, as llama.cpp's are.
    pub fn load_gguf(path: &Path, precision: EncoderPrecision) -> Result<BertModel> {
        let file = GgufFile::open(path)?;
        let store = TensorStore::from_gguf(&file);
        let key = |k: &str| format!("bert.{k}");
        let int = |k: &str| {
            file.get_u64(&key(k))
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::MissingMetadata(key(k)))
        };
        let rows = |name: &str| -> Result<usize> {
            Ok(store.get(name)?.shape.first().copied().unwrap_or(0))
        };
        if store.contains("cls.output.weight") || store.contains("cls.weight") {
            return Err(ModelError::InvalidMetadata {
                key: "general.architecture".into(),
                message: "GGUF BERT classifiers are not supported (embedders are; HF \
                          directories for BertForSequenceClassification)"
                    .into(),
            });
        }
        let config = BertConfig {
            architectures: Vec::new(),
            vocab_size: rows("token_embd.weight")?,
            hidden_size: int("embedding_length")?,
            num_hidden_layers: int("block_count")?,
            num_attention_heads: int("attention.head_count")?,
            intermediate_size: int("feed_forward_length")?,
            max_position_embeddings: rows("position_embd.weight")?,
            type_vocab_size: rows("token_types.weight")?,
            layer_norm_eps: file
                .get_f64(&key("attention.layer_norm_epsilon"))
                .map_or(default_layer_norm_eps(), |eps| eps as f32),
            hidden_act: default_hidden_act(),
            position_embedding_type: default_position_embedding_type(),
            id2label: None,
            num_labels: None,
            is_matryoshka: None,
            matryoshka_dimensions: None,
        };
        check_config(&config)?;
        // llama.cpp's LLAMA_POOLING_TYPE_*: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
        let method = match file.get_u64(&key("pooling_type")) {
            Some(1) => PoolingMethod::Mean,
            None | Some(0 | 2) => PoolingMethod::Cls,
            Some(3) => PoolingMethod::Last,
            Some(other) => {
                return Err(ModelError::InvalidMetadata {
                    key: key("pooling_type"),
                    message: format!("pooling type {other} is not supported (1-3 are)"),
                })
            }
        };
        let max_model_len = file
            .get_u64(&key("context_length"))
            .map_or(config.max_position_embeddings, |len| {
                (len as usize).min(config.max_position_embeddings)
            });
        let info = PoolingModelInfo {
            architecture: "BertModel".into(),
            task: PoolingTask::Embed,
            output_dim: config.hidden_size,
            labels: Vec::new(),
            vocab_size: config.vocab_size,
            max_model_len,
            method,
            normalize: true,
            matryoshka_dimensions: None,
        };
        let reader = WeightReader::new(&store, TensorNaming::Gguf, false);
        BertModel::from_reader(config, info, &reader, true, precision)
    }

    fn from_reader(
        config: BertConfig,
        info: PoolingModelInfo,
        reader: &WeightReader<'_>,
        gguf: bool,
        precision: EncoderPrecision,
    ) -> Result<BertModel> {
        let prefix = if reader.contains_named("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let (h, eps) = (config.hidden_size, config.layer_norm_eps);
        let name = |rest: &str| tensor_name(gguf, prefix, rest);
        let word_embeddings = reader.matrix_named(
            &name("embeddings.word_embeddings.weight"),
            config.vocab_size,
            h,
        )?;
        let position_embeddings = reader.matrix_named(
            &name("embeddings.position_embeddings.weight"),
            config.max_position_embeddings,
            h,
        )?;
        let token_type_embeddings = reader.matrix_named(
            &name("embeddings.token_type_embeddings.weight"),
            config.type_vocab_size,
            h,
        )?;
        let embeddings_norm = load_layer_norm(reader, &name("embeddings.LayerNorm"), h, eps)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let layer = |rest: &str| name(&format!("encoder.layer.{i}.{rest}"));
            let qkv: Vec<String> = ["query", "key", "value"]
                .iter()
                .map(|p| layer(&format!("attention.self.{p}")))
                .collect();
            layers.push(BertLayer {
                qkv: Dense::load_stacked(reader, precision, &qkv, h, h)?,
                attention_output: Dense::load(
                    reader,
                    precision,
                    &layer("attention.output.dense"),
                    h,
                    h,
                )?,
                attention_norm: load_layer_norm(
                    reader,
                    &layer("attention.output.LayerNorm"),
                    h,
                    eps,
                )?,
                intermediate: Dense::load(
                    reader,
                    precision,
                    &layer("intermediate.dense"),
                    config.intermediate_size,
                    h,
                )?,
                output: Dense::load(
                    reader,
                    precision,
                    &layer("output.dense"),
                    h,
                    config.intermediate_size,
                )?,
                output_norm: load_layer_norm(reader, &layer("output.LayerNorm"), h, eps)?,
            });
        }
        let head = match info.task {
            PoolingTask::Classify => Some(ClassifierHead {
                pooler: Dense::load(reader, precision, &name("pooler.dense"), h, h)?,
                classifier: Dense::load(reader, precision, "classifier", info.output_dim, h)?,
            }),
            PoolingTask::Embed => None,
        };
        Ok(BertModel {
            info,
            config,
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embeddings_norm,
            layers,
            head,
        })
    }

    /// Word + position + token-type embeddings, LayerNorm, into `ws.hidden`.
    fn embed(
        &self,
        pool: &ThreadPool,
        batch: &EncoderBatch,
        ws: &mut EncoderWorkspace,
    ) -> Result<()> {
        let h = self.config.hidden_size;
        let n = batch.num_tokens();
        embed(
            &self.word_embeddings,
            &batch.token_ids,
            &mut ws.scratch[..n * h],
            h,
        )?;
        embed(
            &self.position_embeddings,
            &batch.positions,
            &mut ws.projected[..n * h],
            h,
        )?;
        add_inplace(&mut ws.scratch[..n * h], &ws.projected[..n * h])?;
        embed(
            &self.token_type_embeddings,
            &batch.token_type_ids,
            &mut ws.projected[..n * h],
            h,
        )?;
        add_inplace(&mut ws.scratch[..n * h], &ws.projected[..n * h])?;
        self.embeddings_norm
            .forward(pool, &ws.scratch[..n * h], &mut ws.hidden[..n * h])
    }

    fn layer(
        &self,
        layer: &BertLayer,
        pool: &ThreadPool,
        batch: &EncoderBatch,
        ws: &mut EncoderWorkspace,
    ) -> Result<()> {
        let h = self.config.hidden_size;
        let n = batch.num_tokens();
        let inter = self.config.intermediate_size;
        let shape = EncoderAttentionShape {
            heads: self.config.num_attention_heads,
            head_dim: h / self.config.num_attention_heads,
            scale: 1.0 / ((h / self.config.num_attention_heads) as f32).sqrt(),
        };
        let qkv = &mut ws.qkv[..n * 3 * h];
        layer
            .qkv
            .forward(pool, &ws.hidden[..n * h], n, qkv, &mut ws.linear)?;
        bidirectional_attention(pool, qkv, &batch.seqs, shape, &mut ws.attention[..n * h])?;
        layer.attention_output.forward(
            pool,
            &ws.attention[..n * h],
            n,
            &mut ws.projected[..n * h],
            &mut ws.linear,
        )?;
        layer.attention_norm.forward_sum(
            pool,
            &ws.hidden[..n * h],
            &ws.projected[..n * h],
            &mut ws.scratch[..n * h],
        )?;
        std::mem::swap(&mut ws.hidden, &mut ws.scratch);
        let intermediate = &mut ws.intermediate[..n * inter];
        layer
            .intermediate
            .forward(pool, &ws.hidden[..n * h], n, intermediate, &mut ws.linear)?;
        gelu_erf_inplace(pool, intermediate);
        layer.output.forward(
            pool,
            intermediate,
            n,
            &mut ws.projected[..n * h],
            &mut ws.linear,
        )?;
        layer.output_norm.forward_sum(
            pool,
            &ws.hidden[..n * h],
            &ws.projected[..n * h],
            &mut ws.scratch[..n * h],
        )?;
        std::mem::swap(&mut ws.hidden, &mut ws.scratch);
        Ok(())
    }

    fn validate(&self, batch: &EncoderBatch) -> Result<()> {
        let n = batch.num_tokens();
        if batch.token_type_ids.len() != n || batch.positions.len() != n {
            return Err(ModelError::InvalidBatch(format!(
                "{n} tokens but {} token types and {} positions",
                batch.token_type_ids.len(),
                batch.positions.len()
            )));
        }
        let checks = [
            ("token id", &batch.token_ids, self.config.vocab_size),
            (
                "token type id",
                &batch.token_type_ids,
                self.config.type_vocab_size,
            ),
            (
                "position",
                &batch.positions,
                self.config.max_position_embeddings,
            ),
        ];
        for (what, values, limit) in checks {
            if let Some(bad) = values.iter().find(|&&v| v as usize >= limit) {
                return Err(ModelError::InvalidBatch(format!(
                    "{what} {bad} is out of range (the model has {limit})"
                )));
            }
        }
        let covered: usize = batch.seqs.iter().map(|s| s.len).sum();
        if covered != n || batch.seqs.iter().any(|s| s.len == 0) {
            return Err(ModelError::InvalidBatch(
                "encoder sequences must cover the batch's tokens, none empty".into(),
            ));
        }
        Ok(())
    }
}

/// A tensor's name in its container from its HF name without the `bert.` prefix (whole, or
/// a stem `.weight` / `.bias` will be appended to): HF's own, or llama.cpp's GGUF name.
fn tensor_name(gguf: bool, prefix: &str, key: &str) -> String {
    const MODEL: [(&str, &str); 4] = [
        ("embeddings.word_embeddings", "token_embd"),
        ("embeddings.position_embeddings", "position_embd"),
        ("embeddings.token_type_embeddings", "token_types"),
        ("embeddings.LayerNorm", "token_embd_norm"),
    ];
    const LAYER: [(&str, &str); 8] = [
        ("attention.self.query", "attn_q"),
        ("attention.self.key", "attn_k"),
        ("attention.self.value", "attn_v"),
        ("attention.output.dense", "attn_output"),
        ("attention.output.LayerNorm", "attn_output_norm"),
        ("intermediate.dense", "ffn_up"),
        ("output.dense", "ffn_down"),
        ("output.LayerNorm", "layer_output_norm"),
    ];
    if !gguf {
        return format!("{prefix}{key}");
    }
    if let Some((index, part)) = key
        .strip_prefix("encoder.layer.")
        .and_then(|rest| rest.split_once('.'))
    {
        if let Some((gguf_name, suffix)) = LAYER
            .iter()
            .find_map(|(hf, name)| part.strip_prefix(hf).map(|suffix| (name, suffix)))
        {
            return format!("blk.{index}.{gguf_name}{suffix}");
        }
    }
    MODEL
        .iter()
        .find_map(|(hf, name)| key.strip_prefix(hf).map(|suffix| format!("{name}{suffix}")))
        .unwrap_or_else(|| key.to_string())
}

fn check_config(config: &BertConfig) -> Result<()> {
    let invalid = |key: &str, message: String| ModelError::InvalidMetadata {
        key: key.into(),
        message,
    };
    if config.hidden_act != "gelu" {
        return Err(invalid(
            "hidden_act",
            format!(
                "`{}` is not supported (BERT's exact `gelu` is)",
                config.hidden_act
            ),
        ));
    }
    if config.position_embedding_type != "absolute" {
        return Err(invalid(
            "position_embedding_type",
            format!(
                "`{}` is not supported (`absolute` is)",
                config.position_embedding_type
            ),
        ));
    }
    if config.num_attention_heads == 0
        || !config
            .hidden_size
            .is_multiple_of(config.num_attention_heads)
    {
        return Err(invalid(
            "num_attention_heads",
            format!(
                "{} heads do not divide hidden_size {}",
                config.num_attention_heads, config.hidden_size
            ),
        ));
    }
    Ok(())
}

impl PoolingModel for BertModel {
    fn info(&self) -> &PoolingModelInfo {
        &self.info
    }

    fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.storage_bytes()
                    + l.attention_output.storage_bytes()
                    + l.attention_norm.storage_bytes()
                    + l.intermediate.storage_bytes()
                    + l.output.storage_bytes()
                    + l.output_norm.storage_bytes()
            })
            .sum();
        let head = self.head.as_ref().map_or(0, |h| {
            h.pooler.storage_bytes() + h.classifier.storage_bytes()
        });
        self.word_embeddings.storage_bytes()
            + self.position_embeddings.storage_bytes()
            + self.token_type_embeddings.storage_bytes()
            + self.embeddings_norm.storage_bytes()
            + layers
            + head
    }

    fn pool(
        &self,
        pool: &ThreadPool,
        batch: &EncoderBatch,
        ws: &mut EncoderWorkspace,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.validate(batch)?;
        let (h, n, seqs) = (
            self.config.hidden_size,
            batch.num_tokens(),
            batch.seqs.len(),
        );
        for (buffer, len) in [
            (&mut ws.hidden, n * h),
            (&mut ws.qkv, n * 3 * h),
            (&mut ws.attention, n * h),
            (&mut ws.projected, n * h),
            (&mut ws.scratch, n * h),
            (&mut ws.intermediate, n * self.config.intermediate_size),
            (&mut ws.pooled, 2 * seqs * h),
        ] {
            if buffer.len() < len {
                buffer.resize(len, 0.0);
            }
        }
        self.embed(pool, batch, ws)?;
        for layer in &self.layers {
            self.layer(layer, pool, batch, ws)?;
        }
        out.clear();
        out.resize(seqs * self.info.output_dim, 0.0);
        match &self.head {
            None => {
                for (seq, row) in batch.seqs.iter().zip(out.chunks_exact_mut(h)) {
                    let rows = &ws.hidden[seq.start * h..(seq.start + seq.len) * h];
                    pool_rows(self.info.method, rows, h, row);
                }
            }
            Some(head) => {
                let (cls, pooled) = ws.pooled.split_at_mut(seqs * h);
                for (seq, row) in batch.seqs.iter().zip(cls.chunks_exact_mut(h)) {
                    row.copy_from_slice(&ws.hidden[seq.start * h..(seq.start + 1) * h]);
                }
                let pooled = &mut pooled[..seqs * h];
                head.pooler
                    .forward(pool, cls, seqs, pooled, &mut ws.linear)?;
                pooled.iter_mut().for_each(|v| *v = v.tanh());
                head.classifier
                    .forward(pool, pooled, seqs, out, &mut ws.linear)?;
            }
        }
        Ok(())
    }
}
