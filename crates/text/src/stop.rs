//! [`StopStringMatcher`]: finds stop strings in streamed text, across token boundaries.
//!
//! Text is released as soon as it can no longer be part of a stop string: only the longest
//! suffix that is a prefix of some stop string is held back. When a stop string completes, the
//! output ends right before it (or right after it with `include_stop_str_in_output`), as in
//! vLLM; the earliest match in the text wins.

/// A stop string that ended the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopMatch {
    /// Index into the stop strings the matcher was built with.
    pub index: usize,
    pub stop_string: String,
}

/// What one call to [`StopStringMatcher::push`] releases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStep {
    /// Text safe to send now.
    pub text: String,
    /// Set when a stop string matched: `text` is the final piece, the request is done.
    pub stopped: Option<StopMatch>,
}

/// Stop-string state for one sequence.
#[derive(Debug, Clone)]
pub struct StopStringMatcher {
    stop_strings: Vec<String>,
    include_stop_str_in_output: bool,
    held: String,
    stopped: bool,
}

impl StopStringMatcher {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stop_strings: Vec<String>, include_stop_str_in_output: bool) -> Self {
        let stop_strings = stop_strings.into_iter().filter(|s| !s.is_empty()).collect();
        StopStringMatcher {
            stop_strings,
            include_stop_str_in_output,
            held: String::new(),
            stopped: false,
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Text received but not yet released because a stop string might start in it.
    pub fn held_back(&self) -> &str {
        &self.held
    }

    /// Feeds newly decoded text. After a match everything further is discarded.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.stopped {
            return StopStep::default();
        }
        if self.stop_strings.is_empty() {
            return StopStep {
                text: text.to_string(),
                stopped: None,
            };
        }
        self.held.push_str(text);
        let earliest = self
            .stop_strings
            .iter()
            .enumerate()
            .filter_map(|(index, stop)| {
                self.held
                    .find(stop.as_str())
                    .map(|position| (position, index))
            })
            .min();
        if let Some((position, index)) = earliest {
            let stop_string = self.stop_strings[index].clone();
            let end = if self.include_stop_str_in_output {
                position + stop_string.len()
            } else {
                position
            };
            let released = self.held[..end].to_string();
            self.held.clear();
            self.stopped = true;
            return StopStep {
                text: released,
                stopped: Some(StopMatch { index, stop_string }),
            };
        }
        let hold = self
            .stop_strings
            .iter()
            .map(|stop| partial_match_len(&self.held, stop))
            .max()
            .unwrap_or(0);
        let release_to = self.held.len() - hold;
        let released = self.held[..release_to].to_string();
        self.held.drain(..release_to);
        StopStep {
            text: released,
            stopped: None,
        }
    }

    /// Releases the held-back text when the sequence ends for another reason (EOS, length).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
fn partial_match_len(text: &str, stop: &str) -> usize {
    let longest = text.len().min(stop.len().saturating_sub(1));
    (1..=longest)
        .rev()
        .find(|&length| stop.is_char_boundary(length) && text.ends_with(&stop[..length]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        stops: &[&str],
        include: bool,
        pieces: &[&str],
    ) -> (Vec<String>, Option<StopMatch>, String) {
        let mut matcher =
            StopStringMatcher::new(stops.iter().map(|s| s.to_string()).collect(), include);
        let mut released = Vec::new();
        for piece in pieces {
            let step = matcher.push(piece);
            released.push(step.text);
            if step.stopped.is_some() {
                return (released, step.stopped, String::new());
            }
        }
        let tail = matcher.finish();
        (released, None, tail)
    }

    #[test]
    fn stop_split_across_pieces_is_held_then_cut() {
        let (released, stopped, _) = run(&["STOP"], false, &["hello ST", "O", "P and more"]);
        assert_eq!(released, vec!["hello ", "", ""]);
        assert_eq!(
            stopped,
            Some(StopMatch {
                index: 0,
                stop_string: "STOP".into()
            })
        );
    }

    #[test]
    fn include_stop_str_keeps_it_and_drops_the_rest() {
        let (released, stopped, _) = run(&["</end>"], true, &["a</e", "nd>tail"]);
        assert_eq!(released.concat(), "a</end>");
        assert!(stopped.is_some());
    }

    #[test]
    fn false_start_is_released_once_it_cannot_match() {
        let (released, stopped, tail) = run(&["STOP"], false, &["ST", "ART", "!"]);
        assert_eq!(released, vec!["", "START", "!"]);
        assert_eq!((stopped, tail.as_str()), (None, ""));
    }

    #[test]
    fn held_text_is_flushed_at_the_end() {
        let (released, stopped, tail) = run(&["\n\n"], false, &["line\n"]);
        assert_eq!(
            (released.concat().as_str(), stopped, tail.as_str()),
            ("line", None, "\n")
        );
    }

    #[test]
    fn earliest_match_wins_among_several_stops() {
        let (released, stopped, _) = run(&["world", "lo"], false, &["hello world"]);
        assert_eq!(released.concat(), "hel");
        assert_eq!(stopped.map(|m| m.index), Some(1));
    }

    #[test]
    fn overlapping_prefix_is_found() {
        // "aab" contains "ab" starting inside the held "aa".
        let (released, stopped, _) = run(&["ab"], false, &["xa", "a", "b"]);
        assert_eq!(released.concat(), "xa");
        assert!(stopped.is_some());
    }

    #[test]
    fn multibyte_stop_strings_hold_on_char_boundaries() {
        let (released, stopped, _) = run(&["🦀 done"], false, &["ok 🦀", " do", "ne"]);
        assert_eq!(released.concat(), "ok ");
        assert!(stopped.is_some());
        assert_eq!(partial_match_len("xé", "éa"), 2);
    }

    #[test]
    fn no_stop_strings_passes_through() {
        let (released, stopped, tail) = run(&[], false, &["a", "b"]);
        assert_eq!(
            (released.concat().as_str(), stopped, tail.as_str()),
            ("ab", None, "")
        );
    }

    #[test]
    fn nothing_after_a_match() {
        let mut matcher = StopStringMatcher::new(vec!["x".into()], false);
        assert!(matcher.push("x").stopped.is_some());
        assert_eq!(matcher.push("more"), StopStep::default());
        assert_eq!(matcher.finish(), "");
    }
}
