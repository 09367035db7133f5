//! The `suffix` proposer (vLLM's suffix decoding, after Arctic Inference): count tries of
//! every substring of up to `max_tree_depth` tokens, one per running request over its prompt
//! and output, and one over the outputs of the last `max_cached_requests` finished requests.
//! Every suffix of the request's tokens that a trie holds proposes a draft: the most frequent
//! continuation, followed while the product of the continuation frequencies stays at or above
//! `min_token_prob`, for at most `⌈max_spec_factor × match length⌉` tokens (a long match earns
//! a long draft, a short one a short draft). The draft with the highest score (the sum of its
//! tokens' running probabilities) is proposed, as Arctic Inference's `speculate` does: the
//! depth bound makes the longest match a poor choice when it leaves no room to continue.

use std::collections::{HashMap, VecDeque};

use tokenmill_core::RequestId;

use super::config::{SpecMethod, SpeculativeConfig};
use super::Proposer;

/// One trie node: how often its path occurred, and its continuations.
#[derive(Debug, Clone, Default)]
struct Node {
    count: u32,
    /// `(token, node)`; most nodes have one child, so a short vector beats a map.
    children: Vec<(u32, u32)>,
}

/// Children past which a node also gets a token → child map ([`CountTrie::wide`]): a global
/// trie's root (and its shallow nodes) fan out to thousands of tokens, and every proposal looks
/// up one child of the root per suffix length it tries.
const WIDE_CHILDREN: usize = 16;

/// A trie of all substrings of up to `depth` tokens of the sequences added to it, with
/// occurrence counts, built incrementally: appending a token extends the `depth` suffixes
/// ending before it.
#[derive(Debug, Clone)]
struct CountTrie {
    depth: usize,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// For nodes with more than [`WIDE_CHILDREN`] children: token → child, the same pairs as
    /// their `children`.
    wide: HashMap<u32, HashMap<u32, u32>>,
}

/// The position of one sequence being appended to a trie: the nodes of its suffixes of
/// length `0..depth` (the root first).
#[derive(Debug, Clone, Default)]
struct Cursor {
    active: Vec<u32>,
}

const ROOT: u32 = 0;

impl CountTrie {
    fn new(depth: usize) -> CountTrie {
        CountTrie {
            depth,
            nodes: vec![Node::default()],
            free: Vec::new(),
            wide: HashMap::new(),
        }
    }

    fn child(&self, node: u32, token: u32) -> Option<u32> {
        let children = &self.nodes[node as usize].children;
        // Exactly the nodes with more than WIDE_CHILDREN children have a map: `child_or_insert`
        // makes it when the count passes the bound, `release` drops it when the count falls
        // back (and with a freed subtree). Narrow nodes skip the hash lookup.
        if children.len() > WIDE_CHILDREN {
            if let Some(map) = self.wide.get(&node) {
                return map.get(&token).copied();
            }
        }
        children
            .iter()
            .find(|(t, _)| *t == token)
            .map(|&(_, child)| child)
    }

    fn child_or_insert(&mut self, node: u32, token: u32) -> u32 {
        if let Some(child) = self.child(node, token) {
            return child;
        }
        let child = match self.free.pop() {
            Some(index) => {
                self.nodes[index as usize] = Node::default();
                index
            }
            None => {
                self.nodes.push(Node::default());
                (self.nodes.len() - 1) as u32
            }
        };
        let children = &mut self.nodes[node as usize].children;
        children.push((token, child));
        if let Some(map) = self.wide.get_mut(&node) {
            map.insert(token, child);
        } else if children.len() > WIDE_CHILDREN {
            self.wide.insert(node, children.iter().copied().collect());
        }
        child
    }

    /// Appends `token` to the sequence at `cursor`: every suffix ending there (plus the empty
    /// one) is extended by it and counted.
    fn push(&mut self, cursor: &mut Cursor, token: u32) {
        if cursor.active.is_empty() {
            cursor.active.push(ROOT);
        }
        let mut next = Vec::with_capacity(cursor.active.len() + 1);
        next.push(ROOT);
        for index in 0..cursor.active.len() {
            let child = self.child_or_insert(cursor.active[index], token);
            self.nodes[child as usize].count += 1;
            if next.len() < self.depth {
                next.push(child);
            }
        }
        cursor.active = next;
    }

    /// Removes one whole sequence added with `push` (counts down, drops emptied nodes).
    fn remove(&mut self, tokens: &[u32]) {
        for start in 0..tokens.len() {
            let end = tokens.len().min(start + self.depth);
            let mut node = ROOT;
            for &token in &tokens[start..end] {
                let Some(child) = self.child(node, token) else {
                    break;
                };
                let entry = &mut self.nodes[child as usize];
                entry.count = entry.count.saturating_sub(1);
                if entry.count == 0 {
                    self.release(node, token, child);
                    break;
                }
                node = child;
            }
        }
    }

    /// Unlinks `child` (reached from `parent` by `token`) and frees its subtree.
    fn release(&mut self, parent: u32, token: u32, child: u32) {
        self.nodes[parent as usize]
            .children
            .retain(|(t, _)| *t != token);
        if let Some(map) = self.wide.get_mut(&parent) {
            map.remove(&token);
            if map.len() <= WIDE_CHILDREN {
                self.wide.remove(&parent);
            }
        }
        let mut stack = vec![child];
        while let Some(node) = stack.pop() {
            stack.extend(self.nodes[node as usize].children.drain(..).map(|(_, c)| c));
            self.wide.remove(&node);
            self.free.push(node);
        }
    }

    /// The node of each suffix of `context` that the trie holds, shortest first, with its
    /// length: lengths 1, 2, ... up to `depth - 1` (so a continuation fits), stopping at the
    /// first suffix the trie lacks (every longer one contains it).
    fn matches<'a>(&'a self, context: &'a [u32]) -> impl Iterator<Item = (u32, usize)> + 'a {
        let longest = context.len().min(self.depth.saturating_sub(1));
        (1..=longest).map_while(move |length| {
            let mut node = ROOT;
            for &token in &context[context.len() - length..] {
                node = self.child(node, token)?;
            }
            Some((node, length))
        })
    }

    /// From `node`, the most frequent continuation (lowest token on ties) while the running
    /// probability stays at or above `min_prob`; returns the draft's score, the sum of its
    /// tokens' running probabilities (the expected number of them accepted, if the counts
    /// were the model's odds).
    fn follow(&self, mut node: u32, max: usize, min_prob: f64, drafts: &mut Vec<u32>) -> f64 {
        let mut probability = 1.0;
        let mut score = 0.0;
        while drafts.len() < max {
            let entry = &self.nodes[node as usize];
            let Some(&(token, child)) = entry.children.iter().max_by(|a, b| {
                let (ca, cb) = (
                    self.nodes[a.1 as usize].count,
                    self.nodes[b.1 as usize].count,
                );
                ca.cmp(&cb).then(b.0.cmp(&a.0))
            }) else {
                break;
            };
            let next = probability * f64::from(self.nodes[child as usize].count)
                / f64::from(entry.count.max(1));
            if next < min_prob {
                break;
            }
            probability = next;
            score += probability;
            drafts.push(token);
            node = child;
        }
        score
    }
}

/// A running request's own trie and how far it has been fed.
#[derive(Debug, Clone)]
struct Local {
    trie: CountTrie,
    cursor: Cursor,
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SuffixProposer {
    depth: usize,
    max_cached_requests: usize,
    max_spec_factor: f64,
    min_token_prob: f64,
    global: CountTrie,
    /// Outputs in the global trie, oldest first.
    cached: VecDeque<Vec<u32>>,
    local: HashMap<RequestId, Local>,
    candidate: Vec<u32>,
}

impl SuffixProposer {
    pub fn new(config: &SpeculativeConfig) -> SuffixProposer {
        let (depth, max_cached_requests, max_spec_factor, min_token_prob) = match config.method {
            SpecMethod::Suffix {
                max_tree_depth,
                max_cached_requests,
                max_spec_factor,
                min_token_prob,
            } => (
                max_tree_depth,
                max_cached_requests,
                max_spec_factor,
                min_token_prob,
            ),
            SpecMethod::Ngram { .. } | SpecMethod::DraftModel { .. } => (24, 10_000, 1.0, 0.1),
        };
        // A match of `depth - 1` tokens plus one continuation fits in the trie.
        let depth = depth + 1;
        SuffixProposer {
            depth,
            max_cached_requests,
            max_spec_factor,
            min_token_prob,
            global: CountTrie::new(depth),
            cached: VecDeque::new(),
            local: HashMap::new(),
            candidate: Vec::new(),
        }
    }
}

impl Proposer for SuffixProposer {
    fn propose(
        &mut self,
        request_id: RequestId,
        tokens: &[u32],
        num_prompt_tokens: usize,
        max_drafts: usize,
        drafts: &mut Vec<u32>,
    ) {
        drafts.clear();
        let depth = self.depth;
        let local = self.local.entry(request_id).or_insert_with(|| Local {
            trie: CountTrie::new(depth),
            cursor: Cursor::default(),
            tokens: Vec::new(),
            num_prompt_tokens,
        });
        // Feed what is new (requests only grow; a mismatch means a reused id: start over).
        if !tokens.starts_with(&local.tokens) {
            *local = Local {
                trie: CountTrie::new(depth),
                cursor: Cursor::default(),
                tokens: Vec::new(),
                num_prompt_tokens,
            };
        }
        for &token in &tokens[local.tokens.len()..] {
            local.trie.push(&mut local.cursor, token);
        }
        local
            .tokens
            .extend_from_slice(&tokens[local.tokens.len()..]);
        // Every suffix the tries hold proposes a draft of at most ⌈factor × its length⌉
        // tokens; the highest score wins (ties: the longer match, then the local trie). The
        // longest match alone is not enough: a trie keeps substrings of at most `depth`
        // tokens, so a match near that length leaves little room to continue, while a
        // shorter one can continue for many tokens. (The sequence's own end is in its trie
        // but has no continuation, so it never yields a draft.)
        let mut best: Option<(f64, usize)> = None;
        for trie in [&local.trie, &self.global] {
            for (node, length) in trie.matches(tokens) {
                let max = max_drafts.min((self.max_spec_factor * length as f64).ceil() as usize);
                self.candidate.clear();
                let score = trie.follow(node, max, self.min_token_prob, &mut self.candidate);
                if self.candidate.is_empty() {
                    continue;
                }
                let better = best.is_none_or(|(best_score, best_length)| {
                    score > best_score || (score == best_score && length > best_length)
                });
                if better {
                    best = Some((score, length));
                    drafts.clone_from(&self.candidate);
                }
            }
        }
    }

    fn finish(&mut self, request_id: RequestId) {
        let Some(local) = self.local.remove(&request_id) else {
            return;
        };
        if self.max_cached_requests == 0 {
            return;
        }
        let output = local.tokens[local.num_prompt_tokens.min(local.tokens.len())..].to_vec();
        let mut cursor = Cursor::default();
        for &token in &output {
            self.global.push(&mut cursor, token);
        }
        self.cached.push_back(output);
        while self.cached.len() > self.max_cached_requests {
            if let Some(old) = self.cached.pop_front() {
                self.global.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposer(depth: usize, cached: usize, factor: f64, min_prob: f64) -> SuffixProposer {
        SuffixProposer::new(&SpeculativeConfig {
            method: SpecMethod::Suffix {
                max_tree_depth: depth,
                max_cached_requests: cached,
                max_spec_factor: factor,
                min_token_prob: min_prob,
            },
            num_speculative_tokens: 8,
            disable_by_batch_size: 8,
        })
    }

    fn propose(p: &mut SuffixProposer, id: u64, tokens: &[u32], k: usize) -> Vec<u32> {
        let mut drafts = Vec::new();
        p.propose(RequestId(id), tokens, 2, k, &mut drafts);
        drafts
    }

    #[test]
    fn the_draft_grows_with_the_match_and_follows_the_frequent_continuation() {
        let mut p = proposer(8, 4, 1.0, 0.0);
        // "5 6" then 7 twice, then 9 once: the frequent continuation wins.
        let tokens = [5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 9, 3, 5, 6];
        assert_eq!(propose(&mut p, 0, &tokens, 8), vec![7, 1]);
        // A longer match earns a longer draft (factor 1: as long as the match).
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4];
        assert_eq!(propose(&mut p, 1, &tokens, 8), vec![5, 6, 7, 8]);
        assert_eq!(
            propose(&mut p, 1, &[1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4], 2),
            vec![5, 6]
        );
    }

    #[test]
    fn a_shorter_match_wins_when_the_longest_leaves_no_room_to_continue() {
        // Tries hold substrings of up to 7 tokens (depth 6 + 1). The whole suffix 1..=6
        // matches, but its node is six deep and can continue by one token only; the
        // three- and four-token suffixes continue by three (factor 1: at most their length),
        // and on that tie the longer match is taken.
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1, 2, 3, 4, 5, 6];
        let mut p = proposer(6, 4, 1.0, 0.0);
        assert_eq!(propose(&mut p, 0, &tokens, 8), vec![7, 8, 9]);
        // With factor 2 the two-token suffix could draft four, as many as the three-token one
        // can: the same draft.
        let mut p = proposer(6, 4, 2.0, 0.0);
        assert_eq!(propose(&mut p, 0, &tokens, 8), vec![7, 8, 9, 10]);
        // The number of draft tokens still caps it.
        assert_eq!(propose(&mut p, 0, &tokens, 2), vec![7, 8]);
    }

    #[test]
    fn wide_nodes_are_looked_up_and_evicted_like_narrow_ones() {
        // Request 0's output: 5 followed by 40 different tokens (and 5 once more by 7): the
        // root, and the node of 5, outgrow WIDE_CHILDREN and get maps.
        let mut output = Vec::new();
        for t in 100..140 {
            output.extend([5, t]);
        }
        output.extend([5, 7, 5, 7]);
        let mut p = proposer(4, 1, 4.0, 0.0);
        let mut tokens = vec![900, 901];
        tokens.extend(&output);
        propose(&mut p, 0, &tokens, 4);
        p.finish(RequestId(0));
        assert!(p.global.wide.contains_key(&ROOT));
        assert_eq!(p.global.wide.len(), 2, "the root and the node of 5");
        // After 5 the most frequent continuation is 7 (twice), then 5 7 again.
        assert_eq!(propose(&mut p, 1, &[300, 301, 5], 3), vec![7, 5, 7]);
        // After 5 123, the only continuation.
        assert_eq!(propose(&mut p, 2, &[302, 303, 5, 123], 2), vec![5, 124]);
        // A second finished request evicts the first: its wide nodes go with it.
        propose(&mut p, 3, &[400, 401, 20, 21], 4);
        p.finish(RequestId(3));
        assert!(p.global.wide.is_empty());
        assert_eq!(p.global.nodes.len() - p.global.free.len(), 4);
        assert!(propose(&mut p, 4, &[500, 501, 5], 3).is_empty());
    }

    #[test]
    fn min_token_prob_stops_an_uncertain_draft() {
        let mut p = proposer(8, 4, 4.0, 0.6);
        // After "4" (three times): 5 once, 6 once: nothing reaches 0.6.
        assert!(propose(&mut p, 0, &[4, 5, 4, 6, 4], 4).is_empty());
        // At 0.3 the first step (1/3) passes and the rest is certain.
        let mut p = proposer(8, 4, 4.0, 0.3);
        assert_eq!(propose(&mut p, 0, &[4, 5, 4, 6, 4], 4), vec![5, 4, 6, 4]);
    }

    #[test]
    fn finished_outputs_are_searched_and_evicted() {
        let mut p = proposer(8, 1, 2.0, 0.0);
        // Request 0: prompt [100, 101] (num_prompt_tokens 2), output 10 11 12 13.
        propose(&mut p, 0, &[100, 101, 10, 11, 12, 13], 4);
        p.finish(RequestId(0));
        assert_eq!(propose(&mut p, 1, &[200, 201, 10, 11], 4), vec![12, 13]);
        // The prompt was not cached.
        assert!(propose(&mut p, 2, &[300, 301, 100], 4).is_empty());
        // A second finished request evicts the first (one cached request).
        propose(&mut p, 3, &[400, 401, 20, 21], 4);
        p.finish(RequestId(3));
        assert!(propose(&mut p, 4, &[500, 501, 10, 11], 4).is_empty());
        assert_eq!(
            p.global.nodes.len() - p.global.free.len(),
            4,
            "root + 20, 21, 20 21"
        );
    }
}
