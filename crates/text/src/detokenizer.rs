//! [`IncrementalDetokenizer`]: generated token ids → text pieces, one id at a time.
//!
//! Decoding ids one by one and concatenating is wrong twice over: a character may span several
//! byte-level or `<0xXX>` byte-fallback tokens (each alone decodes to U+FFFD), and decoders
//! that strip or insert spaces depend on neighbouring tokens. So, as vLLM does, we keep two
//! offsets into the ids: text up to `read_offset` has been emitted; each step decodes the window
//! `prefix_offset..` and `prefix_offset..read_offset` and emits what the new token added, unless
//! the result ends in U+FFFD (an incomplete character), in which case the token is held until
//! a later one completes it. The window starts a few tokens back so context-dependent spacing
//! comes out as it does in a full decode.

use std::sync::Arc;

use crate::error::Result;
use crate::tokenizer::{DecodeOptions, Tokenizer};

/// How many prompt tokens seed the decode window (vLLM's
/// `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// Streaming decoder for one sequence.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    options: DecodeOptions,
    /// The ids from `prefix_offset` on; older ids are dropped as the window slides.
    window: Vec<u32>,
    /// Index into `window` up to which text has been emitted (ids before it are context).
    read_offset: usize,
}

impl IncrementalDetokenizer {
    /// Starts a stream after `prompt_ids` (their last few ids give decoding context; none is
    /// emitted). Pass `&[]` to decode a sequence from its beginning.
    pub fn new(tokenizer: Arc<Tokenizer>, prompt_ids: &[u32], options: DecodeOptions) -> Self {
        let context = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS)..];
        IncrementalDetokenizer {
            tokenizer,
            options,
            window: context.to_vec(),
            read_offset: context.len(),
        }
    }

    /// Feeds one generated id; returns the text it completes (often empty while a multi-byte
    /// character is still incomplete). The text never contains a broken UTF-8 sequence.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.window.push(id);
        let (emitted, complete) = self.pending_text()?;
        if !complete || emitted.is_empty() {
            return Ok(String::new());
        }
        // Slide: what was read becomes the context for the next step.
        self.window.drain(..self.read_offset);
        self.read_offset = self.window.len();
        Ok(emitted)
    }

    /// Text of the ids pushed but not yet emitted, with U+FFFD for a character left incomplete:
    /// call once when the sequence ends so the concatenated pieces equal a full decode.
    pub fn finish(&mut self) -> Result<String> {
        let (emitted, _) = self.pending_text()?;
        self.window.drain(..self.read_offset);
        self.read_offset = self.window.len();
        Ok(emitted)
    }

    /// Ids pushed whose text is being held back.
    pub fn pending_ids(&self) -> &[u32] {
        &self.window[self.read_offset..]
    }

    /// The text the unread ids add to the context, and whether it ends on a whole character.
    fn pending_text(&self) -> Result<(String, bool)> {
        let prefix_text = self
            .tokenizer
            .decode_with(&self.window[..self.read_offset], self.options)?;
        let full_text = self.tokenizer.decode_with(&self.window, self.options)?;
        let complete = !full_text.ends_with(char::REPLACEMENT_CHARACTER);
        // The context decodes to the same text inside the longer window; compare anyway so a
        // decoder that rewrites context never makes us slice inside a character.
        let mut common = prefix_text
            .bytes()
            .zip(full_text.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        while !full_text.is_char_boundary(common) {
            common -= 1;
        }
        Ok((full_text[common..].to_string(), complete))
    }
}
