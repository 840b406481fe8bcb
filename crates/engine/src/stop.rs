//! Stop strings over streamed text. Text that could still be the start of a stop string is held
//! back until the next piece settles it, so a stop string never reaches the output, not even in
//! part.

#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
}

/// What a piece of text did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopScan {
    /// No stop string (yet): this text is safe to emit.
    Continue(String),
    /// A stop string appeared: this is the text before it, and the stream is over.
    Stopped(String),
}

impl StopStrings {
    /// Empty strings are ignored (they would stop everything at once).
    pub fn new(stops: &[String]) -> StopStrings {
        StopStrings {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> StopScan {
        self.held.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let before = self.held[..at].to_string();
            self.held.clear();
            return StopScan::Stopped(before);
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let safe = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopScan::Continue(safe)
    }

    /// The held-back text, when the stream ends without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that begins some stop string.
    fn partial_suffix_len(&self) -> usize {
        let h = &self.held;
        // Suffixes start on character boundaries; try the longest first.
        h.char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&h[i..])))
            .map_or(0, |i| h.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returning what came out and whether a stop string ended it.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool, Vec<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopStrings::new(&stops);
        let mut out = String::new();
        let mut emitted = Vec::new();
        for p in pieces {
            match s.push(p) {
                StopScan::Continue(t) => {
                    out += &t;
                    emitted.push(t);
                }
                StopScan::Stopped(t) => {
                    out += &t;
                    emitted.push(t);
                    return (out, true, emitted);
                }
            }
        }
        out += &s.finish();
        (out, false, emitted)
    }

    #[test]
    fn a_stop_string_is_never_emitted_in_part() {
        // The stop string arrives split over three pieces; nothing of it is emitted at any step.
        let (out, stopped, emitted) = run(&["User:"], &["Hello", " Us", "er", ": more"]);
        assert_eq!((out.as_str(), stopped), ("Hello ", true));
        assert_eq!(emitted, ["Hello", " ", "", ""]);
        for (i, _) in emitted.iter().enumerate() {
            let so_far: String = emitted[..=i].concat();
            assert!(!so_far.contains("Us"), "{so_far:?}");
        }
    }

    #[test]
    fn a_false_start_is_released() {
        let (out, stopped, emitted) = run(&["User:"], &["a Us", "ually", " fine"]);
        assert_eq!((out.as_str(), stopped), ("a Usually fine", false));
        assert_eq!(emitted, ["a ", "Usually", " fine"]);
        // Held text comes out at the end of the stream.
        let (out, stopped, _) = run(&["User:"], &["end Use"]);
        assert_eq!((out.as_str(), stopped), ("end Use", false));
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let (out, stopped, _) = run(&["\n\n", "###", "END"], &["one END two ### three"]);
        assert_eq!((out.as_str(), stopped), ("one ", true));
        // Overlapping candidates: the one that starts first decides.
        let (out, _, _) = run(&["bc", "abcd"], &["xab", "cd"]);
        assert_eq!(out, "x");
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let (out, stopped, emitted) = run(&["😀!"], &["中文😀", "?", "é😀", "!tail"]);
        assert_eq!((out.as_str(), stopped), ("中文😀?é", true));
        assert_eq!(emitted, ["中文", "😀?", "é", ""]);
    }

    #[test]
    fn no_stop_strings_pass_everything() {
        let (out, stopped, emitted) = run(&["", ""], &["a", "b"]);
        assert_eq!((out.as_str(), stopped, emitted.len()), ("ab", false, 2));
    }
}
