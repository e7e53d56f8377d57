//! Turning one sequence's tokens into the text deltas a client sees:
//! incremental UTF-8 decoding and stop strings.
//!
//! Text that could still turn out to be the start of a stop string is held
//! back until it is clear either way, so a stop string is never partly sent.

use crate::tokenizer::StreamDecoder;

/// What happened when a token's bytes were added.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Text that is now safe to send (may be empty).
    Text(String),
    /// A stop string matched; the text before it that was not sent yet.
    Stopped(String),
}

/// The text state of one sequence.
#[derive(Debug, Default)]
pub struct OutputText {
    decoder: StreamDecoder,
    stops: Vec<String>,
    /// Decoded text not yet sent (possibly a stop string's beginning).
    held: String,
}

impl OutputText {
    /// A sequence that stops at any of `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Self::default()
        }
    }

    /// Adds one token's bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Pushed {
        let text = self.decoder.push(bytes);
        self.held.push_str(&text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let before = self.held[..at].to_string();
            self.held.clear();
            return Pushed::Stopped(before);
        }
        let keep = self.longest_stop_prefix_suffix();
        let send = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Pushed::Text(send)
    }

    /// Everything still held, at the end of the sequence.
    pub fn finish(&mut self) -> String {
        let mut rest = std::mem::take(&mut self.held);
        rest.push_str(&self.decoder.finish());
        rest
    }

    /// Length in bytes of the longest suffix of `held` that begins some stop
    /// string (always on a character boundary).
    fn longest_stop_prefix_suffix(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            for (i, _) in self.held.char_indices() {
                let suffix = &self.held[i..];
                if suffix.len() <= best {
                    break;
                }
                if stop.starts_with(suffix) {
                    best = suffix.len();
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(o: &mut OutputText, parts: &[&str]) -> (String, bool) {
        let mut sent = String::new();
        for p in parts {
            match o.push(p.as_bytes()) {
                Pushed::Text(t) => sent.push_str(&t),
                Pushed::Stopped(t) => {
                    sent.push_str(&t);
                    return (sent, true);
                }
            }
        }
        sent.push_str(&o.finish());
        (sent, false)
    }

    #[test]
    fn stop_string_split_across_tokens_is_never_sent() {
        let mut o = OutputText::new(vec!["END".into()]);
        assert_eq!(o.push(b"abc E"), Pushed::Text("abc ".into()));
        assert_eq!(o.push(b"N"), Pushed::Text(String::new()));
        assert_eq!(o.push(b"Dxyz"), Pushed::Stopped(String::new()));
    }

    #[test]
    fn held_prefix_is_released_when_it_stops_matching() {
        let mut o = OutputText::new(vec!["\n\n".into()]);
        assert_eq!(feed(&mut o, &["a\n", "b", "\n"]), ("a\nb\n".into(), false));
    }

    #[test]
    fn earliest_stop_wins() {
        let mut o = OutputText::new(vec!["world".into(), "lo".into()]);
        assert_eq!(feed(&mut o, &["hello world"]), ("hel".into(), true));
    }
}
