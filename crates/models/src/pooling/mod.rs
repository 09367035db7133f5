//! The pooling seam: models that turn whole sequences into one vector each (embeddings) or
//! one row of class logits (cross-encoders), rather than next-token logits.
//!
//! A pooling model keeps no KV cache: every sequence of a step is complete (encoders attend
//! in both directions, so a sequence cannot be split across steps), its hidden states are
//! reduced to one row, and nothing survives the step. [`PoolingModel::pool`] takes a
//! flattened [`EncoderBatch`] of many sequences, as [`crate::CausalLm::forward`] does.

mod decoder;
mod options;

use std::path::Path;

pub use decoder::DecoderEmbedder;
pub use options::{ConvertOption, PoolerConfig, PoolingOptions};
use serde::Deserialize;
use tokenmill_gguf::GgufFile;
use tokenmill_kernels::{EncoderSeq, ThreadPool};

use crate::error::{io_error, ModelError, Result};
use crate::families::{BertModel, EncoderPrecision};
use crate::source::ModelSource;

/// How hidden states become one vector (sentence-transformers' `1_Pooling/config.json`,
/// vLLM's `PoolingType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMethod {
    /// Average of every token's hidden state.
    Mean,
    /// The first token's (`[CLS]`).
    Cls,
    /// The last token's (decoder embedders).
    Last,
}

impl PoolingMethod {
    pub fn name(self) -> &'static str {
        match self {
            PoolingMethod::Mean => "mean",
            PoolingMethod::Cls => "cls",
            PoolingMethod::Last => "last",
        }
    }
}

/// What a pooling model's output row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingTask {
    /// A sentence embedding (`BertModel`): `/v1/embeddings`, and `/score` / `/rerank` as the
    /// cosine similarity of two embeddings.
    Embed,
    /// Class logits of a sequence or sequence pair (`BertForSequenceClassification`):
    /// `/classify`, and `/score` / `/rerank` for cross-encoders.
    Classify,
}

impl PoolingTask {
    pub fn name(self) -> &'static str {
        match self {
            PoolingTask::Embed => "embed",
            PoolingTask::Classify => "classify",
        }
    }
}

/// What the engine and server need to know about a loaded pooling model.
#[derive(Debug, Clone)]
pub struct PoolingModelInfo {
    /// `model_type` / architecture name, for logs and `/v1/models`.
    pub architecture: String,
    pub task: PoolingTask,
    /// Width of an output row: the hidden size for embeddings, the label count for
    /// classifiers.
    pub output_dim: usize,
    /// Class names by index (`id2label`), classifiers only.
    pub labels: Vec<String>,
    pub vocab_size: usize,
    /// Longest sequence the position table (or sentence-transformers' `max_seq_length`)
    /// allows.
    pub max_model_len: usize,
    /// Embeddings: how tokens are pooled and whether the vector is L2-normalized
    /// (sentence-transformers' `Normalize` module).
    pub method: PoolingMethod,
    pub normalize: bool,
    /// Matryoshka embeddings (`is_matryoshka` / `matryoshka_dimensions` in `config.json`):
    /// `None` when the model was not trained for truncation (a `dimensions` request is then
    /// vLLM's 400); `Some(empty)` when any width up to `output_dim` is allowed.
    pub matryoshka_dimensions: Option<Vec<usize>>,
}

/// A flattened batch of whole sequences: token ids, token-type ids (0 for single texts, 1
/// for the second text of a pair), positions from 0, and each sequence's rows.
#[derive(Debug, Clone, Default)]
pub struct EncoderBatch {
    pub token_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub seqs: Vec<EncoderSeq>,
}

impl EncoderBatch {
    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.token_type_ids.clear();
        self.positions.clear();
        self.seqs.clear();
    }

    /// Appends one whole sequence; `type_ids` of `None` means all zeros.
    pub fn add_sequence(&mut self, ids: &[u32], type_ids: Option<&[u32]>) -> Result<()> {
        if ids.is_empty() {
            return Err(ModelError::InvalidBatch("an empty sequence".into()));
        }
        if type_ids.is_some_and(|t| t.len() != ids.len()) {
            return Err(ModelError::InvalidBatch(
                "token type ids differ in length from the token ids".into(),
            ));
        }
        self.seqs.push(EncoderSeq {
            start: self.token_ids.len(),
            len: ids.len(),
        });
        self.token_ids.extend_from_slice(ids);
        match type_ids {
            Some(types) => self.token_type_ids.extend_from_slice(types),
            None => self
                .token_type_ids
                .extend(std::iter::repeat_n(0, ids.len())),
        }
        self.positions.extend(0..ids.len() as u32);
        Ok(())
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}

/// A model whose output is one row per sequence (see the module docs).
pub trait PoolingModel: Send + Sync + std::fmt::Debug {
    fn info(&self) -> &PoolingModelInfo;

    /// Bytes of weight storage in the compute layer's layout.
    fn weight_bytes(&self) -> usize;

    /// Runs the whole batch on `pool` and leaves `[batch.seqs.len()][info().output_dim]` in
    /// `out`: raw pooled vectors (normalization and truncation are the caller's, as they
    /// depend on the request) or class logits. A row does not depend on the other sequences.
    fn pool(
        &self,
        pool: &ThreadPool,
        batch: &EncoderBatch,
        workspace: &mut EncoderWorkspace,
        out: &mut Vec<f32>,
    ) -> Result<()>;
}

/// Activation buffers of an encoder step, grown to the largest batch and reused.
#[derive(Debug, Default)]
pub struct EncoderWorkspace {
    pub(crate) hidden: Vec<f32>,
    pub(crate) qkv: Vec<f32>,
    pub(crate) attention: Vec<f32>,
    pub(crate) projected: Vec<f32>,
    pub(crate) intermediate: Vec<f32>,
    pub(crate) pooled: Vec<f32>,
    pub(crate) scratch: Vec<f32>,
    pub(crate) linear: crate::layers::LinearScratch,
    /// A decoder embedder's pass ([`DecoderEmbedder`]).
    pub(crate) decoder: decoder::DecoderScratch,
}

impl EncoderWorkspace {
    pub fn new() -> EncoderWorkspace {
        EncoderWorkspace::default()
    }
}

/// Whether `source` is a model for the pooling runner: an HF directory whose `config.json`
/// names an encoder (`model_type: bert`). vLLM picks `--runner pooling` the same way, from
/// the architecture.
pub fn is_pooling_model(source: &ModelSource) -> bool {
    match source {
        ModelSource::Gguf(path) => GgufFile::open(path)
            .is_ok_and(|file| file.get_str("general.architecture") == Some("bert")),
        ModelSource::HfDirectory(dir) => read_json::<ArchitectureFields>(&dir.join("config.json"))
            .is_ok_and(|fields| fields.model_type.as_deref() == Some("bert")),
    }
}

/// Loads a pooling model with the defaults ([`PoolingOptions::default`]).
pub fn load_pooling_model(source: &ModelSource) -> Result<Box<dyn PoolingModel>> {
    load_pooling_model_with(source, &PoolingOptions::default())
}

/// Loads a pooling model: an HF `BertModel` / `BertForSequenceClassification` directory, a
/// GGUF of llama.cpp's `bert` architecture, or — unless `--convert none` — a decoder
/// (Llama, Qwen2/3, Mistral, Phi-3, Gemma 3; GGUF or HF directory) as a [`DecoderEmbedder`].
/// `options.pooler` then overrides the pooling method and normalization.
pub fn load_pooling_model_with(
    source: &ModelSource,
    options: &PoolingOptions,
) -> Result<Box<dyn PoolingModel>> {
    let model: Box<dyn PoolingModel> = if is_pooling_model(source) {
        let precision = EncoderPrecision::for_dtype(options.dtype);
        tracing::info!(
            "encoder linear layers (float weights): {}",
            match precision {
                EncoderPrecision::F32 => "f32",
                EncoderPrecision::Bf16 => "bf16 (--dtype bfloat16)",
                EncoderPrecision::Int8Pair =>
                    "int8 pairs on AMX tiles, 15-bit fixed point (--dtype auto; float32 keeps f32)",
            }
        );
        let mut bert = match source {
            ModelSource::HfDirectory(dir) => BertModel::load_hf_directory(dir, precision)?,
            ModelSource::Gguf(path) => BertModel::load_gguf(path, precision)?,
        };
        if options.convert == ConvertOption::Embed && bert.info.task != PoolingTask::Embed {
            return Err(ModelError::PoolingOption(format!(
                "--convert embed: {} is a {} model",
                bert.info.architecture,
                bert.info.task.name()
            )));
        }
        options.pooler.apply(&mut bert.info)?;
        Box::new(bert)
    } else {
        let decoder = match source {
            ModelSource::HfDirectory(dir) => decoder::hf_dir_is_decoder(dir),
            ModelSource::Gguf(_) => true,
        };
        if !decoder {
            let fields: ArchitectureFields = match source {
                ModelSource::HfDirectory(dir) => read_json(&dir.join("config.json"))?,
                ModelSource::Gguf(_) => ArchitectureFields { model_type: None },
            };
            return Err(ModelError::UnsupportedArchitecture {
                name: fields
                    .model_type
                    .unwrap_or_else(|| "(no model_type)".into()),
                supported: format!(
                    "bert, and decoders ({}) as embedders",
                    crate::families::registered_names()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        if options.convert == ConvertOption::None {
            return Err(ModelError::PoolingOption(
                "--convert none: a generative (decoder) model has no pooling head of its own; \
                 the pooling runner serves it with --convert embed (or auto)"
                    .into(),
            ));
        }
        let mut embedder = DecoderEmbedder::load(source)?;
        options.pooler.apply(&mut embedder.info)?;
        Box::new(embedder)
    };
    Ok(model)
}

#[derive(Deserialize)]
struct ArchitectureFields {
    model_type: Option<String>,
}

pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(io_error(path))?;
    serde_json::from_str(&text).map_err(|source| ModelError::ConfigJson {
        path: path.to_path_buf(),
        source,
    })
}

/// sentence-transformers' `modules.json` entry.
#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type", default)]
    kind: String,
}

/// sentence-transformers' `1_Pooling/config.json` (the flags that matter here).
#[derive(Deserialize, Default)]
struct PoolingFlags {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

/// The pooling method and normalization a directory's sentence-transformers modules declare;
/// `default` when it has no `modules.json` (vLLM: CLS and normalized for BERT embedders).
pub(crate) fn sentence_transformers_pooling(
    dir: &Path,
    default: (PoolingMethod, bool),
) -> Result<(PoolingMethod, bool)> {
    let modules_path = dir.join("modules.json");
    if !modules_path.is_file() {
        return Ok(default);
    }
    let modules: Vec<Module> = read_json(&modules_path)?;
    let normalize = modules.iter().any(|m| m.kind.ends_with("models.Normalize"));
    let Some(pooling) = modules.iter().find(|m| m.kind.ends_with("models.Pooling")) else {
        return Ok((default.0, normalize));
    };
    let flags: PoolingFlags = read_json(&dir.join(&pooling.path).join("config.json"))?;
    let modes = [
        (flags.pooling_mode_mean_tokens, Some(PoolingMethod::Mean)),
        (flags.pooling_mode_cls_token, Some(PoolingMethod::Cls)),
        (flags.pooling_mode_lasttoken, Some(PoolingMethod::Last)),
        (flags.pooling_mode_max_tokens, None),
        (flags.pooling_mode_mean_sqrt_len_tokens, None),
    ];
    let chosen: Vec<Option<PoolingMethod>> = modes
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, method)| *method)
        .collect();
    match chosen.as_slice() {
        [Some(method)] => Ok((*method, normalize)),
        _ => Err(ModelError::InvalidMetadata {
            key: format!("{}/config.json", pooling.path),
            message: "exactly one of mean, cls or last-token pooling is supported (max, \
                      mean-sqrt-len and combined modes are not)"
                .into(),
        }),
    }
}

/// sentence-transformers' `sentence_bert_config.json` `max_seq_length`, which vLLM takes as
/// the model's length limit when it is below the position table.
pub(crate) fn sentence_transformers_max_len(dir: &Path) -> Option<usize> {
    #[derive(Deserialize)]
    struct SentenceBertConfig {
        max_seq_length: Option<usize>,
    }
    read_json::<SentenceBertConfig>(&dir.join("sentence_bert_config.json"))
        .ok()
        .and_then(|c| c.max_seq_length)
}

/// Pools `[len][hidden]` hidden states of one sequence into `out[hidden]`.
pub(crate) fn pool_rows(method: PoolingMethod, rows: &[f32], hidden: usize, out: &mut [f32]) {
    let len = rows.len() / hidden;
    match method {
        PoolingMethod::Cls => out.copy_from_slice(&rows[..hidden]),
        PoolingMethod::Last => out.copy_from_slice(&rows[(len - 1) * hidden..]),
        PoolingMethod::Mean => {
            out.iter_mut().for_each(|v| *v = 0.0);
            for row in rows.chunks_exact(hidden) {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o += v;
                }
            }
            let inverse = 1.0 / len as f32;
            out.iter_mut().for_each(|v| *v *= inverse);
        }
    }
}

/// L2-normalizes `v` in place (a zero vector stays zero), as `torch.nn.functional.normalize`
/// with its `eps` of 1e-12.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    let inverse = 1.0 / norm.max(1e-12);
    v.iter_mut()
        .for_each(|x| *x = (f64::from(*x) * inverse) as f32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_methods() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0];
        let mut out = [0.0; 2];
        pool_rows(PoolingMethod::Mean, &rows, 2, &mut out);
        assert_eq!(out, [3.0, 5.0]);
        pool_rows(PoolingMethod::Cls, &rows, 2, &mut out);
        assert_eq!(out, [1.0, 2.0]);
        pool_rows(PoolingMethod::Last, &rows, 2, &mut out);
        assert_eq!(out, [5.0, 9.0]);
        let mut v = [3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut zero = [0.0, 0.0];
        l2_normalize(&mut zero);
        assert_eq!(zero, [0.0, 0.0]);
    }

    #[test]
    fn batch_rejects_empty_and_mismatched_sequences() {
        let mut batch = EncoderBatch::default();
        assert!(batch.add_sequence(&[], None).is_err());
        assert!(batch.add_sequence(&[1, 2], Some(&[0])).is_err());
        batch.add_sequence(&[1, 2], None).unwrap();
        batch.add_sequence(&[3], Some(&[1])).unwrap();
        assert_eq!(batch.positions, [0, 1, 0]);
        assert_eq!(batch.token_type_ids, [0, 0, 1]);
        assert_eq!(batch.seqs[1], EncoderSeq { start: 2, len: 1 });
    }
}
