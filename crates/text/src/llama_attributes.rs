//! llama.cpp's per-token attributes and end-of-generation set, as its vocabulary loader
//! (`llama_vocab::impl::load`) leaves them after its fix-ups by token text.
//!
//! A GGUF file gives each token a type (normal, control, user-defined, byte, ...). llama.cpp
//! turns types into attribute bits and then corrects them by name: end-of-turn, end-of-message
//! and fill-in-the-middle tokens are found by their text when the file names no id and become
//! control tokens; a fixed list of texts (`<eos>`, `<turn|>`, `<|tool_response>`, ...) ends
//! generation and is made control too; gpt-oss's `<|channel|>`-style markers become
//! user-defined; `<|end|>` stops ending generation next to gpt-oss's `<|return|>` and
//! `<|call|>`; and `</s>` is a normal token again in Gemma 4's vocabulary (next to
//! `<|tool_response>`). Which tokens are control or user-defined decides what is matched whole
//! in text and what decoding hides, so the SPM-style BPE path ([`crate::spm_bpe`]) takes its
//! special tokens from here.
//!
//! Where llama.cpp picks one of several matching tokens in hash-map order (two texts of one
//! fill-in-the-middle kind in one vocabulary), we pick the lowest id.

use std::collections::BTreeSet;

use crate::gguf_vocab::token_type;

/// llama.cpp's `llama_token_attr` bits that decide tokenization and decoding.
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
}

/// Ids a GGUF file names for the tokens llama.cpp would otherwise find by text (each already
/// checked to be inside the vocabulary).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NamedIds {
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    /// Fill-in-the-middle: prefix, suffix, middle, pad, repository, file separator.
    pub fim: [Option<u32>; 6],
}

const END_OF_TURN: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

const END_OF_MESSAGE: &[&str] = &["<|eom_id|>"];

/// Texts per fill-in-the-middle kind, in [`NamedIds::fim`]'s order.
const FILL_IN_THE_MIDDLE: [&[&str]; 6] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// Texts that end generation wherever they are in a vocabulary (llama.cpp 0c1e570's list).
pub(crate) const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// gpt-oss's markers, always rendered so that its parser can read them.
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The attribute bits of every token and the ids that end generation.
#[derive(Debug, Clone)]
pub(crate) struct LlamaCppAttributes {
    pub attrs: Vec<u32>,
    pub end_of_generation: BTreeSet<u32>,
}

impl LlamaCppAttributes {
    /// Whether llama.cpp matches the token whole in text with `parse_special` (its special
    /// tokens cache: control, user-defined and unknown tokens).
    pub fn is_matched_whole(&self, id: usize) -> bool {
        self.attrs
            .get(id)
            .is_some_and(|a| a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
    }

    /// Whether detokenizing without special tokens hides the token (control and unknown).
    pub fn is_hidden_without_special(&self, id: usize) -> bool {
        self.attrs
            .get(id)
            .is_some_and(|a| a & (attr::CONTROL | attr::UNKNOWN) != 0)
    }
}

fn from_type(kind: i32) -> u32 {
    match kind {
        token_type::NORMAL => attr::NORMAL,
        token_type::UNKNOWN => attr::UNKNOWN,
        token_type::CONTROL => attr::CONTROL,
        token_type::USER_DEFINED => attr::USER_DEFINED,
        token_type::UNUSED => attr::UNUSED,
        token_type::BYTE => attr::BYTE,
        // 0 (undefined) and anything unknown: rendered as nothing, never matched.
        _ => 0,
    }
}

/// llama.cpp's attributes for `tokens` of GGUF types `token_types` (absent: normal).
pub(crate) fn llama_cpp_attributes(
    tokens: &[String],
    token_types: &[i32],
    named: &NamedIds,
) -> LlamaCppAttributes {
    let mut attrs: Vec<u32> = (0..tokens.len())
        .map(|id| from_type(token_types.get(id).copied().unwrap_or(token_type::NORMAL)))
        .collect();
    let find = |names: &[&str]| {
        tokens
            .iter()
            .position(|token| names.contains(&token.as_str()))
            .and_then(|id| u32::try_from(id).ok())
    };
    let make_control = |id: Option<u32>, attrs: &mut Vec<u32>| {
        if let Some(a) = id.and_then(|id| attrs.get_mut(id as usize)) {
            *a |= attr::CONTROL;
        }
    };
    // Found by text only when the file names no id; the one found becomes a control token.
    let eot = named.eot.or_else(|| {
        let found = find(END_OF_TURN);
        make_control(found, &mut attrs);
        found
    });
    let eom = named.eom.or_else(|| {
        let found = find(END_OF_MESSAGE);
        make_control(found, &mut attrs);
        found
    });
    let mut fim = named.fim;
    for (slot, names) in fim.iter_mut().zip(FILL_IN_THE_MIDDLE) {
        if slot.is_none() {
            *slot = find(names);
            make_control(*slot, &mut attrs);
        }
    }

    // Pad, repository and file separator end fill-in-the-middle generation.
    let mut end_of_generation: BTreeSet<u32> = fim[3..].iter().flatten().copied().collect();
    for (id, token) in tokens.iter().enumerate() {
        if END_OF_GENERATION.contains(&token.as_str()) {
            if let Ok(id) = u32::try_from(id) {
                end_of_generation.insert(id);
            }
            attrs[id] |= attr::CONTROL;
        }
    }
    for (id, token) in tokens.iter().enumerate() {
        if ALWAYS_RENDERED.contains(&token.as_str()) {
            attrs[id] = attr::USER_DEFINED;
        }
    }
    end_of_generation.extend(named.eos);
    end_of_generation.extend(eot);
    end_of_generation.extend(eom);

    // gpt-oss (and solar-open): "<|end|>" closes a message, not the generation.
    let has = |set: &BTreeSet<u32>, texts: &[&str]| {
        set.iter().any(|&id| texts.contains(&text(tokens, id)))
    };
    if has(&end_of_generation, &["<|end|>"])
        && has(&end_of_generation, &["<|call|>", "<|calls|>"])
        && has(&end_of_generation, &["<|return|>", "<|flush|>"])
    {
        retype(
            &mut end_of_generation,
            &mut attrs,
            tokens,
            "<|end|>",
            attr::USER_DEFINED,
        );
    }
    // Gemma 4 (and PLaMo 2): "</s>" is an ordinary token there.
    if has(&end_of_generation, &["<|tool_response>", "<|plamo:eos|>"]) {
        retype(
            &mut end_of_generation,
            &mut attrs,
            tokens,
            "</s>",
            attr::NORMAL,
        );
    }
    LlamaCppAttributes {
        attrs,
        end_of_generation,
    }
}

fn text(tokens: &[String], id: u32) -> &str {
    tokens.get(id as usize).map_or("", String::as_str)
}

/// Takes the end-of-generation token spelled `token` out of the set and gives it `attributes`.
fn retype(
    end_of_generation: &mut BTreeSet<u32>,
    attrs: &mut [u32],
    tokens: &[String],
    token: &str,
    attributes: u32,
) {
    let found = end_of_generation
        .iter()
        .copied()
        .find(|&id| text(tokens, id) == token);
    if let Some(id) = found {
        end_of_generation.remove(&id);
        if let Some(slot) = attrs.get_mut(id as usize) {
            *slot = attributes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(texts: &[&str]) -> Vec<String> {
        texts.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn gemma4_markers_end_generation_and_closing_s_is_normal() {
        let vocab = tokens(&[
            "<pad>",
            "<eos>",
            "<bos>",
            "</s>",
            "<turn|>",
            "<|tool_response>",
        ]);
        let types = [3, 3, 3, 1, 3, 4];
        let named = NamedIds {
            eos: Some(1),
            ..NamedIds::default()
        };
        let attributes = llama_cpp_attributes(&vocab, &types, &named);
        assert_eq!(
            attributes.end_of_generation,
            BTreeSet::from([1, 4, 5]),
            "</s> is dropped again"
        );
        assert_eq!(attributes.attrs[3], attr::NORMAL);
        // A user-defined end-of-generation token becomes control too: matched and hidden.
        assert_eq!(attributes.attrs[5], attr::USER_DEFINED | attr::CONTROL);
        assert!(attributes.is_hidden_without_special(5));
        assert!(attributes.is_matched_whole(5));
        assert!(!attributes.is_matched_whole(3));
    }

    #[test]
    fn gpt_oss_end_closes_a_message_not_the_generation() {
        let vocab = tokens(&["<|end|>", "<|return|>", "<|call|>", "<|channel|>"]);
        let attributes = llama_cpp_attributes(&vocab, &[3, 3, 3, 3], &NamedIds::default());
        assert_eq!(attributes.end_of_generation, BTreeSet::from([1, 2]));
        assert_eq!(attributes.attrs[0], attr::USER_DEFINED);
        assert_eq!(attributes.attrs[3], attr::USER_DEFINED);
    }

    #[test]
    fn named_ids_win_over_texts_and_fill_in_the_middle_pads_end_generation() {
        let vocab = tokens(&["<end_of_turn>", "x", "<PAD>", "<fim_prefix>"]);
        let named = NamedIds {
            eot: Some(1),
            ..NamedIds::default()
        };
        let attributes = llama_cpp_attributes(&vocab, &[1, 1, 1, 1], &named);
        assert_eq!(attributes.end_of_generation, BTreeSet::from([0, 1, 2]));
        assert_eq!(
            attributes.attrs[1],
            attr::NORMAL,
            "a named id keeps its type"
        );
        assert_eq!(attributes.attrs[2], attr::NORMAL | attr::CONTROL);
        assert_eq!(attributes.attrs[3], attr::NORMAL | attr::CONTROL);
    }
}
