//! tokenmill-text: everything between text and token ids.
//!
//! The engine works on token ids; users send and receive text. This crate is the bridge:
//! - [`Tokenizer`] encodes and decodes for one model, loaded from a Hugging Face
//!   `tokenizer.json` or built from a GGUF file's `tokenizer.ggml.*` metadata so that ids match
//!   llama.cpp's ([`GgufVocab`]: `tokenizers` pipelines, and for Gemma 4's `gemma4` model
//!   llama.cpp's own BPE, `spm_bpe.rs`). It knows BOS/EOS and the set of ids that end
//!   generation.
//! - [`ChatTemplate`] renders a conversation into a prompt with the model's Jinja template
//!   (minijinja, configured like Hugging Face's `apply_chat_template`).
//! - [`IncrementalDetokenizer`] turns a stream of generated ids into text pieces that never split
//!   a UTF-8 character, and [`StopStringMatcher`] holds text back while it could still be the
//!   start of a stop string.
//! - [`tool_parsers`] (vLLM's `--tool-call-parser` formats) and the reasoning parsers
//!   ([`reasoning_parser`]) split generated text into content, tool calls and reasoning, each
//!   as one incremental machine whose complete parse is the same machine fed everything;
//!   gpt-oss's harmony channels are read by one scanner behind two of them ([`harmony`]).
//!
//! Usage, per request (the server renders and encodes; the engine's output processor streams):
//! ```no_run
//! # fn main() -> tokenmill_text::Result<()> {
//! use std::sync::Arc;
//! use tokenmill_text::*;
//! let file = tokenmill_gguf::GgufFile::open(std::path::Path::new("model.gguf"))?;
//! let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
//! let template = ChatTemplate::for_tokenizer(&tokenizer)?; // model's template, else ChatML
//! let mut options = RenderOptions::for_tokenizer(&tokenizer);
//! options.add_generation_prompt = true;
//! let prompt = template.render_messages(&[ChatMessage::new("user", "Hi!")], &options)?;
//! let prompt_ids = tokenizer.encode(&prompt, true)?;
//!
//! let mut detokenizer =
//!     IncrementalDetokenizer::new(Arc::clone(&tokenizer), &prompt_ids, DecodeOptions::default());
//! let mut stop = StopStringMatcher::new(vec!["\n\n".into()], false);
//! # let sampled: Vec<u32> = Vec::new();
//! for id in sampled {
//!     if tokenizer.is_eos(id) { break; }
//!     let step = stop.push(&detokenizer.push(id)?);
//!     print!("{}", step.text);
//!     if step.stopped.is_some() { return Ok(()); }
//! }
//! // Finished by EOS or length: release what was held back.
//! print!("{}{}", stop.push(&detokenizer.finish()?).text, stop.finish());
//! # Ok(()) }
//! ```

mod chat_template;
mod detokenizer;
mod error;
mod gguf_vocab;
pub mod harmony;
mod llama_attributes;
mod pretokenize;
mod reasoning;
mod spm_bpe;
mod stop;
mod template_functions;
mod tokenizer;
pub mod tool_parsers;

pub use chat_template::{ChatMessage, ChatTemplate, ContentFormat, RenderOptions, CHATML_TEMPLATE};
pub use detokenizer::IncrementalDetokenizer;
pub use error::{Result, TextError};
pub use gguf_vocab::{token_type, GgufVocab};
pub use pretokenize::PreTokenizerSpec;
pub use reasoning::{
    reasoning_markers, reasoning_parser, ReasoningDelta, ReasoningMarkers, ReasoningParser,
    REASONING_PARSER_NAMES,
};
pub use stop::{StopMatch, StopStep, StopStringMatcher};
pub use template_functions::strftime;
pub use tokenizer::{DecodeOptions, HfTokenizerFiles, Tokenizer};
