//! Building a tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! GGUF stores the vocabulary as plain arrays (token strings, types, scores, merges) plus a few
//! names and ids. [`GgufVocab`] is that data, read once; [`GgufVocab::build`] turns it into a
//! Hugging Face `tokenizers` pipeline that tokenizes the way llama.cpp does:
//! - `gpt2`: byte-level BPE over `tokens` and `merges`, pre-tokenized by the regexes llama.cpp
//!   uses for `tokenizer.ggml.pre` ([`crate::pretokenize`]);
//! - `llama`: SentencePiece BPE. Merges are derived from the scores (a pair merges when the
//!   concatenation is a token; higher score first), unknown characters fall back to `<0xXX>`
//!   byte tokens, spaces become `▁` and a `▁` is prepended when `add_space_prefix` (default on).
//! - `gemma4` (and `gpt2` files whose `tokenizer.ggml.pre` is `gemma4`): BPE over raw UTF-8
//!   with `▁` for spaces and `<0xXX>` byte fallback. llama.cpp encodes it with its own BPE,
//!   which [`crate::spm_bpe`] reproduces; the pipeline built here (the same vocabulary and
//!   merges, byte fallback, a `▁` decoder) decodes, and is what an exported `tokenizer.json`
//!   carries. Its special tokens and end-of-generation set are llama.cpp's after its fix-ups
//!   by token text ([`crate::llama_attributes`]), and BOS is always added, as llama.cpp does.
//! - `bert`: WordPiece. llama.cpp's converter stores word-initial pieces as `▁piece` and
//!   continuations bare; they are turned back into BERT's `piece` / `##piece`, with BERT's
//!   normalizer (lowercasing, accents stripped, CJK split) and pre-tokenizer, and a
//!   `[CLS] a [SEP] (b [SEP])` post-processor for the pooling runner.
//!
//! Control (3), unknown (2) and user-defined (4) tokens are registered as added tokens, so
//! "<|im_start|>" in text becomes one token, as llama.cpp does with `parse_special = true`.

use std::collections::{BTreeSet, HashMap, HashSet};

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};
use tokenmill_gguf::{GgufFile, MetadataValue};

use crate::error::{Result, TextError};
use crate::llama_attributes::{llama_cpp_attributes, NamedIds};
use crate::pretokenize::PreTokenizerSpec;
use crate::spm_bpe::SpmBpe;

/// GGUF token types (llama.cpp `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The tokenizer half of a GGUF file's metadata, as plain data.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2", "llama", "gemma4" or "bert" (others are rejected by
    /// [`Self::build`]).
    pub model: String,
    /// `tokenizer.ggml.pre`, absent for older files.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// One per token; [`token_type::NORMAL`] when the file has none.
    pub token_types: Vec<i32>,
    /// SentencePiece scores (empty for BPE vocabularies).
    pub scores: Vec<f32>,
    /// "left right" pairs, highest priority first.
    pub merges: Vec<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub eot_token_id: Option<u32>,
    pub eom_token_id: Option<u32>,
    pub unknown_token_id: Option<u32>,
    /// Fill-in-the-middle ids (`tokenizer.ggml.fim_*_token_id`; the older `prefix`, `suffix`
    /// and `middle` keys win, as in llama.cpp): prefix, suffix, middle, pad, repository, file
    /// separator. Read for the SPM-style BPE path, where they decide special tokens.
    pub fim_token_ids: [Option<u32>; 6],
    /// `None`: not stated; llama.cpp then adds BOS for "llama" vocabularies only.
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

fn strings(file: &GgufFile, key: &str) -> Result<Vec<String>> {
    let values = file
        .get_array(key)
        .ok_or_else(|| TextError::MissingMetadata {
            key: key.to_string(),
        })?;
    values
        .iter()
        .map(|value| value.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| TextError::MissingMetadata {
            key: key.to_string(),
        })
}

fn id(file: &GgufFile, key: &str) -> Option<u32> {
    // Some converters write -1 (as a signed or wrapped unsigned int) for "no such token".
    file.get_u64(key)
        .and_then(|value| u32::try_from(value).ok())
        .filter(|&value| value != u32::MAX)
}

impl GgufVocab {
    /// Reads the `tokenizer.*` keys of an opened GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let model = file
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| TextError::MissingMetadata {
                key: "tokenizer.ggml.model".to_string(),
            })?
            .to_string();
        let tokens = strings(file, "tokenizer.ggml.tokens")?;
        let token_types = match file.get_array("tokenizer.ggml.token_type") {
            Some(values) => values
                .iter()
                .map(|value| value.as_i64().and_then(|t| i32::try_from(t).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| TextError::MissingMetadata {
                    key: "tokenizer.ggml.token_type".to_string(),
                })?,
            None => vec![token_type::NORMAL; tokens.len()],
        };
        let scores = match file.get_array("tokenizer.ggml.scores") {
            Some(values) => values
                .iter()
                .map(|value| value.as_f64().map(|s| s as f32))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| TextError::MissingMetadata {
                    key: "tokenizer.ggml.scores".to_string(),
                })?,
            None => Vec::new(),
        };
        let merges = if file.get("tokenizer.ggml.merges").is_some() {
            strings(file, "tokenizer.ggml.merges")?
        } else {
            Vec::new()
        };
        Ok(GgufVocab {
            model,
            pre: file.get_str("tokenizer.ggml.pre").map(str::to_string),
            tokens,
            token_types,
            scores,
            merges,
            bos_token_id: id(file, "tokenizer.ggml.bos_token_id"),
            eos_token_id: id(file, "tokenizer.ggml.eos_token_id"),
            eot_token_id: id(file, "tokenizer.ggml.eot_token_id"),
            eom_token_id: id(file, "tokenizer.ggml.eom_token_id"),
            unknown_token_id: id(file, "tokenizer.ggml.unknown_token_id"),
            fim_token_ids: [
                ("fim_pre", Some("prefix")),
                ("fim_suf", Some("suffix")),
                ("fim_mid", Some("middle")),
                ("fim_pad", None),
                ("fim_rep", None),
                ("fim_sep", None),
            ]
            .map(|(key, deprecated)| {
                deprecated
                    .and_then(|old| id(file, &format!("tokenizer.ggml.{old}_token_id")))
                    .or_else(|| id(file, &format!("tokenizer.ggml.{key}_token_id")))
            }),
            add_bos_token: file
                .get("tokenizer.ggml.add_bos_token")
                .and_then(MetadataValue::as_bool),
            add_eos_token: file
                .get("tokenizer.ggml.add_eos_token")
                .and_then(MetadataValue::as_bool),
            add_space_prefix: file
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(MetadataValue::as_bool),
            chat_template: file.get_str("tokenizer.chat_template").map(str::to_string),
        })
    }

    fn token_type(&self, id: usize) -> i32 {
        self.token_types
            .get(id)
            .copied()
            .unwrap_or(token_type::NORMAL)
    }

    /// Whether encoding with special tokens prepends BOS (llama.cpp's default: SentencePiece yes,
    /// BPE no, unless the file says otherwise; SPM-style BPE always, whatever the file says).
    pub fn adds_bos(&self) -> bool {
        self.is_spm_bpe() || self.add_bos_token.unwrap_or(self.model == "llama")
    }

    /// Whether llama.cpp encodes this vocabulary as SPM-style BPE (its pre-tokenizer type
    /// `GEMMA4`): the `gemma4` model, or `gpt2` with a `gemma4` pre-tokenizer.
    pub fn is_spm_bpe(&self) -> bool {
        self.model == "gemma4"
            || (self.model == "gpt2"
                && matches!(
                    self.pre.as_deref(),
                    Some("gemma4" | "granite-embed-multi-311m")
                ))
    }

    /// First id of every token string; later duplicates (some SentencePiece vocabularies have
    /// them) keep their id but are reachable only by id.
    fn vocab_map(&self) -> HashMap<String, u32> {
        let mut vocab = HashMap::with_capacity(self.tokens.len());
        for (id, token) in self.tokens.iter().enumerate() {
            let id = u32::try_from(id).unwrap_or(u32::MAX);
            vocab.entry(token.clone()).or_insert(id);
        }
        vocab
    }

    /// The Hugging Face tokenizer pipeline equivalent to llama.cpp's for this vocabulary (for
    /// SPM-style BPE, llama.cpp's decoding and an approximation of its encoding, which
    /// [`crate::Tokenizer`] replaces with llama.cpp's own encoder).
    pub fn build(&self) -> Result<tokenizers::Tokenizer> {
        if self.tokens.is_empty() {
            return Err(TextError::InvalidVocabulary(
                "tokenizer.ggml.tokens is empty".to_string(),
            ));
        }
        if self.is_spm_bpe() {
            return Ok(self.build_spm_bpe()?.pipeline);
        }
        let mut tokenizer = match self.model.as_str() {
            "gpt2" => self.build_byte_level_bpe()?,
            "llama" => self.build_sentencepiece()?,
            "bert" => self.build_wordpiece()?,
            other => {
                return Err(TextError::UnsupportedTokenizerModel {
                    model: other.to_string(),
                })
            }
        };
        let mut special = Vec::new();
        let mut user_defined = Vec::new();
        for (id, token) in self.tokens.iter().enumerate() {
            match self.token_type(id) {
                token_type::CONTROL | token_type::UNKNOWN => {
                    special.push(AddedToken::from(token.clone(), true))
                }
                token_type::USER_DEFINED => {
                    user_defined.push(AddedToken::from(token.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
        tokenizer.add_special_tokens(&special);
        tokenizer.add_tokens(&user_defined);
        Ok(tokenizer)
    }

    /// An SPM-style BPE vocabulary (Gemma 4): llama.cpp's encoder, the pipeline that decodes
    /// (and approximates the encoder for an exported `tokenizer.json`: `tokenizers` matches
    /// added tokens leftmost-longest and always merges, where llama.cpp cuts the longest
    /// special token out first and takes a token made only of newlines whole) and
    /// llama.cpp's end-of-generation ids. Fails on what llama.cpp cannot load or encode with:
    /// no merges, duplicate token texts, no BOS, special ids outside the vocabulary.
    pub(crate) fn build_spm_bpe(&self) -> Result<SpmBpeVocab> {
        if self.tokens.is_empty() {
            return Err(TextError::InvalidVocabulary(
                "tokenizer.ggml.tokens is empty".to_string(),
            ));
        }
        if self.merges.is_empty() {
            return Err(TextError::MissingMetadata {
                key: "tokenizer.ggml.merges".to_string(),
            });
        }
        // llama.cpp names empty texts after their id, so every token has a text.
        let tokens: Vec<String> = self
            .tokens
            .iter()
            .enumerate()
            .map(|(id, token)| {
                if token.is_empty() {
                    format!("[EMPTY_{id}]")
                } else {
                    token.clone()
                }
            })
            .collect();
        let mut seen = HashSet::with_capacity(tokens.len());
        if let Some(duplicate) = tokens.iter().find(|token| !seen.insert(token.as_str())) {
            return Err(TextError::InvalidVocabulary(format!(
                "token {duplicate:?} appears twice"
            )));
        }
        let in_range = |id: Option<u32>, key: &str| match id {
            Some(id) if id as usize >= tokens.len() => Err(TextError::InvalidVocabulary(format!(
                "tokenizer.ggml.{key} = {id} is outside the vocabulary ({} tokens)",
                tokens.len()
            ))),
            _ => Ok(id),
        };
        if in_range(self.bos_token_id, "bos_token_id")?.is_none() {
            // BOS is always added: llama.cpp cannot encode such a file either.
            return Err(TextError::MissingMetadata {
                key: "tokenizer.ggml.bos_token_id".to_string(),
            });
        }
        in_range(self.unknown_token_id, "unknown_token_id")?;
        let mut named = NamedIds {
            eos: in_range(self.eos_token_id, "eos_token_id")?,
            eot: in_range(self.eot_token_id, "eot_token_id")?,
            eom: in_range(self.eom_token_id, "eom_token_id")?,
            fim: self.fim_token_ids,
        };
        for fim in &mut named.fim {
            *fim = in_range(*fim, "fim_*_token_id")?;
        }
        let attributes = llama_cpp_attributes(&tokens, &self.token_types, &named);

        let special_ids: Vec<u32> = (0..tokens.len())
            .filter(|&id| attributes.is_matched_whole(id))
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
        let encoder = SpmBpe::new(&tokens, &self.merges, &special_ids);

        let mut vocab = HashMap::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            vocab.insert(token.clone(), u32::try_from(id).unwrap_or(u32::MAX));
        }
        // `tokenizers` refuses a merge whose halves or result are not tokens; llama.cpp keeps
        // them (they matter to its encoder, not to decoding), so the pipeline goes without.
        let merges: Vec<(String, String)> = self
            .merges
            .iter()
            .filter_map(|merge| {
                let split = merge.as_bytes().iter().skip(1).position(|&b| b == b' ')? + 1;
                let (left, right) = (&merge[..split], &merge[split + 1..]);
                let known = vocab.contains_key(left)
                    && vocab.contains_key(right)
                    && vocab.contains_key(&format!("{left}{right}"));
                known.then(|| (left.to_string(), right.to_string()))
            })
            .collect();
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
            .byte_fallback(true);
        if let Some(unknown) = self.unknown_token_id.and_then(|id| tokens.get(id as usize)) {
            builder = builder.unk_token(unknown.clone());
        }
        let model = builder.build().map_err(TextError::tokenizer)?;
        let newlines = Split::new(
            SplitPattern::Regex(r"\n+".to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(TextError::tokenizer)?;
        let decoders: Vec<DecoderWrapper> = vec![
            Replace::new("\u{2581}", " ")
                .map_err(TextError::tokenizer)?
                .into(),
            ByteFallback::new().into(),
            Fuse::new().into(),
        ];
        let mut pipeline = tokenizers::Tokenizer::new(model);
        pipeline
            .with_normalizer(Some(
                Replace::new(" ", "\u{2581}").map_err(TextError::tokenizer)?,
            ))
            .with_pre_tokenizer(Some(newlines))
            .with_decoder(Some(DecoderSequence::new(decoders)));
        let mut special = Vec::new();
        let mut user_defined = Vec::new();
        for &id in &special_ids {
            let token = &tokens[id as usize];
            if attributes.is_hidden_without_special(id as usize) {
                special.push(AddedToken::from(token.clone(), true));
            } else {
                user_defined.push(AddedToken::from(token.clone(), false).normalized(false));
            }
        }
        pipeline.add_special_tokens(&special);
        pipeline.add_tokens(&user_defined);
        Ok(SpmBpeVocab {
            pipeline,
            encoder,
            end_of_generation: attributes.end_of_generation,
        })
    }

    fn build_byte_level_bpe(&self) -> Result<tokenizers::Tokenizer> {
        let spec = PreTokenizerSpec::for_name(self.pre.as_deref())?;
        let merges = self
            .merges
            .iter()
            .map(|merge| {
                merge
                    .split_once(' ')
                    .map(|(left, right)| (left.to_string(), right.to_string()))
                    .ok_or_else(|| {
                        TextError::InvalidVocabulary(format!(
                            "merge {merge:?} is not \"left right\""
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let model = BPE::builder()
            .vocab_and_merges(self.vocab_map().into_iter().collect::<Vocab>(), merges)
            .ignore_merges(spec.ignore_merges)
            .build()
            .map_err(TextError::tokenizer)?;
        let mut pieces: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
        for regex in &spec.regexes {
            let split = Split::new(
                SplitPattern::Regex((*regex).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(TextError::tokenizer)?;
            pieces.push(split.into());
        }
        // The regexes already split the text; ByteLevel only maps bytes to its printable alphabet.
        pieces.push(
            tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, false, false).into(),
        );
        let mut tokenizer = tokenizers::Tokenizer::new(model);
        tokenizer
            .with_pre_tokenizer(Some(PreTokenizerSequence::new(pieces)))
            .with_decoder(Some(ByteLevel::default()));
        Ok(tokenizer)
    }

    fn build_wordpiece(&self) -> Result<tokenizers::Tokenizer> {
        use tokenizers::models::wordpiece::WordPiece;
        use tokenizers::normalizers::bert::BertNormalizer;
        use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
        use tokenizers::processors::template::TemplateProcessing;

        let mut vocab = HashMap::with_capacity(self.tokens.len());
        for (id, token) in self.tokens.iter().enumerate() {
            let piece = if token.starts_with('[') && token.ends_with(']') {
                token.clone()
            } else if let Some(word) = token.strip_prefix('\u{2581}') {
                word.to_string()
            } else {
                format!("##{token}")
            };
            vocab
                .entry(piece)
                .or_insert(u32::try_from(id).unwrap_or(u32::MAX));
        }
        let name = |id: Option<u32>, key: &str| {
            id.and_then(|id| self.tokens.get(id as usize))
                .cloned()
                .ok_or_else(|| TextError::MissingMetadata {
                    key: key.to_string(),
                })
        };
        let unknown = name(self.unknown_token_id, "tokenizer.ggml.unknown_token_id")?;
        let model = WordPiece::builder()
            .vocab(vocab.into_iter().collect::<Vocab>())
            .unk_token(unknown)
            .continuing_subword_prefix("##".to_string())
            .build()
            .map_err(TextError::tokenizer)?;
        let mut tokenizer = tokenizers::Tokenizer::new(model);
        tokenizer
            .with_normalizer(Some(BertNormalizer::new(true, true, None, true)))
            .with_pre_tokenizer(Some(BertPreTokenizer))
            .with_decoder(Some(tokenizers::decoders::wordpiece::WordPiece::default()));
        if let (Some(cls_id), Some(sep_id)) = (self.bos_token_id, self.eos_token_id) {
            let cls = name(Some(cls_id), "tokenizer.ggml.bos_token_id")?;
            let sep = name(Some(sep_id), "tokenizer.ggml.eos_token_id")?;
            let template = TemplateProcessing::builder()
                .try_single(format!("{cls}:0 $A:0 {sep}:0"))
                .and_then(|b| b.try_pair(format!("{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1")))
                .map_err(|e| TextError::InvalidVocabulary(e.to_string()))?
                .special_tokens(vec![(cls, cls_id), (sep, sep_id)])
                .build()
                .map_err(|e| TextError::InvalidVocabulary(e.to_string()))?;
            tokenizer.with_post_processor(Some(template));
        }
        Ok(tokenizer)
    }

    fn build_sentencepiece(&self) -> Result<tokenizers::Tokenizer> {
        if self.scores.len() != self.tokens.len() {
            return Err(TextError::MissingMetadata {
                key: "tokenizer.ggml.scores".to_string(),
            });
        }
        let vocab = self.vocab_map();
        let merges = sentencepiece_merges(&self.tokens, &self.scores, &self.token_types, &vocab);
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(unknown) = self
            .unknown_token_id
            .and_then(|id| self.tokens.get(id as usize))
        {
            builder = builder.unk_token(unknown.clone());
        }
        let model = builder.build().map_err(TextError::tokenizer)?;
        let add_space_prefix = self.add_space_prefix.unwrap_or(true);
        let replace_space = Replace::new(" ", "\u{2581}").map_err(TextError::tokenizer)?;
        let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
        if add_space_prefix {
            normalizers.push(Prepend::new("\u{2581}".to_string()).into());
        }
        normalizers.push(replace_space.into());
        let mut decoders: Vec<DecoderWrapper> = vec![
            Replace::new("\u{2581}", " ")
                .map_err(TextError::tokenizer)?
                .into(),
            ByteFallback::new().into(),
            Fuse::new().into(),
        ];
        if add_space_prefix {
            decoders.push(Strip::new(' ', 1, 0).into());
        }
        let mut tokenizer = tokenizers::Tokenizer::new(model);
        tokenizer
            .with_normalizer(Some(NormalizerSequence::new(normalizers)))
            .with_decoder(Some(DecoderSequence::new(decoders)));
        Ok(tokenizer)
    }
}

/// What an SPM-style BPE vocabulary builds into (see [`GgufVocab::build_spm_bpe`]).
pub(crate) struct SpmBpeVocab {
    /// Decodes; encodes only approximately (an exported `tokenizer.json`).
    pub pipeline: tokenizers::Tokenizer,
    /// Encodes as llama.cpp does.
    pub encoder: SpmBpe,
    /// llama.cpp's end-of-generation ids (EOS among them).
    pub end_of_generation: BTreeSet<u32>,
}

/// SentencePiece BPE as ranked merges: every split of a normal token into two tokens is a merge,
/// ranked by the merged token's score (higher first), ties by id. This is what Hugging Face's
/// Llama converter does, and it reproduces SentencePiece's greedy highest-score-pair merging.
fn sentencepiece_merges(
    tokens: &[String],
    scores: &[f32],
    token_types: &[i32],
    vocab: &HashMap<String, u32>,
) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, usize, String, String)> = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        let kind = token_types.get(id).copied().unwrap_or(token_type::NORMAL);
        if kind != token_type::NORMAL && kind != token_type::USER_DEFINED {
            continue;
        }
        for (split, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(split);
            if vocab.contains_key(left) && vocab.contains_key(right) {
                ranked.push((scores[id], id, left.to_string(), right.to_string()));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked
        .into_iter()
        .map(|(_, _, left, right)| (left, right))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentencepiece_vocab() -> GgufVocab {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut token_types = vec![
            token_type::UNKNOWN,
            token_type::CONTROL,
            token_type::CONTROL,
        ];
        for byte in 0..=255u8 {
            tokens.push(format!("<0x{byte:02X}>"));
            token_types.push(token_type::BYTE);
        }
        for piece in [
            "▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "▁he", "llo", "▁hello", "▁w", "or",
            "▁wor", "ld", "▁world",
        ] {
            tokens.push(piece.to_string());
            token_types.push(token_type::NORMAL);
        }
        // Longer pieces score higher, as in a trained SentencePiece model.
        let scores = tokens.iter().map(|t| t.chars().count() as f32).collect();
        GgufVocab {
            model: "llama".into(),
            tokens,
            token_types,
            scores,
            bos_token_id: Some(1),
            eos_token_id: Some(2),
            unknown_token_id: Some(0),
            ..GgufVocab::default()
        }
    }

    #[test]
    fn sentencepiece_merges_by_score_and_falls_back_to_bytes() {
        let vocab = sentencepiece_vocab();
        let tokenizer = vocab.build().unwrap();
        let encoding = tokenizer.encode("hello world", false).unwrap();
        let pieces: Vec<&str> = encoding.get_tokens().iter().map(String::as_str).collect();
        assert_eq!(pieces, vec!["▁hello", "▁world"]);
        // "é" is not in the vocabulary: its two UTF-8 bytes become byte tokens.
        let encoding = tokenizer.encode("hé", false).unwrap();
        let pieces: Vec<&str> = encoding.get_tokens().iter().map(String::as_str).collect();
        assert_eq!(pieces, vec!["▁", "h", "<0xC3>", "<0xA9>"]);
        assert_eq!(tokenizer.decode(encoding.get_ids(), false).unwrap(), "hé");
    }

    #[test]
    fn sentencepiece_control_tokens_are_split_out() {
        let tokenizer = sentencepiece_vocab().build().unwrap();
        let encoding = tokenizer.encode("hello</s>", false).unwrap();
        assert_eq!(encoding.get_ids().last().copied(), Some(2));
    }

    #[test]
    fn unknown_model_is_named_in_the_error() {
        let vocab = GgufVocab {
            model: "t5".into(),
            tokens: vec!["a".into()],
            ..GgufVocab::default()
        };
        let error = vocab.build().unwrap_err();
        assert!(error.to_string().contains("\"t5\""), "{error}");
    }

    fn gemma4_vocab() -> GgufVocab {
        GgufVocab {
            model: "gemma4".into(),
            tokens: ["<pad>", "<eos>", "<bos>", "a", "b", "ab", "<0x63>"]
                .map(String::from)
                .to_vec(),
            token_types: vec![3, 3, 3, 1, 1, 1, 6],
            merges: vec!["a b".into()],
            bos_token_id: Some(2),
            eos_token_id: Some(1),
            add_bos_token: Some(false),
            ..GgufVocab::default()
        }
    }

    #[test]
    fn gemma4_adds_bos_whatever_the_file_says() {
        let vocab = gemma4_vocab();
        assert!(vocab.is_spm_bpe() && vocab.adds_bos());
        let built = vocab.build_spm_bpe().unwrap();
        assert_eq!(built.encoder.encode("abc<eos>"), vec![5, 6, 1]);
        assert_eq!(built.end_of_generation, BTreeSet::from([1]));
        // A gpt2 file with Gemma 4's pre-tokenizer is the same tokenizer.
        let vocab = GgufVocab {
            model: "gpt2".into(),
            pre: Some("gemma4".into()),
            ..gemma4_vocab()
        };
        assert!(vocab.is_spm_bpe());
    }

    #[test]
    fn gemma4_vocabularies_llama_cpp_cannot_use_are_refused() {
        let duplicate = GgufVocab {
            tokens: ["<pad>", "<eos>", "<bos>", "a", "a", "ab", "<0x63>"]
                .map(String::from)
                .to_vec(),
            ..gemma4_vocab()
        };
        let outside = GgufVocab {
            eos_token_id: Some(7),
            ..gemma4_vocab()
        };
        let no_bos = GgufVocab {
            bos_token_id: None,
            ..gemma4_vocab()
        };
        for (vocab, expected) in [
            (duplicate, "\"a\" appears twice"),
            (outside, "eos_token_id = 7 is outside"),
            (no_bos, "bos_token_id"),
        ] {
            let error = vocab.build().unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
        }
    }
}
