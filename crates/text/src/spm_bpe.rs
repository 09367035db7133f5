//! [`SpmBpe`]: llama.cpp's BPE over raw UTF-8 with `▁` for spaces, the `gemma4` tokenizer model.
//!
//! Gemma 4 replaced Gemma 3's SentencePiece model with a BPE one that keeps SentencePiece's
//! conventions: spaces are written `▁`, there is no byte-level alphabet (tokens are UTF-8
//! text), and characters the merges do not cover fall back to `<0xXX>` byte tokens. llama.cpp
//! (`llama-vocab.cpp`, `LLAMA_VOCAB_PRE_TYPE_GEMMA4`) encodes it in five steps, which this
//! module follows exactly rather than approximating them with a `tokenizers` pipeline:
//!
//! 1. special tokens (control, user-defined, unknown; see [`crate::llama_attributes`]) are cut
//!    out of the text, the longest text first, every occurrence of one before the next;
//! 2. in each remaining piece every space (U+0020 only) becomes `▁`;
//! 3. the piece is split into runs of newlines and runs of everything else;
//! 4. a run made only of newlines that is itself a token is that token; every other run is
//!    split into characters, and adjacent symbols are merged by rank (the merge's line in
//!    `tokenizer.ggml.merges`; ties go to the leftmost pair) until no ranked pair is left.
//!    A merge applies to strings whether or not its result is a token;
//! 5. each final symbol is its token, or else one `<0xXX>` token per byte (bytes without
//!    such a token are dropped).
//!
//! Decoding needs nothing of its own (each token is its text with `▁` as a space, byte tokens
//! their byte, control tokens nothing unless special tokens are kept), so [`crate::Tokenizer`]
//! decodes with the `tokenizers` pipeline built beside this encoder and uses the encoder for
//! encoding only. That is llama.cpp's `llama_token_to_piece`, concatenated, which is what its
//! server sends; `llama_detokenize` would also drop the space before `.`, `,`, `!`, `?` and
//! some apostrophes (its `clean_spaces`, on for this vocabulary type), which does not
//! round-trip and is not done here. One difference is left: a token of GGUF type unused (5) or
//! undefined decodes to its text here and to nothing in llama.cpp (Gemma 4 has none).
//!
//! Cost: step 1 searches the text once per special token, and its fragments again for each
//! one it contains; step 4 is `O(n log n)` in a run's characters with a heap of candidate
//! pairs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// A merge of two adjacent symbols: its rank and the interned string it produces.
#[derive(Debug, Clone, Copy)]
struct Merge {
    rank: u32,
    merged: Option<u32>,
}

/// The encoder for one vocabulary; built once, shared by every request.
#[derive(Debug, Clone)]
pub(crate) struct SpmBpe {
    /// Every string a symbol can be: tokens first (a piece id below `token_count` is that
    /// token's id), then merge halves that are not tokens.
    pieces: HashMap<String, u32>,
    token_count: u32,
    /// (left piece, right piece) → the merge.
    merges: HashMap<(u32, u32), Merge>,
    /// The `<0xXX>` token of each byte, where the vocabulary has it.
    byte_tokens: [Option<u32>; 256],
    /// Texts matched whole before BPE, longest first (ties by id), with their ids.
    specials: Vec<(String, u32)>,
}

/// A symbol of one run while merging: a byte range of the run, the piece it spells (`None`
/// once it spells a string no merge or token knows) and its live neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    piece: Option<u32>,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of `left` and `right`, valid while both still have the lengths they had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: usize,
    right: usize,
    left_len: usize,
    right_len: usize,
    merged: Option<u32>,
}

enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl SpmBpe {
    /// The encoder for `tokens` (unique, non-empty texts), `merges` ("left right", the rank
    /// being the line) and the ids llama.cpp matches whole in text (`special_ids`).
    pub(crate) fn new(tokens: &[String], merges: &[String], special_ids: &[u32]) -> SpmBpe {
        let mut pieces: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            pieces.insert(token.clone(), u32::try_from(id).unwrap_or(u32::MAX));
        }
        let token_count = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        let mut next_piece = token_count;
        let mut intern = |text: &str, pieces: &mut HashMap<String, u32>| -> u32 {
            if let Some(&id) = pieces.get(text) {
                return id;
            }
            let id = next_piece;
            next_piece = next_piece.saturating_add(1);
            pieces.insert(text.to_string(), id);
            id
        };
        let mut pairs: Vec<(u32, u32, u32)> = Vec::with_capacity(merges.len());
        for (rank, merge) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte; a line without one
            // becomes a pair of empty strings, which no symbol ever is.
            let Some(split) = merge
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1)
            else {
                continue;
            };
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            let left = intern(left, &mut pieces);
            let right = intern(right, &mut pieces);
            pairs.push((left, right, u32::try_from(rank).unwrap_or(u32::MAX)));
        }
        // Merged strings are looked up only now that every half is interned: a result that is
        // neither a token nor a half can never merge again.
        let mut texts: Vec<&str> = vec![""; pieces.len().max(next_piece as usize)];
        for (text, &id) in &pieces {
            if let Some(slot) = texts.get_mut(id as usize) {
                *slot = text;
            }
        }
        let mut merge_table = HashMap::with_capacity(pairs.len());
        for (left, right, rank) in pairs {
            let merged = format!("{}{}", texts[left as usize], texts[right as usize]);
            let merged = pieces.get(&merged).copied();
            // The first line of a pair gives its rank.
            merge_table
                .entry((left, right))
                .or_insert(Merge { rank, merged });
        }
        let mut byte_tokens = [None; 256];
        for (byte, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = pieces
                .get(&format!("<0x{byte:02X}>"))
                .copied()
                .filter(|&id| id < token_count);
        }
        let mut specials: Vec<(String, u32)> = special_ids
            .iter()
            .filter_map(|&id| Some((tokens.get(id as usize)?.clone(), id)))
            .filter(|(text, _)| !text.is_empty())
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        SpmBpe {
            pieces,
            token_count,
            merges: merge_table,
            byte_tokens,
            specials,
        }
    }

    /// The ids of `text`, special tokens written in it included (llama.cpp's
    /// `parse_special = true`); no BOS or EOS.
    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        for fragment in self.partition(text) {
            match fragment {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(piece) => {
                    let escaped = piece.replace(' ', "\u{2581}");
                    for run in newline_runs(&escaped) {
                        self.encode_run(run, &mut ids);
                    }
                }
            }
        }
        ids
    }

    /// Step 1: special tokens cut out, longest first, each everywhere before the next.
    fn partition<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(text));
        for (special, id) in &self.specials {
            // A fragment is part of the text: a special absent from the text is in none.
            if !text.contains(special.as_str()) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    next.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(special.as_str()) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Token(*id));
                    rest = &rest[at + special.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            fragments = next;
        }
        fragments
    }

    fn token(&self, text: &str) -> Option<u32> {
        self.pieces
            .get(text)
            .copied()
            .filter(|&id| id < self.token_count)
    }

    /// Steps 4 and 5 for one run of newlines or of other characters.
    fn encode_run(&self, run: &str, ids: &mut Vec<u32>) {
        if run.bytes().all(|b| b == b'\n') {
            if let Some(id) = self.token(run) {
                ids.push(id);
                return;
            }
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(run.len());
        for (start, c) in run.char_indices() {
            let index = symbols.len();
            let len = c.len_utf8();
            symbols.push(Symbol {
                start,
                len,
                piece: self.pieces.get(&run[start..start + len]).copied(),
                prev: index.checked_sub(1),
                next: (start + len < run.len()).then_some(index + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        for left in 1..symbols.len() {
            self.push_candidate(&symbols, left - 1, left, &mut queue);
        }
        while let Some(Reverse(candidate)) = queue.pop() {
            let (left, right) = (candidate.left, candidate.right);
            // Outdated: a symbol of the pair has grown or been merged away since.
            if symbols[left].len != candidate.left_len || symbols[right].len != candidate.right_len
            {
                continue;
            }
            let right_symbol = symbols[right];
            symbols[left].len += right_symbol.len;
            symbols[left].piece = candidate.merged;
            symbols[left].next = right_symbol.next;
            symbols[right].len = 0;
            if let Some(after) = right_symbol.next {
                symbols[after].prev = Some(left);
            }
            if let Some(before) = symbols[left].prev {
                self.push_candidate(&symbols, before, left, &mut queue);
            }
            if let Some(after) = symbols[left].next {
                self.push_candidate(&symbols, left, after, &mut queue);
            }
        }
        for symbol in symbols.iter().filter(|symbol| symbol.len > 0) {
            match symbol.piece.filter(|&piece| piece < self.token_count) {
                Some(id) => ids.push(id),
                None => {
                    let bytes = &run.as_bytes()[symbol.start..symbol.start + symbol.len];
                    ids.extend(bytes.iter().filter_map(|&b| self.byte_tokens[b as usize]));
                }
            }
        }
    }

    fn push_candidate(
        &self,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Reverse<Candidate>>,
    ) {
        let (Some(left_piece), Some(right_piece)) = (symbols[left].piece, symbols[right].piece)
        else {
            return;
        };
        if let Some(merge) = self.merges.get(&(left_piece, right_piece)) {
            queue.push(Reverse(Candidate {
                rank: merge.rank,
                left,
                right,
                left_len: symbols[left].len,
                right_len: symbols[right].len,
                merged: merge.merged,
            }));
        }
    }
}

/// Step 3: maximal runs of `\n` and of everything else, in order.
fn newline_runs(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let newline = bytes[start] == b'\n';
        let len = bytes[start..]
            .iter()
            .position(|&b| (b == b'\n') != newline)
            .unwrap_or(bytes.len() - start);
        let run = &text[start..start + len];
        start += len;
        Some(run)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(texts: &[&str]) -> Vec<String> {
        texts.iter().map(|t| t.to_string()).collect()
    }

    /// ids: 0 <bos>, 1 <|turn>, 2 <|turn>x, 3.. pieces, then the byte tokens.
    fn build(merges: &[&str]) -> (SpmBpe, Vec<String>) {
        let mut tokens = strings(&[
            "<bos>", "<|turn>", "<|turn>x", "a", "b", "c", "ab", "bc", "abc", "▁", "▁a", "\n",
            "\n\n", "\n\n\n\n",
        ]);
        for byte in 0..=255u8 {
            tokens.push(format!("<0x{byte:02X}>"));
        }
        let encoder = SpmBpe::new(&tokens, &strings(merges), &[1, 2]);
        (encoder, tokens)
    }

    fn pieces(encoder: &SpmBpe, tokens: &[String], text: &str) -> Vec<String> {
        encoder
            .encode(text)
            .into_iter()
            .map(|id| tokens[id as usize].clone())
            .collect()
    }

    #[test]
    fn merges_by_rank_and_escapes_spaces() {
        let (encoder, tokens) = build(&["a b", "ab c", "▁ a", "\n \n"]);
        assert_eq!(pieces(&encoder, &tokens, "abc a"), ["abc", "▁a"]);
        // The lower rank goes first even when its pair is not the leftmost.
        let (encoder, tokens) = build(&["b c", "a b"]);
        assert_eq!(pieces(&encoder, &tokens, "abc"), ["a", "bc"]);
    }

    #[test]
    fn newline_runs_that_are_tokens_skip_the_merges() {
        let (encoder, tokens) = build(&["\n \n"]);
        // Four newlines are a token though no merge builds them; three are merged pairwise.
        assert_eq!(pieces(&encoder, &tokens, "\n\n\n\n"), ["\n\n\n\n"]);
        assert_eq!(
            pieces(&encoder, &tokens, "a\n\n\nb"),
            ["a", "\n\n", "\n", "b"]
        );
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes_and_merges_need_no_token() {
        let (encoder, tokens) = build(&["b d", "a bd"]);
        // "bd" is no token but merges on; "abd" is neither, so its bytes are emitted.
        assert_eq!(
            pieces(&encoder, &tokens, "abd"),
            ["<0x61>", "<0x62>", "<0x64>"]
        );
        assert_eq!(pieces(&encoder, &tokens, "é"), ["<0xC3>", "<0xA9>"]);
    }

    #[test]
    fn longer_special_tokens_are_cut_out_first() {
        let (encoder, tokens) = build(&["a b"]);
        assert_eq!(
            pieces(&encoder, &tokens, "ab<|turn>x<|turn>"),
            ["ab", "<|turn>x", "<|turn>"]
        );
        assert!(encoder.encode("").is_empty());
    }

    #[test]
    fn newline_runs_split_text() {
        let runs: Vec<&str> = newline_runs("a\n\nbc\n").collect();
        assert_eq!(runs, ["a", "\n\n", "bc", "\n"]);
        assert_eq!(newline_runs("").count(), 0);
    }
}
