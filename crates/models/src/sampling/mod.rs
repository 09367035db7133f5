//! Sampling: one request's logits row → its next token.
//!
//! - [`SamplingParams`] (`params.rs`): vLLM's settings and their checks.
//! - [`LogitsProcessor`] and the per-request [`LogitsChain`] (`processors.rs`): allowed
//!   tokens, bad words, the min-tokens ban, logit bias and penalties, plus the grammar slot;
//!   each gets `apply(logits, history)` before the pick and `accept(token)` after it.
//! - [`GrammarCompiler`] and [`GrammarMatcher`] (`grammar.rs`, GBNF translation in `gbnf.rs`):
//!   structured outputs on llguidance, the chain's grammar slot.
//! - [`ThinkingBudget`] (`thinking_budget.rs`): the reasoning-token budget, forcing the end
//!   marker once it is spent.
//! - [`Sampler`] (`sampler.rs`): raw logprobs, the chain, then greedy or random selection.
//! - [`token_logprobs`] (`logprobs.rs`): the log-softmax and top-k shared by sampled-token and
//!   prompt logprobs.

mod gbnf;
mod grammar;
mod logprobs;
mod params;
mod processors;
mod sampler;
mod schema_rewrite;
mod thinking_budget;

pub use grammar::{
    GrammarCompiler, GrammarMatcher, GrammarVocabulary, JsonGrammarOptions, StructuredOutput,
};
pub use logprobs::{log_sum_exp, token_logprobs};
pub use params::{SamplingParams, Unsatisfiable};
pub use processors::{History, LogitsChain, LogitsProcessor};
pub use sampler::{argmax, SampledToken, Sampler};
pub use thinking_budget::ThinkingBudget;
