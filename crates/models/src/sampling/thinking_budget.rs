//! The thinking budget (vLLM's `thinking_token_budget`, Anthropic's `thinking.budget_tokens`):
//! a logits processor that counts the tokens a request generates inside its reasoning section
//! and, once the budget is spent, forces the reasoning end marker token by token, so the model
//! goes on to its answer.
//!
//! The markers are token sequences (the reasoning parser's start and end strings, tokenized by
//! the server). Where the prompt leaves the model inside a reasoning section (a template that
//! opens `<think>` itself) counting starts with the first generated token. Tokens of the
//! prompt never count, and the budget covers every reasoning section of the output together.

use super::processors::{History, LogitsProcessor};
use crate::error::Result;

/// A request's thinking budget and the markers that delimit its reasoning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingBudget {
    /// Most tokens the output may spend inside reasoning sections (0: close at once).
    pub budget: u32,
    /// The reasoning start marker (`<think>`), as tokens; not empty.
    pub start_token_ids: Vec<u32>,
    /// The reasoning end marker (`</think>`), as tokens, forced when the budget is spent; not
    /// empty.
    pub end_token_ids: Vec<u32>,
    /// Output is reasoning until the end marker even without a start marker (DeepSeek-R1's
    /// template opens `<think>` in the prompt; vLLM's `deepseek_r1` parser reads it so).
    pub reasoning_without_start: bool,
}

/// Progress through one marker's token sequence.
#[derive(Debug, Clone)]
struct Matcher {
    tokens: Vec<u32>,
    matched: usize,
}

impl Matcher {
    fn new(tokens: &[u32]) -> Matcher {
        Matcher {
            tokens: tokens.to_vec(),
            matched: 0,
        }
    }

    /// Feeds one token; true when it completes the marker (progress then starts over).
    fn advance(&mut self, token: u32) -> bool {
        if self.tokens.get(self.matched) == Some(&token) {
            self.matched += 1;
        } else {
            self.matched = usize::from(self.tokens.first() == Some(&token));
        }
        if self.matched > 0 && self.matched == self.tokens.len() {
            self.matched = 0;
            return true;
        }
        false
    }

    fn reset(&mut self) {
        self.matched = 0;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Outside reasoning: watching for the start marker.
    Answering,
    /// Inside a reasoning section, counting.
    Thinking,
    /// The budget is spent: the end marker's token at this index is the only one allowed.
    Closing(usize),
}

/// The processor [`ThinkingBudget`] builds into a request's chain.
#[derive(Debug)]
pub(crate) struct ThinkingBudgetProcessor {
    budget: u32,
    spent: u32,
    start: Matcher,
    end: Matcher,
    phase: Phase,
}

impl ThinkingBudgetProcessor {
    /// The processor for `budget`, with the prompt read to know whether the output starts
    /// inside a reasoning section.
    pub(crate) fn new(budget: &ThinkingBudget, prompt: &[u32]) -> ThinkingBudgetProcessor {
        let mut processor = ThinkingBudgetProcessor {
            budget: budget.budget,
            spent: 0,
            start: Matcher::new(&budget.start_token_ids),
            end: Matcher::new(&budget.end_token_ids),
            phase: if budget.reasoning_without_start {
                Phase::Thinking
            } else {
                Phase::Answering
            },
        };
        for &token in prompt {
            processor.follow_markers(token);
        }
        processor.end.reset();
        processor.start.reset();
        processor
    }

    /// Moves between answering and thinking on a completed marker; true when `token` counts
    /// as a thinking token (an end marker's tokens count until the marker completes, and
    /// are given back then).
    fn follow_markers(&mut self, token: u32) -> bool {
        match self.phase {
            Phase::Answering => {
                if self.start.advance(token) {
                    self.phase = Phase::Thinking;
                    self.end.reset();
                }
                false
            }
            Phase::Thinking => {
                if self.end.advance(token) {
                    // The marker's earlier tokens were counted while it was incomplete.
                    let counted = self.end.tokens.len().saturating_sub(1);
                    self.spent = self
                        .spent
                        .saturating_sub(u32::try_from(counted).unwrap_or(u32::MAX));
                    self.phase = Phase::Answering;
                    self.start.reset();
                    false
                } else {
                    true
                }
            }
            Phase::Closing(_) => false,
        }
    }
}

impl LogitsProcessor for ThinkingBudgetProcessor {
    fn apply(&mut self, logits: &mut [f32], _: &History<'_>) -> Result<()> {
        if self.phase == Phase::Thinking && self.spent >= self.budget {
            // Tokens of the end marker already generated are kept: close from there.
            self.phase = Phase::Closing(self.end.matched);
        }
        if let Phase::Closing(index) = self.phase {
            if let Some(&forced) = self.end.tokens.get(index) {
                let kept = logits.get(forced as usize).copied();
                logits.fill(f32::NEG_INFINITY);
                if let (Some(logit), Some(value)) = (logits.get_mut(forced as usize), kept) {
                    *logit = if value.is_finite() { value } else { 0.0 };
                }
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        if let Phase::Closing(index) = self.phase {
            if self.end.tokens.get(index) == Some(&token) {
                if index + 1 >= self.end.tokens.len() {
                    self.phase = Phase::Answering;
                    self.end.reset();
                    self.start.reset();
                } else {
                    self.phase = Phase::Closing(index + 1);
                    self.end.matched = index + 1;
                }
            }
            return Ok(());
        }
        if self.follow_markers(token) {
            self.spent = self.spent.saturating_add(1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: u32 = 10;
    const END_A: u32 = 11;
    const END_B: u32 = 12;
    const VOCAB: usize = 16;

    fn budget(budget: u32, reasoning_without_start: bool) -> ThinkingBudget {
        ThinkingBudget {
            budget,
            start_token_ids: vec![START],
            end_token_ids: vec![END_A, END_B],
            reasoning_without_start,
        }
    }

    /// Runs the processor greedily over a model that always prefers `preferred(step)`:
    /// returns the tokens picked.
    fn run(
        processor: &mut ThinkingBudgetProcessor,
        steps: usize,
        preferred: impl Fn(usize) -> u32,
    ) -> Vec<u32> {
        let mut output = Vec::new();
        for step in 0..steps {
            let mut logits = vec![0.0f32; VOCAB];
            logits[preferred(step) as usize] = 5.0;
            processor
                .apply(
                    &mut logits,
                    &History {
                        prompt: &[],
                        output: &output,
                    },
                )
                .unwrap();
            let token = super::super::argmax(&logits).unwrap();
            processor.accept(token).unwrap();
            output.push(token);
        }
        output
    }

    #[test]
    fn the_end_marker_is_forced_after_the_budget_and_the_answer_is_free() {
        let mut processor = ThinkingBudgetProcessor::new(&budget(3, false), &[1, 2]);
        // The model opens a reasoning section and would think forever (token 5).
        let out = run(&mut processor, 9, |step| if step == 0 { START } else { 5 });
        assert_eq!(out, vec![START, 5, 5, 5, END_A, END_B, 5, 5, 5]);
    }

    #[test]
    fn a_prompt_that_opens_reasoning_counts_from_the_first_output_token() {
        let mut processor = ThinkingBudgetProcessor::new(&budget(2, false), &[1, START]);
        assert_eq!(run(&mut processor, 5, |_| 5), vec![5, 5, END_A, END_B, 5]);
        // A prompt whose reasoning section was closed leaves the output free.
        let mut closed = ThinkingBudgetProcessor::new(&budget(2, false), &[START, 3, END_A, END_B]);
        assert_eq!(run(&mut closed, 4, |_| 5), vec![5; 4]);
        // deepseek_r1: reasoning until the end marker even without a start.
        let mut r1 = ThinkingBudgetProcessor::new(&budget(1, true), &[1]);
        assert_eq!(run(&mut r1, 4, |_| 5), vec![5, END_A, END_B, 5]);
    }

    #[test]
    fn thinking_that_ends_in_budget_is_untouched_and_sections_share_the_budget() {
        let mut processor = ThinkingBudgetProcessor::new(&budget(3, false), &[]);
        let script = [START, 5, END_A, END_B, 6, START, 5, 5, 5, 5];
        let out = run(&mut processor, 12, |step| {
            script.get(step).copied().unwrap_or(6)
        });
        // 1 token in the first section, 2 more in the second, then the end is forced.
        assert_eq!(
            out,
            vec![START, 5, END_A, END_B, 6, START, 5, 5, END_A, END_B, 6, 6]
        );
    }

    #[test]
    fn a_half_generated_end_marker_is_completed_not_restarted() {
        let mut processor = ThinkingBudgetProcessor::new(&budget(2, false), &[START]);
        // The model emits 5, then the first end token (counted), then would wander.
        let script = [5, END_A];
        let out = run(&mut processor, 4, |step| {
            script.get(step).copied().unwrap_or(7)
        });
        assert_eq!(out, vec![5, END_A, END_B, 7]);
    }

    #[test]
    fn a_zero_budget_closes_at_once_even_where_every_logit_was_banned() {
        let mut processor = ThinkingBudgetProcessor::new(&budget(0, false), &[START]);
        let mut logits = vec![f32::NEG_INFINITY; VOCAB];
        processor.apply(&mut logits, &History::default()).unwrap();
        assert_eq!(logits[END_A as usize], 0.0);
        assert_eq!(logits.iter().filter(|l| l.is_finite()).count(), 1);
    }
}
