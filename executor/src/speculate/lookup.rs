//! Prompt lookup: drafts read off the context itself. The last few tokens of the context
//! (prompt and generated text) are looked up earlier in it; the tokens that followed their
//! latest earlier occurrence are the draft. Longer matches are tried first: they predict the
//! continuation better. Text that copies its input (a summary quoting a passage, code being
//! edited, a list repeated) is drafted well; other text gets no draft and decodes as plainly.

/// Longest n-gram looked up.
const NGRAM_MAX: usize = 4;
/// Shortest n-gram looked up: a single token matches too often to predict anything.
const NGRAM_MIN: usize = 2;

/// Up to `k` tokens that followed the latest earlier occurrence of the longest suffix of
/// `context` (of `NGRAM_MAX` down to `NGRAM_MIN` tokens) that occurred before; empty when
/// none did.
pub fn lookup(context: &[u32], k: usize) -> Vec<u32> {
    let len = context.len();
    for n in (NGRAM_MIN..=NGRAM_MAX.min(len.saturating_sub(1))).rev() {
        let suffix = &context[len - n..];
        // the latest start before the suffix's own, so at least one token follows the match
        let found = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix);
        if let Some(i) = found {
            let from = i + n;
            return context[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::lookup;

    #[test]
    fn the_longest_suffix_seen_before_drafts_what_followed_it_latest() {
        // "7 8" occurred twice before; the latest occurrence is followed by 9 1
        let context = [7, 8, 3, 4, 7, 8, 9, 1, 5, 7, 8];
        assert_eq!(lookup(&context, 2), [9, 1]);
        assert_eq!(lookup(&context, 10), [9, 1, 5, 7, 8]);
        // a longer match wins over a later shorter one: "1 2 3" before "2 3"
        let context = [1, 2, 3, 40, 9, 2, 3, 50, 1, 2, 3];
        assert_eq!(lookup(&context, 1), [40]);
    }

    #[test]
    fn no_match_no_draft() {
        assert!(lookup(&[1, 2, 3, 4], 3).is_empty());
        assert!(lookup(&[5], 3).is_empty());
        assert!(lookup(&[], 3).is_empty());
        // a single repeated token is not looked up
        assert!(lookup(&[9, 1, 9], 3).is_empty());
    }
}
