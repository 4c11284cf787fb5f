//! Perplexity with llama.cpp's convention (`llama-perplexity`): the text is tokenized once,
//! cut into chunks of `n_ctx` tokens, each decoded from an empty cache (its first token
//! replaced by BOS when the tokenizer adds one); the logits of the second half of each chunk
//! score the next token, NLL in f64.

use anyhow::{bail, Result};

use crate::session::{Flow, Session};

/// Running totals of a perplexity run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Perplexity {
    /// Tokens scored.
    pub count: u64,
    nll: f64,
    nll2: f64,
}

impl Perplexity {
    /// Adds one scored token with the logits it was predicted from.
    pub fn add(&mut self, logits: &[f32], next: u32) {
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        let nll = sum.ln() - f64::from(logits[next as usize] - max);
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }

    /// exp(mean NLL).
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// llama.cpp's ±: ppl * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1)).
    pub fn uncertainty(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        if var > 0.0 && self.count > 1 {
            self.ppl() * (var / (n - 1.0)).sqrt()
        } else {
            0.0
        }
    }
}

/// Scores `tokens` in chunks of `n_ctx` (at most `max_chunks` of them), calling `on_chunk`
/// with the chunk index and the running totals after each.
pub fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    max_chunks: Option<usize>,
    mut on_chunk: impl FnMut(usize, &Perplexity),
) -> Result<Perplexity> {
    if n_ctx < 4 {
        bail!("--ctx must be at least 4, got {n_ctx}");
    }
    let available = tokens.len() / n_ctx;
    if tokens.len() < 4 {
        bail!(
            "the text has {} tokens; perplexity needs at least 4 (one chunk of --ctx 4 or more)",
            tokens.len()
        );
    }
    if available == 0 {
        bail!(
            "the text has {} tokens, fewer than one chunk of {n_ctx}; allowed: --ctx 4..={}",
            tokens.len(),
            tokens.len()
        );
    }
    let chunks = max_chunks.map_or(available, |m| m.min(available));
    let first = n_ctx / 2;
    let mut total = Perplexity::default();
    for c in 0..chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(bos) = bos {
            chunk[0] = bos;
        }
        session.reset();
        let mut i = 0usize;
        session.run(&chunk, 0, first, |out, _| {
            // A process without the readback rank has no logits; it only keeps in step.
            if i >= first && i + 1 < n_ctx && !out.logits.is_empty() {
                total.add(&out.logits, chunk[i + 1]);
            }
            i += 1;
            Ok(Flow::Continue)
        })?;
        on_chunk(c, &total);
    }
    Ok(total)
}
