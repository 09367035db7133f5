//! A tokenizer as a Hugging Face tokenizer directory (`tokenizer.json`,
//! `tokenizer_config.json`, `special_tokens_map.json`, `generation_config.json`), so tools that
//! want an HF tokenizer path (GuideLLM, lm-eval, transformers clients) work from a GGUF with no
//! hub; and the `tokenizer_config.json` content vLLM's `GET /tokenizer_info` serves.
//!
//! A GGUF tokenizer adds BOS/EOS by hand ([`Source::Gguf`]); the exported `tokenizer.json`
//! carries a template post-processor that adds the same, so loading the directory back encodes
//! to the same ids with and without special tokens. The EOS set (EOT, EOM, llama.cpp's
//! end-of-generation tokens) goes to `generation_config.json`'s `eos_token_id` list.

use std::path::Path;

use serde_json::{json, Map, Value};
use tokenizers::processors::template::TemplateProcessing;

use super::{Source, Tokenizer};
use crate::error::{Result, TextError};

/// The files of an exported tokenizer directory, as JSON text.
#[derive(Debug, Clone)]
pub struct HfTokenizerFiles {
    pub tokenizer_json: String,
    pub tokenizer_config: Value,
    pub special_tokens_map: Value,
    pub generation_config: Value,
}

impl Tokenizer {
    /// `tokenizer_config.json` for this tokenizer: class, special tokens, BOS/EOS flags, the
    /// chat template and the added tokens, with `model_max_length` when given. This is also
    /// the body of vLLM's `GET /tokenizer_info`.
    pub fn tokenizer_config(&self, model_max_length: Option<usize>) -> Value {
        let mut config = Map::new();
        config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        let token = |id: Option<u32>| {
            id.and_then(|id| self.inner.id_to_token(id))
                .map_or(Value::Null, Value::String)
        };
        config.insert("bos_token".into(), token(self.bos_token_id));
        config.insert("eos_token".into(), token(self.eos_token_id));
        config.insert("pad_token".into(), Value::Null);
        config.insert("add_bos_token".into(), json!(self.add_bos));
        config.insert("add_eos_token".into(), json!(self.add_eos));
        config.insert("clean_up_tokenization_spaces".into(), json!(false));
        if let Some(length) = model_max_length {
            config.insert("model_max_length".into(), json!(length));
        }
        if let Some(template) = &self.chat_template {
            config.insert("chat_template".into(), json!(template));
        }
        let mut added: Vec<_> = self.inner.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        let added: Map<String, Value> = added
            .into_iter()
            .map(|(id, token)| {
                (
                    id.to_string(),
                    json!({
                        "content": token.content,
                        "lstrip": token.lstrip,
                        "normalized": token.normalized,
                        "rstrip": token.rstrip,
                        "single_word": token.single_word,
                        "special": token.special,
                    }),
                )
            })
            .collect();
        config.insert("added_tokens_decoder".into(), Value::Object(added));
        Value::Object(config)
    }

    /// The directory's files. `model_max_length` goes to `tokenizer_config.json`.
    pub fn hf_files(&self, model_max_length: Option<usize>) -> Result<HfTokenizerFiles> {
        let mut inner = self.inner.clone();
        if self.source == Source::Gguf {
            if let Some(processor) = self.bos_eos_template()? {
                inner.with_post_processor(Some(processor));
            }
        }
        let tokenizer_json = inner.to_string(true).map_err(TextError::tokenizer)?;
        let tokenizer_config = self.tokenizer_config(model_max_length);
        let mut special_tokens_map = Map::new();
        for key in ["bos_token", "eos_token"] {
            if let Some(Value::String(token)) = tokenizer_config.get(key) {
                special_tokens_map.insert(key.into(), json!(token));
            }
        }
        let generation_config = json!({
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids(),
        });
        Ok(HfTokenizerFiles {
            tokenizer_json,
            tokenizer_config,
            special_tokens_map: Value::Object(special_tokens_map),
            generation_config,
        })
    }

    /// Writes the directory's files into `dir` (created if missing).
    pub fn write_hf_dir(&self, dir: &Path, model_max_length: Option<usize>) -> Result<()> {
        let files = self.hf_files(model_max_length)?;
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| TextError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let pretty = |name: &str, value: &Value| {
            serde_json::to_string_pretty(value).map_err(|source| TextError::Json {
                path: dir.join(name).display().to_string(),
                source,
            })
        };
        for (name, text) in [
            ("tokenizer.json", files.tokenizer_json),
            (
                "tokenizer_config.json",
                pretty("tokenizer_config.json", &files.tokenizer_config)?,
            ),
            (
                "special_tokens_map.json",
                pretty("special_tokens_map.json", &files.special_tokens_map)?,
            ),
            (
                "generation_config.json",
                pretty("generation_config.json", &files.generation_config)?,
            ),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(io(&path))?;
        }
        Ok(())
    }

    /// A post-processor adding BOS and/or EOS where this (GGUF) tokenizer adds them by hand.
    fn bos_eos_template(&self) -> Result<Option<TemplateProcessing>> {
        let name = |id: Option<u32>| id.and_then(|id| self.inner.id_to_token(id).map(|t| (t, id)));
        let bos = name(self.bos_token_id).filter(|_| self.add_bos);
        let eos = name(self.eos_token_id).filter(|_| self.add_eos);
        if bos.is_none() && eos.is_none() {
            return Ok(None);
        }
        let around = |sequence: &str| {
            let mut parts = Vec::new();
            parts.extend(bos.as_ref().map(|(token, _)| token.clone()));
            parts.push(sequence.to_string());
            parts.extend(eos.as_ref().map(|(token, _)| token.clone()));
            parts.join(" ")
        };
        let special: Vec<(String, u32)> = bos.iter().chain(eos.iter()).cloned().collect();
        TemplateProcessing::builder()
            .try_single(around("$A"))
            .and_then(|builder| builder.try_pair(format!("{} {}", around("$A"), around("$B:1"))))
            .map_err(TextError::tokenizer)?
            .special_tokens(special)
            .build()
            .map(Some)
            .map_err(TextError::tokenizer)
    }
}
