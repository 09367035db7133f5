//! [`Tokenizer`]: text ↔ token ids for one model, from tokenizer.json or GGUF metadata.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tokenizers::decoders::DecoderWrapper;
use tokenmill_gguf::GgufFile;

use crate::error::{Result, TextError};
use crate::gguf_vocab::GgufVocab;
use crate::spm_bpe::SpmBpe;

mod hf_export;

pub use hf_export::HfTokenizerFiles;

/// Token texts llama.cpp treats as end-of-generation whenever they are in the vocabulary
/// (`llama_vocab::impl::load`, "auto-detect special tokens by text").
const LLAMA_CPP_END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// End-of-turn markers chat templates close an assistant message with; when a model's template
/// contains one that is a token, generating it ends the turn.
const TEMPLATE_END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|END_OF_TURN_TOKEN|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "</s>",
];

/// How ids become text: vLLM's `skip_special_tokens` and `spaces_between_special_tokens`
/// (both default true).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Drop control tokens (BOS, EOS, "<|im_end|>", ...) from the text.
    pub skip_special_tokens: bool,
    /// `true` decodes all ids in one pass, as vLLM's fast (`tokenizers`) path does. `false`
    /// decodes the ordinary runs between added tokens separately and joins them with the added
    /// tokens' text and nothing else, as Hugging Face's slow path does: a decoder that turns
    /// a leading "▁" into a space and strips it at the start of the text (SentencePiece
    /// with a space prefix) then adds no space after an added token ("`<s>Hello`", not
    /// "`<s> Hello`"). Byte-level vocabularies (GPT-2 style: SmolLM2, Llama 3, Qwen2) map
    /// each token to its own bytes, so there the two settings always give the same text.
    pub spaces_between_special_tokens: bool,
}

impl Default for DecodeOptions {
    fn default() -> DecodeOptions {
        DecodeOptions {
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
        }
    }
}

impl DecodeOptions {
    /// vLLM's defaults with `skip_special_tokens` as given.
    pub fn skipping_special_tokens(skip_special_tokens: bool) -> DecodeOptions {
        DecodeOptions {
            skip_special_tokens,
            ..DecodeOptions::default()
        }
    }
}

/// Where a tokenizer came from; decides how `add_special_tokens` behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// tokenizer.json: its post-processor decides what `add_special_tokens` adds.
    HuggingFace,
    /// GGUF metadata: BOS/EOS are added by hand per `add_bos_token`/`add_eos_token`.
    Gguf,
}

/// A model's tokenizer: encoding, decoding, special tokens and the end-of-sequence set.
///
/// Special tokens written in the input text (e.g. "<|im_start|>") always encode to their single
/// id, as vLLM and llama.cpp's server do for rendered chat prompts.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// llama.cpp's own encoder, used in place of `inner` to encode (SPM-style BPE GGUF
    /// vocabularies: Gemma 4); `inner` still decodes.
    encoder: Option<Arc<SpmBpe>>,
    source: Source,
    byte_level: bool,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eos_token_ids: BTreeSet<u32>,
    special_ids: HashSet<u32>,
    /// Added tokens, special or not: matched whole in text, decoded as their own text.
    added_ids: HashSet<u32>,
    chat_template: Option<String>,
    /// Highest id + 1, computed once: `tokenizers` rebuilds its whole vocabulary map to count it.
    vocab_size: usize,
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`, with BOS/EOS names and the chat template from
    /// `tokenizer_config.json` when given.
    pub fn from_file(tokenizer_json: &Path, tokenizer_config: Option<&Path>) -> Result<Self> {
        let mut inner = tokenizers::Tokenizer::from_file(tokenizer_json).map_err(|error| {
            TextError::Tokenizer(format!("{}: {error}", tokenizer_json.display()))
        })?;
        // A tokenizer.json may carry the truncation and padding it was last used with
        // (all-MiniLM-L6-v2's pads every text to 128 tokens); transformers resets both on
        // every call, and length limits are the engine's business.
        inner
            .with_truncation(None)
            .map_err(TextError::tokenizer)?
            .with_padding(None);
        let config = match tokenizer_config {
            Some(path) => read_json(path)?,
            None => Value::Null,
        };
        let bos_token_id =
            special_token_name(&config, "bos_token").and_then(|name| inner.token_to_id(&name));
        let eos_token_id =
            special_token_name(&config, "eos_token").and_then(|name| inner.token_to_id(&name));
        let chat_template = config_chat_template(&config);
        // The post-processor, not the config's flags, decides what encoding adds: ask it.
        let added = inner
            .encode_fast("", true)
            .map_err(TextError::tokenizer)?
            .get_ids()
            .to_vec();
        let mut tokenizer = Tokenizer::assemble(
            inner,
            Source::HuggingFace,
            bos_token_id,
            eos_token_id,
            chat_template,
        );
        tokenizer.add_bos = bos_token_id.is_some() && added.first().copied() == bos_token_id;
        tokenizer.add_eos = eos_token_id.is_some() && added.last().copied() == eos_token_id;
        Ok(tokenizer)
    }

    /// Loads a Hugging Face model directory: `tokenizer.json`, and `tokenizer_config.json` and
    /// `generation_config.json` (its `eos_token_id`, one id or a list, joins the EOS set) if present.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let config = dir.join("tokenizer_config.json");
        let mut tokenizer = Tokenizer::from_file(
            &dir.join("tokenizer.json"),
            config.exists().then_some(config.as_path()),
        )?;
        let generation_config = dir.join("generation_config.json");
        if generation_config.exists() {
            let value = read_json(&generation_config)?;
            let ids = match value.get("eos_token_id") {
                Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_u64).collect(),
                Some(id) => id.as_u64().into_iter().collect(),
                None => Vec::new(),
            };
            for id in ids {
                if let Ok(id) = u32::try_from(id) {
                    tokenizer.eos_token_ids.insert(id);
                }
            }
        }
        Ok(tokenizer)
    }

    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Tokenizer::from_gguf_vocab(&GgufVocab::from_gguf(file)?)
    }

    /// Builds the tokenizer from GGUF vocabulary data already read (see [`GgufVocab`]).
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Self> {
        if vocab.is_spm_bpe() {
            return Tokenizer::from_spm_bpe_vocab(vocab);
        }
        let inner = vocab.build()?;
        let mut tokenizer = Tokenizer::assemble(
            inner,
            Source::Gguf,
            vocab.bos_token_id,
            vocab.eos_token_id,
            vocab.chat_template.clone(),
        );
        tokenizer.byte_level = vocab.model == "gpt2";
        tokenizer.add_bos = vocab.adds_bos();
        tokenizer.add_eos = vocab.add_eos_token.unwrap_or(false);
        tokenizer.eos_token_ids.extend(vocab.eot_token_id);
        tokenizer.eos_token_ids.extend(vocab.eom_token_id);
        for text in LLAMA_CPP_END_OF_GENERATION {
            if let Some(id) = tokenizer.token_to_id(text) {
                tokenizer.eos_token_ids.insert(id);
            }
        }
        // gpt-oss's harmony: `<|call|>` and `<|return|>` end the generation, and `<|end|>`
        // only closes a message (an analysis message is followed by the final one), as
        // llama.cpp decides when all three are tokens.
        let harmony = ["<|call|>", "<|return|>"].map(|text| tokenizer.token_to_id(text));
        if let [Some(call), Some(end_of_answer)] = harmony {
            if let Some(end) = tokenizer.token_to_id("<|end|>") {
                if vocab.eos_token_id != Some(end) {
                    tokenizer.eos_token_ids.remove(&end);
                }
                tokenizer.eos_token_ids.insert(call);
                tokenizer.eos_token_ids.insert(end_of_answer);
            }
        }
        Ok(tokenizer)
    }

    /// Gemma 4's kind of GGUF vocabulary: llama.cpp's encoder, BOS always added, and
    /// llama.cpp's end-of-generation set (`<eos>`, `<turn|>`, `<|tool_response>` for Gemma 4).
    fn from_spm_bpe_vocab(vocab: &GgufVocab) -> Result<Self> {
        let built = vocab.build_spm_bpe()?;
        let mut tokenizer = Tokenizer::assemble(
            built.pipeline,
            Source::Gguf,
            vocab.bos_token_id,
            vocab.eos_token_id,
            vocab.chat_template.clone(),
        );
        tokenizer.encoder = Some(Arc::new(built.encoder));
        tokenizer.add_bos = vocab.adds_bos();
        tokenizer.add_eos = vocab.add_eos_token.unwrap_or(false);
        tokenizer.eos_token_ids.extend(built.end_of_generation);
        Ok(tokenizer)
    }

    fn assemble(
        inner: tokenizers::Tokenizer,
        source: Source,
        bos_token_id: Option<u32>,
        eos_token_id: Option<u32>,
        chat_template: Option<String>,
    ) -> Self {
        let added = inner.get_added_tokens_decoder();
        let special_ids = added
            .iter()
            .filter(|(_, token)| token.special)
            .map(|(&id, _)| id)
            .collect();
        let added_ids = added.into_keys().collect();
        let byte_level = inner.get_decoder().is_some_and(decoder_is_byte_level);
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&id| id as usize + 1);
        let mut tokenizer = Tokenizer {
            inner,
            encoder: None,
            source,
            byte_level,
            bos_token_id,
            eos_token_id,
            add_bos: false,
            add_eos: false,
            eos_token_ids: eos_token_id.into_iter().collect(),
            special_ids,
            added_ids,
            chat_template: None,
            vocab_size,
        };
        if let Some(template) = &chat_template {
            tokenizer.register_chat_template_end_tokens(template);
        }
        tokenizer.chat_template = chat_template;
        tokenizer
    }

    /// Adds the end-of-turn tokens a chat template uses (e.g. "<|im_end|>") to the EOS set; call
    /// it for a template given on the command line, the model's own is registered at load.
    pub fn register_chat_template_end_tokens(&mut self, template_source: &str) {
        for text in TEMPLATE_END_OF_TURN {
            if template_source.contains(text) {
                if let Some(id) = self.token_to_id(text) {
                    self.eos_token_ids.insert(id);
                }
            }
        }
    }

    /// The model's own chat template source (GGUF `tokenizer.chat_template` or
    /// tokenizer_config.json `chat_template`, the "default" one when it is a list).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Token ids for `text`. Special tokens written in the text are recognised. With
    /// `add_special_tokens`, BOS (and EOS) are added only where the model asks for them.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        match self.source {
            Source::HuggingFace => {
                let encoding = self
                    .inner
                    .encode_fast(text, add_special_tokens)
                    .map_err(TextError::tokenizer)?;
                Ok(encoding.get_ids().to_vec())
            }
            Source::Gguf => {
                let (encoded, encoding);
                let ids = match &self.encoder {
                    Some(encoder) => {
                        encoded = encoder.encode(text);
                        encoded.as_slice()
                    }
                    None => {
                        encoding = self
                            .inner
                            .encode_fast(text, false)
                            .map_err(TextError::tokenizer)?;
                        encoding.get_ids()
                    }
                };
                let mut out = Vec::with_capacity(ids.len() + 2);
                if add_special_tokens && self.add_bos {
                    out.extend(self.bos_token_id);
                }
                out.extend_from_slice(ids);
                if add_special_tokens && self.add_eos {
                    out.extend(self.eos_token_id);
                }
                Ok(out)
            }
        }
    }

    /// `text` without BOS/EOS as an `Encoding` (for truncation and pairs): from llama.cpp's
    /// encoder where there is one (its tokens carry no offsets), else from the pipeline.
    fn encode_plain(&self, text: &str) -> Result<tokenizers::Encoding> {
        let Some(encoder) = &self.encoder else {
            return self
                .inner
                .encode_fast(text, false)
                .map_err(TextError::tokenizer);
        };
        let tokens = encoder
            .encode(text)
            .into_iter()
            .map(|id| {
                let value = self.inner.id_to_token(id).unwrap_or_default();
                tokenizers::Token::new(id, value, (0, 0))
            })
            .collect();
        Ok(tokenizers::Encoding::from_tokens(tokens, 0))
    }

    /// Token ids and token-type ids for a pooling model: one text, or a text pair joined as
    /// the post-processor says (`[CLS] a [SEP] b [SEP]`, types 0 then 1, for a BERT
    /// cross-encoder). With `max_len`, the texts are cut first (longest first, from the
    /// right) so that, special tokens included, at most `max_len` remain: transformers'
    /// `truncation=True, max_length=max_len`, which vLLM applies for
    /// `truncate_prompt_tokens`.
    pub fn encode_for_pooling(
        &self,
        first: &str,
        second: Option<&str>,
        add_special_tokens: bool,
        max_len: Option<usize>,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        use tokenizers::utils::truncation::{
            truncate_encodings, TruncationDirection, TruncationParams, TruncationStrategy,
        };
        use tokenizers::PostProcessor;
        let mut encoding = self.encode_plain(first)?;
        let mut pair = second.map(|text| self.encode_plain(text)).transpose()?;
        // A GGUF decoder's vocabulary has no post-processor: BOS/EOS are added by hand, as
        // `encode` does (Qwen3-Embedding's GGUF sets `add_eos_token`).
        let (bos, eos) = match (
            add_special_tokens,
            self.source,
            self.inner.get_post_processor(),
        ) {
            (true, Source::Gguf, None) => (
                self.bos_token_id.filter(|_| self.add_bos),
                self.eos_token_id.filter(|_| self.add_eos),
            ),
            _ => (None, None),
        };
        if let Some(max_len) = max_len {
            let added = match (add_special_tokens, self.inner.get_post_processor()) {
                (true, Some(processor)) => processor.added_tokens(pair.is_some()),
                _ => usize::from(bos.is_some()) + usize::from(eos.is_some()),
            };
            let params = TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_len.saturating_sub(added).max(1),
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            };
            (encoding, pair) =
                truncate_encodings(encoding, pair, &params).map_err(TextError::tokenizer)?;
        }
        let joined = self
            .inner
            .post_process(encoding, pair, add_special_tokens)
            .map_err(TextError::tokenizer)?;
        let mut ids = Vec::with_capacity(joined.len() + 2);
        ids.extend(bos);
        ids.extend_from_slice(joined.get_ids());
        ids.extend(eos);
        let mut types = Vec::with_capacity(ids.len());
        types.extend(bos.map(|_| 0));
        types.extend_from_slice(joined.get_type_ids());
        types.extend(eos.map(|_| joined.get_type_ids().last().copied().unwrap_or(0)));
        Ok((ids, types))
    }

    /// Text for `ids`. Incomplete UTF-8 at the end (a character split across tokens) decodes to
    /// U+FFFD; use [`crate::IncrementalDetokenizer`] for streaming.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let vocab_size = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(TextError::InvalidTokenId { id, vocab_size });
        }
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(TextError::tokenizer)
    }

    /// Text for `ids` with both of vLLM's decoding options (see [`DecodeOptions`]).
    pub fn decode_with(&self, ids: &[u32], options: DecodeOptions) -> Result<String> {
        let skip = options.skip_special_tokens;
        if options.spaces_between_special_tokens
            || !ids.iter().any(|id| self.added_ids.contains(id))
        {
            return self.decode(ids, skip);
        }
        let mut text = String::new();
        let mut run: Vec<u32> = Vec::with_capacity(ids.len());
        for &id in ids {
            // A skipped special token is dropped without splitting the run (as the slow path).
            if skip && self.special_ids.contains(&id) {
                continue;
            }
            if self.added_ids.contains(&id) {
                text.push_str(&self.decode(&run, skip)?);
                run.clear();
                text.push_str(&self.inner.id_to_token(id).unwrap_or_default());
            } else {
                run.push(id);
            }
        }
        text.push_str(&self.decode(&run, skip)?);
        Ok(text)
    }

    /// `bad_words` as token sequences, tokenized as vLLM does (`SamplingParams.
    /// update_from_tokenizer`): each word without its leading whitespace and without special
    /// tokens, and again after a space when that gives a different first token in as many
    /// tokens, so a word is banned at the start of the output and after a space.
    pub fn bad_words_token_ids(&self, words: &[String]) -> Result<Vec<Vec<u32>>> {
        let mut sequences: Vec<Vec<u32>> = Vec::with_capacity(words.len() * 2);
        for word in words {
            let word = word.trim_start();
            let plain = self.encode(word, false)?;
            let spaced = self.encode(&format!(" {word}"), false)?;
            let distinct = match (plain.first(), spaced.first()) {
                (Some(a), Some(b)) => a != b && plain.len() == spaced.len(),
                _ => false,
            };
            if !plain.is_empty() {
                sequences.push(plain);
            }
            if distinct {
                sequences.push(spaced);
            }
        }
        Ok(sequences)
    }

    /// The bytes one token stands for on its own (llama.cpp's `token_to_piece` with special
    /// tokens rendered). A piece may be part of a UTF-8 character, hence bytes.
    pub fn token_to_piece(&self, id: u32) -> Result<Vec<u8>> {
        let token = self
            .inner
            .id_to_token(id)
            .ok_or(TextError::InvalidTokenId {
                id,
                vocab_size: self.vocab_size(),
            })?;
        if self.special_ids.contains(&id) {
            return Ok(token.into_bytes());
        }
        if self.byte_level {
            let table = byte_level_decode_table();
            return Ok(token
                .chars()
                .flat_map(|c| match table.get(&c) {
                    Some(&byte) => vec![byte],
                    None => c.to_string().into_bytes(),
                })
                .collect());
        }
        if let Some(byte) = byte_fallback_value(&token) {
            return Ok(vec![byte]);
        }
        Ok(token.replace('\u{2581}', " ").into_bytes())
    }

    /// The vocabulary string of a token (byte-level or `▁`-marked, as stored).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Bytes of the longest token (its piece, special tokens as their text): no text longer
    /// than `n` times this can encode to `n` tokens or fewer. Computed over the vocabulary.
    pub fn max_token_bytes(&self) -> usize {
        (0..self.vocab_size as u32)
            .filter_map(|id| self.token_to_piece(id).ok())
            .map(|piece| piece.len())
            .max()
            .unwrap_or(0)
    }

    /// Number of token ids (highest id + 1), added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// BOS as text, for chat templates' `bos_token` ("" when the model has none).
    pub fn bos_token(&self) -> String {
        self.bos_token_id
            .and_then(|id| self.inner.id_to_token(id))
            .unwrap_or_default()
    }

    /// EOS as text, for chat templates' `eos_token` ("" when the model has none).
    pub fn eos_token(&self) -> String {
        self.eos_token_id
            .and_then(|id| self.inner.id_to_token(id))
            .unwrap_or_default()
    }

    /// Whether encoding with special tokens prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Every id that ends generation: EOS, EOT/EOM, the chat template's end-of-turn token and
    /// (GGUF) the tokens llama.cpp treats as end-of-generation. Sorted.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_ids.iter().copied().collect()
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// Control tokens: skipped by `decode(.., skip_special_tokens = true)`.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| TextError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| TextError::Json {
        path: path.display().to_string(),
        source,
    })
}

/// tokenizer_config.json writes special tokens as a string or as `{"content": ...}`.
fn special_token_name(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(name) => Some(name.clone()),
        Value::Object(token) => token
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which "default" is used.
pub(crate) fn config_chat_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(template) => Some(template.clone()),
        Value::Array(templates) => templates
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|entry| entry.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

fn decoder_is_byte_level(decoder: &DecoderWrapper) -> bool {
    match decoder {
        DecoderWrapper::ByteLevel(_) => true,
        DecoderWrapper::Sequence(_) => {
            serde_json::to_string(decoder).is_ok_and(|json| json.contains("\"type\":\"ByteLevel\""))
        }
        _ => false,
    }
}

/// `<0xAB>` → 0xAB (SentencePiece byte-fallback tokens).
fn byte_fallback_value(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2's byte-level alphabet reversed: printable char → the byte it stands for. Bytes that are
/// printable Latin-1 map to themselves; the other 68 are shifted to U+0100 and up, in order.
fn byte_level_decode_table() -> &'static std::collections::HashMap<char, u8> {
    static TABLE: OnceLock<std::collections::HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut shifted = 0u32;
        (0..=255u8)
            .map(|byte| {
                let c = if printable(byte) {
                    char::from(byte)
                } else {
                    shifted += 1;
                    char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
                };
                (c, byte)
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt-oss's harmony vocabulary: `<|call|>` and `<|return|>` end the generation,
    /// `<|end|>` (a message's end, then the next message's `<|start|>`) does not, as in
    /// llama.cpp.
    #[test]
    fn harmony_tokens_end_generation_but_end_of_message_does_not() {
        let tokens: Vec<String> = ["a", "b", "<|start|>", "<|end|>", "<|call|>", "<|return|>"]
            .map(String::from)
            .to_vec();
        let vocab = GgufVocab {
            model: "gpt2".into(),
            pre: Some("gpt-4o".into()),
            token_types: vec![1, 1, 3, 3, 3, 3],
            tokens,
            eos_token_id: Some(5),
            ..GgufVocab::default()
        };
        let tokenizer = Tokenizer::from_gguf_vocab(&vocab).unwrap();
        assert_eq!(tokenizer.eos_token_ids(), [4, 5]);
        let plain = GgufVocab {
            tokens: ["a", "b", "<|end|>"].map(String::from).to_vec(),
            token_types: vec![1, 1, 3],
            eos_token_id: None,
            ..vocab
        };
        assert_eq!(
            Tokenizer::from_gguf_vocab(&plain).unwrap().eos_token_ids(),
            [2]
        );
    }

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<crate::ChatTemplate>();
        assert_send_sync::<crate::IncrementalDetokenizer>();
    }

    #[test]
    fn byte_level_table_matches_gpt2() {
        let table = byte_level_decode_table();
        assert_eq!(table.len(), 256);
        assert_eq!(table[&'Ġ'], b' ');
        assert_eq!(table[&'Ċ'], b'\n');
        assert_eq!(table[&'A'], b'A');
        assert_eq!(table[&'ĉ'], b'\t');
    }

    #[test]
    fn byte_fallback_tokens_parse() {
        assert_eq!(byte_fallback_value("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_fallback_value("<0xZZ>"), None);
        assert_eq!(byte_fallback_value("<0x0A0>"), None);
    }

    #[test]
    fn config_chat_template_picks_default_from_list() {
        let config = serde_json::json!({
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
        });
        assert_eq!(config_chat_template(&config).as_deref(), Some("D"));
        let config = serde_json::json!({"eos_token": {"content": "</s>", "lstrip": false}});
        assert_eq!(
            special_token_name(&config, "eos_token").as_deref(),
            Some("</s>")
        );
    }
}
