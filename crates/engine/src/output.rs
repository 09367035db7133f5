//! Per-request output processing: incremental detokenization and stop strings.

use std::sync::Arc;

use tokenmill_text::{DecodeOptions, IncrementalDetokenizer, StopStringMatcher, Tokenizer};

use crate::EngineError;

/// Turns one request's token stream into text deltas, holding back text while a stop string
/// may still match, and reports the stop string that ended it.
#[derive(Debug)]
pub struct OutputProcessor {
    detokenizer: IncrementalDetokenizer,
    stop: StopStringMatcher,
}

/// What one new token produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProcessedToken {
    /// Text safe to emit now.
    pub text: String,
    /// The stop string that matched; the request must finish now.
    pub stopped_by: Option<String>,
}

impl OutputProcessor {
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        prompt_token_ids: &[u32],
        decode: DecodeOptions,
        stop_strings: Vec<String>,
        include_stop_str_in_output: bool,
    ) -> OutputProcessor {
        OutputProcessor {
            detokenizer: IncrementalDetokenizer::new(tokenizer, prompt_token_ids, decode),
            stop: StopStringMatcher::new(stop_strings, include_stop_str_in_output),
        }
    }

    /// Feeds one generated token.
    pub fn push_token(&mut self, token_id: u32) -> Result<ProcessedToken, EngineError> {
        let piece = self.detokenizer.push(token_id)?;
        let step = self.stop.push(&piece);
        Ok(ProcessedToken {
            text: step.text,
            stopped_by: step.stopped.map(|m| m.stop_string),
        })
    }

    /// The request ended for another reason: release text held back for a possible stop
    /// string or an incomplete character.
    pub fn finish(&mut self) -> Result<String, EngineError> {
        let rest = self.detokenizer.finish()?;
        let mut text = self.stop.push(&rest).text;
        text.push_str(&self.stop.finish());
        Ok(text)
    }
}
