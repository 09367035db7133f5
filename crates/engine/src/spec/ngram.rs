//! The `ngram` proposer (vLLM's prompt lookup): find the latest earlier place where the
//! request's last tokens occurred in its own prompt and output, and draft what followed.

use super::Proposer;
use tokenmill_core::RequestId;

/// Prompt lookup with n-grams of `min..=max` tokens.
#[derive(Debug, Clone)]
pub struct NgramProposer {
    min: usize,
    max: usize,
}

impl NgramProposer {
    pub fn new(prompt_lookup_min: usize, prompt_lookup_max: usize) -> NgramProposer {
        NgramProposer {
            min: prompt_lookup_min.max(1),
            max: prompt_lookup_max.max(prompt_lookup_min).max(1),
        }
    }
}

impl Proposer for NgramProposer {
    /// One backward scan: at every earlier end position, the length of the common suffix with
    /// the sequence's end (capped at `max`); the longest wins, the latest among equals, and
    /// at least `min` tokens must match. The draft is what followed that occurrence, up to
    /// `max_drafts` tokens. Costs `O(len × max)`, no state.
    fn propose(
        &mut self,
        _request_id: RequestId,
        tokens: &[u32],
        _num_prompt_tokens: usize,
        max_drafts: usize,
        drafts: &mut Vec<u32>,
    ) {
        drafts.clear();
        let len = tokens.len();
        if max_drafts == 0 || len < self.min + 1 {
            return;
        }
        let mut best: Option<(usize, usize)> = None;
        // `end` is exclusive: tokens[..end] ends with the match, tokens[end] follows it.
        for end in (self.min..len).rev() {
            let limit = self.max.min(end);
            let matched = (0..limit)
                .take_while(|&j| tokens[end - 1 - j] == tokens[len - 1 - j])
                .count();
            if matched >= self.min && best.is_none_or(|(_, length)| matched > length) {
                best = Some((end, matched));
                if matched == self.max {
                    break;
                }
            }
        }
        if let Some((end, _)) = best {
            drafts.extend_from_slice(&tokens[end..len.min(end + max_drafts)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(proposer: &mut NgramProposer, tokens: &[u32], k: usize) -> Vec<u32> {
        let mut drafts = Vec::new();
        proposer.propose(RequestId(0), tokens, 0, k, &mut drafts);
        drafts
    }

    #[test]
    fn drafts_the_continuation_of_the_longest_latest_match() {
        let mut proposer = NgramProposer::new(1, 3);
        // "1 2 3" occurred at the start, followed by 4 5 6.
        assert_eq!(
            propose(&mut proposer, &[1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 2),
            vec![4, 5]
        );
        // Longer match wins over a later shorter one: [2, 3] matches at the end of
        // [..,2,3] (followed by 7) and [1,2,3] earlier (followed by 4).
        assert_eq!(
            propose(&mut proposer, &[1, 2, 3, 4, 8, 2, 3, 7, 1, 2, 3], 3),
            vec![4, 8, 2]
        );
        // Among equally long matches the latest is taken.
        assert_eq!(propose(&mut proposer, &[5, 1, 5, 2, 5], 1), vec![2]);
        // The draft stops at the end of the sequence.
        assert_eq!(propose(&mut proposer, &[7, 8, 7], 5), vec![8, 7]);
    }

    #[test]
    fn nothing_below_the_minimum_match() {
        let mut proposer = NgramProposer::new(2, 4);
        assert!(propose(&mut proposer, &[1, 2, 3, 9, 3], 3).is_empty());
        assert!(propose(&mut proposer, &[1], 3).is_empty());
        assert!(propose(&mut proposer, &[1, 2, 1, 2], 0).is_empty());
        assert_eq!(propose(&mut proposer, &[1, 2, 5, 1, 2], 3), vec![5, 1, 2]);
    }
}
