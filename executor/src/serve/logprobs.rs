//! OpenAI's `logprobs`: each generated token's log-probability under the model and the most
//! likely tokens with theirs. They are the log-softmax of the step's raw logits, before the
//! temperature, the penalties and the truncations (vLLM's default), so they say what the
//! model thought whatever the request's sampling; they decide no token.

use crate::sample::argmax;

/// Most `top_logprobs` (and completions' `logprobs`) a request may ask for, as OpenAI allows.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generated token's log-probability and the `top` most likely tokens' (best first).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The generated token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first, ties to the lower id.
    pub top: Vec<(u32, f32)>,
}

/// `token`'s log-probability under `logits` and the `top` most likely tokens'. The sum of the
/// exponentials runs in f64 in index order, so the figures repeat exactly.
pub fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = logits.get(argmax(logits) as usize).copied().unwrap_or(0.0);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_z = sum.ln();
    let logprob = |id: u32| (f64::from(logits[id as usize] - max) - log_z) as f32;
    // the `top` best by (logit descending, id ascending), kept sorted while scanning
    let mut best: Vec<u32> = Vec::with_capacity(top + 1);
    let better = |a: u32, b: u32| logits[a as usize].total_cmp(&logits[b as usize]).is_gt();
    for id in 0..logits.len() as u32 {
        if best.len() == top && best.last().is_none_or(|&last| !better(id, last)) {
            continue;
        }
        let at = best.partition_point(|&b| !better(id, b));
        best.insert(at, id);
        best.truncate(top);
    }
    TokenLogprob {
        token,
        logprob: logprob(token),
        top: best.into_iter().map(|id| (id, logprob(id))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_the_log_softmax_and_the_top_ones_come_best_first() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let t = token_logprob(&logits, 2, 3);
        assert!(
            (f64::from(t.logprob) - (2.0 - z.ln())).abs() < 1e-6,
            "{t:?}"
        );
        let ids: Vec<u32> = t.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 3, 2]);
        assert_eq!(t.top[0].1, t.top[1].1);
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
        assert_eq!(token_logprob(&logits, 0, 9).top.len(), 5);
        let total: f64 = (0..5)
            .map(|id| f64::from(token_logprob(&logits, id, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
    }
}
