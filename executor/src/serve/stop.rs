//! Stop strings: generated text is released as it comes, except a tail that may still grow
//! into one of the request's stop strings; the text ends just before the first stop string.

/// The text released so far and what is held back, for one sequence.
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What one piece of text gave.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text safe to send: it cannot be part of a stop string.
    pub text: String,
    /// Whether a stop string was reached (nothing after it is ever released).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings never match).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds generated text; releases what can no longer start a stop string.
    pub fn push(&mut self, text: &str) -> Released {
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.held.truncate(at);
            return Released {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        let keep = self.longest_partial();
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_owned();
        self.held.drain(..cut);
        Released {
            text,
            stopped: false,
        }
    }

    /// Everything still held, at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest tail of the held text that is a proper prefix of a stop string.
    fn longest_partial(&self) -> usize {
        let held = self.held.as_str();
        (1..=held.len())
            .rev()
            .filter(|&n| held.is_char_boundary(held.len() - n))
            .find(|&n| {
                let tail = &held[held.len() - n..];
                self.stops
                    .iter()
                    .any(|s| s.len() > n && s.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(text: &str, stopped: bool) -> Released {
        Released {
            text: text.to_owned(),
            stopped,
        }
    }

    #[test]
    fn text_before_a_stop_string_is_released_and_the_rest_dropped() {
        let mut m = StopMatcher::new(vec!["\n\n".into(), "END".into()]);
        assert_eq!(m.push("Paris is"), released("Paris is", false));
        assert_eq!(m.push(" big.\n"), released(" big.", false));
        assert_eq!(m.push("\nMore"), released("", true));
    }

    #[test]
    fn a_partial_match_that_fails_is_released() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("the E"), released("the ", false));
        assert_eq!(m.push("Nd"), released("ENd", false));
        assert_eq!(m.push("EN"), released("", false));
        assert_eq!(m.finish(), "EN");
    }

    #[test]
    fn a_stop_string_split_over_pieces_matches_and_multibyte_text_is_whole() {
        let mut m = StopMatcher::new(vec!["éE".into(), String::new()]);
        assert_eq!(m.push("aé"), released("a", false));
        assert_eq!(m.push("Ex"), released("", true));
        let mut none = StopMatcher::new(Vec::new());
        assert_eq!(none.push("é"), released("é", false));
    }
}
