//! Pre-tokenizer regexes for GGUF BPE vocabularies, keyed by `tokenizer.ggml.pre`.
//!
//! GGUF files do not carry the pre-tokenizer itself, only its name; llama.cpp
//! (`src/llama-vocab.cpp`, `llm_tokenizer_bpe`) maps each name to a list of regexes that split
//! the text one after another, every match and every gap becoming its own piece. The same
//! behaviour is a sequence of `Split(regex, Isolated)` pre-tokenizers, which is how we build it.

use crate::error::{Result, TextError};

/// The GPT-2 word regex (llama.cpp's spelling, without the trailing `|\s+` alternative: the gap
/// it would match becomes a piece of its own anyway).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3 / tiktoken-style regex with the case-insensitive contractions spelled out.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2: like Llama 3 but single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's tekken (Nemo and later): case-aware word splitting.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o (o200k) style.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a named pre-tokenizer splits text before BPE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreTokenizerSpec {
    /// Applied in order; each splits every piece the previous ones produced.
    pub regexes: Vec<&'static str>,
    /// Whole pieces already in the vocabulary skip the merges (Llama 3, tekken).
    pub ignore_merges: bool,
}

impl PreTokenizerSpec {
    fn new(regexes: &[&'static str], ignore_merges: bool) -> Self {
        PreTokenizerSpec {
            regexes: regexes.to_vec(),
            ignore_merges,
        }
    }

    /// The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre` = `name` (`None`: key absent,
    /// which llama.cpp treats as "default").
    pub fn for_name(name: Option<&str>) -> Result<Self> {
        let spec = match name.unwrap_or("default") {
            "default" => Self::new(
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
                false,
            ),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "dbrx"
            | "smaug-bpe" => Self::new(&[LLAMA3], true),
            "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de"
            | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => Self::new(&[GPT2], false),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => Self::new(&[r"\p{N}", GPT2], false),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" | "hunyuan" => {
                Self::new(&[QWEN2], false)
            }
            "tekken" => Self::new(&[TEKKEN], true),
            "gpt-4o" | "minimax-m2" => Self::new(&[GPT4O], false),
            "falcon" => Self::new(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"], false),
            "chatglm-bpe" => Self::new(&[LLAMA3], false),
            "poro-chat" | "bloom" | "gpt3-finnish" => {
                Self::new(&[r" ?[^(\s|.,!?…。，、।۔،)]+"], false)
            }
            "viking" => Self::new(&[r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"], false),
            other => {
                return Err(TextError::UnsupportedPreTokenizer {
                    pre: other.to_string(),
                })
            }
        };
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm_splits_digits_before_gpt2_words() {
        let spec = PreTokenizerSpec::for_name(Some("smollm")).unwrap();
        assert_eq!(spec.regexes, vec![r"\p{N}", GPT2]);
        assert!(!spec.ignore_merges);
    }

    #[test]
    fn llama3_ignores_merges_and_missing_name_is_default() {
        assert!(
            PreTokenizerSpec::for_name(Some("llama-bpe"))
                .unwrap()
                .ignore_merges
        );
        assert_eq!(PreTokenizerSpec::for_name(None).unwrap().regexes.len(), 4);
    }

    #[test]
    fn unknown_name_is_a_precise_error() {
        let error = PreTokenizerSpec::for_name(Some("mystery")).unwrap_err();
        assert!(error.to_string().contains("\"mystery\""), "{error}");
    }
}
