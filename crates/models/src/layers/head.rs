//! The two ends of a decoder that every family shares: the token embedding (Gemma scales it)
//! and the output head (final norm, then the head's own matrix or the tied embedding, then
//! Gemma's optional soft-capping).

use super::{embed, Linear, RmsNorm, Step, Workspace};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::loader::{TensorNaming, WeightReader};

#[derive(Debug)]
pub(crate) struct EmbeddingAndHead {
    /// `[vocab][hidden]`; also the output head when that is tied.
    embedding: Linear,
    /// Multiplies every embedded row (Gemma: `sqrt(hidden)`).
    embedding_scale: Option<f32>,
    output_norm: RmsNorm,
    /// `None` when the output head is tied to the embedding.
    output: Option<Linear>,
    /// `Some(c)`: logits become `c * tanh(logits / c)`.
    softcap: Option<f32>,
    /// Loaded for hidden states only: there are no logits.
    head_absent: bool,
    hidden: usize,
    vocab: usize,
}

impl EmbeddingAndHead {
    /// Reads `token_embd.weight`, `output_norm.weight` and, unless the head is tied,
    /// `output.weight`. A GGUF file without `output.weight` ties the head, as llama.cpp does.
    /// With `hidden_states_only`, no untied head is read and [`EmbeddingAndHead::logits`]
    /// is an error.
    pub fn load(
        reader: &WeightReader<'_>,
        config: &ModelConfig,
        hidden_states_only: bool,
    ) -> Result<EmbeddingAndHead> {
        let (hidden, vocab) = (config.hidden_size, config.vocab_size);
        let embedding = reader.matrix("token_embd.weight", vocab, hidden)?;
        const OUTPUT: &str = "output.weight";
        let tied = config.tie_word_embeddings || reader.naming() == TensorNaming::Gguf;
        let output = if hidden_states_only {
            None
        } else if reader.contains(OUTPUT) {
            Some(reader.matrix(OUTPUT, vocab, hidden)?)
        } else if tied {
            None
        } else {
            return Err(ModelError::MissingTensor(
                reader.naming().global(OUTPUT).into(),
            ));
        };
        Ok(EmbeddingAndHead {
            embedding,
            embedding_scale: None,
            output_norm: reader.rms_norm("output_norm.weight", hidden, config.rms_norm_eps)?,
            output,
            softcap: config.final_logit_softcapping,
            head_absent: hidden_states_only,
            hidden,
            vocab,
        })
    }

    /// Scales every embedded row by `scale`.
    pub fn with_embedding_scale(self, scale: f32) -> EmbeddingAndHead {
        EmbeddingAndHead {
            embedding_scale: Some(scale),
            ..self
        }
    }

    /// Bytes of the embedding table and the untied head.
    pub fn storage_bytes(&self) -> usize {
        self.embedding.storage_bytes() + self.output.as_ref().map_or(0, Linear::storage_bytes)
    }

    /// Bytes a decode step reads in full: the head's matrix (the embedding table when tied;
    /// an untied embedding is read one row per token).
    pub fn decode_bytes(&self) -> usize {
        self.head().storage_bytes()
    }

    fn head(&self) -> &Linear {
        self.output.as_ref().unwrap_or(&self.embedding)
    }

    /// Embeds the batch's tokens into the workspace's residual stream.
    pub fn embed(&self, step: &Step<'_>, ws: &mut Workspace) -> Result<()> {
        let rows = &mut ws.hidden[..step.num_tokens() * self.hidden];
        embed(&self.embedding, &step.batch.token_ids, rows, self.hidden)?;
        if let Some(scale) = self.embedding_scale {
            rows.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }

    /// The logits of the batch's `logits_indices` rows into `logits` (`[rows][vocab]`).
    pub fn logits(&self, step: &Step<'_>, ws: &mut Workspace, logits: &mut Vec<f32>) -> Result<()> {
        if self.head_absent {
            return Err(ModelError::InvalidBatch(
                "the model was loaded for hidden states only (no output head)".into(),
            ));
        }
        ws.final_logits(
            step,
            &self.output_norm,
            self.head(),
            self.hidden,
            self.vocab,
            logits,
        )?;
        if let Some(cap) = self.softcap {
            logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        Ok(())
    }

    /// Every token's residual-stream row after the final norm into `out`
    /// (`[num_tokens][hidden]`): the hidden states a decoder embedder pools.
    pub fn final_hidden(&self, step: &Step<'_>, ws: &Workspace, out: &mut Vec<f32>) -> Result<()> {
        let len = step.num_tokens() * self.hidden;
        out.clear();
        out.resize(len, 0.0);
        self.output_norm.forward(&ws.hidden[..len], out)
    }
}
