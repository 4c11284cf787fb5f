//! A decoding session on an engine: the tokens whose keys and values the caches hold, and the
//! host loop that feeds a prompt as prefill steps (chunks of as many tokens as the engine takes
//! at once; one token per step on an engine without prefill), lets generated tokens flow back
//! through the plan's sampler one decode step at a time, and keeps up to `in_flight` steps
//! enqueued ahead.
//!
//! The host sees one output per token row whichever way the prompt was cut: its logits (when
//! asked for), and the token the sequence continues with (the next prompt token, or the
//! sampled one from the prompt's last row on).

use std::collections::VecDeque;

use anyhow::{bail, Result};

use crate::engine::{Decoder, StepInput, StepOutput};
use crate::sample::Sampler;
use crate::speculate::{speculate, Drafts, Run, Tally};

/// What a step's callback tells the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep decoding.
    Continue,
    /// Stop after this step: its token is the last one generated.
    Stop,
}

/// How many tokens of `history` (what a cache holds) the next sequence `tokens` can reuse:
/// their longest common prefix, leaving at least one token of `tokens` to decode. On an
/// engine that cannot cut its state back (`Decoder::rewinds`), only the whole history, else
/// nothing.
pub fn common_prefix(history: &[u32], tokens: &[u32], rewinds: bool) -> usize {
    let common = history
        .iter()
        .zip(tokens)
        .take_while(|(a, b)| a == b)
        .count()
        .min(tokens.len().saturating_sub(1));
    if rewinds || common == history.len() {
        common
    } else {
        0
    }
}

/// An engine (of any backend) plus the token history its caches hold.
pub struct Session {
    engine: Box<dyn Decoder>,
    history: Vec<u32>,
    window: u64,
    chunk: usize,
    /// Positions the caches hold (the plan's `runtime.max_context`).
    max_context: usize,
    /// How `continue_with` generates by speculative decoding, when it does.
    speculation: Option<Speculation>,
}

/// Speculative decoding's settings and counts in a session.
struct Speculation {
    /// Most drafts per verify step (the plan's `speculative.tokens`).
    k: usize,
    drafts: Drafts,
    /// The host's sampler: it accepts or rejects each draft.
    sampler: Sampler,
    tally: Tally,
}

impl Session {
    /// A fresh session of `max_context` positions; at most `in_flight` steps are enqueued
    /// ahead of the host.
    pub fn new(engine: impl Decoder + 'static, in_flight: u32, max_context: u32) -> Session {
        let chunk = engine.prompt_mode().rows().max(1) as usize;
        Session {
            engine: Box::new(engine),
            history: Vec::new(),
            window: u64::from(in_flight.max(1)),
            chunk,
            max_context: max_context as usize,
            speculation: None,
        }
    }

    /// The session generating by speculative decoding in `continue_with`: verify steps of up
    /// to `k` tokens from `drafts`, picked by `sampler` (`crate::speculate`).
    pub fn speculating(self, k: usize, drafts: Drafts, sampler: Sampler) -> Session {
        let speculation = Some(Speculation {
            k,
            drafts,
            sampler,
            tally: Tally::default(),
        });
        Session {
            speculation,
            ..self
        }
    }

    /// What speculative decoding did so far; `None` in a plain session.
    pub fn tally(&self) -> Option<Tally> {
        self.speculation.as_ref().map(|s| s.tally)
    }

    /// Positions the caches hold: the history, a prompt and its generated tokens together.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Tokens at positions `0..len` of the caches.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Forgets the history: the next tokens start at position 0.
    pub fn reset(&mut self) {
        self.history.clear();
    }

    /// Feeds `tokens` after the history, reusing the longest cached prefix: for a chat whose
    /// whole conversation is re-rendered every turn, only the new part is decoded. Only the
    /// logits of generating rows are asked for. A speculating session (`speculating`)
    /// generates by speculative decoding, and `on_step` sees only the generated tokens.
    pub fn continue_with(
        &mut self,
        tokens: &[u32],
        max_new: usize,
        mut on_step: impl FnMut(&StepOutput, bool) -> Result<Flow>,
    ) -> Result<Vec<u32>> {
        let common = self.keep_prefix_of(tokens);
        let Some(s) = self.speculation.as_mut() else {
            let rest = &tokens[common..];
            return self.run(rest, max_new, rest.len().saturating_sub(1), on_step);
        };
        // speculative decoding: `on_step` sees the generated tokens only, with their logits
        let run = Run {
            context: tokens,
            cached: common,
            max_new,
            max_context: self.max_context,
            tokens: s.k,
            drafts: &s.drafts,
        };
        let mut pos = tokens.len() as u32;
        let spoken = speculate(&mut *self.engine, run, &mut s.sampler, |token, logits| {
            let out = StepOutput {
                step: 0,
                pos,
                token,
                logits: logits.to_vec(),
                argmax: Vec::new(),
            };
            pos += 1;
            on_step(&out, true)
        })?;
        s.tally.add(spoken.tally);
        // the caches hold the prompt and every generated token but the last, never embedded
        // (with nothing to generate, nothing was fed)
        if let Some((_, embedded)) = spoken.generated.split_last() {
            self.history = tokens.to_vec();
            self.history.extend_from_slice(embedded);
        }
        Ok(spoken.generated)
    }

    /// Truncates the history to its longest common prefix with `tokens`, leaving at least one
    /// token of `tokens` to decode; returns the prefix length.
    fn keep_prefix_of(&mut self, tokens: &[u32]) -> usize {
        let common = common_prefix(&self.history, tokens, self.engine.rewinds());
        self.history.truncate(common);
        common
    }

    /// Decodes `prompt` (after the history; prefill steps of up to the engine's chunk) and then
    /// generates up to `max_new` tokens, fewer where the context ends (the last generated
    /// token needs no position of its own). `on_step` sees one output per row and whether it
    /// generated a token (the prompt's last row and all later ones do); it may stop
    /// generation. Rows before prompt index `score_from` come without logits (an engine with
    /// prefill never computes them). Returns the generated tokens. With `max_new == 0` every
    /// prompt row is only scored. A prompt that does not fit after the history is refused
    /// before anything runs.
    pub fn run(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        score_from: usize,
        mut on_step: impl FnMut(&StepOutput, bool) -> Result<Flow>,
    ) -> Result<Vec<u32>> {
        if prompt.is_empty() {
            bail!("the prompt is empty; at least one token is needed");
        }
        let p = prompt.len();
        let base = self.history.len();
        if base + p > self.max_context {
            let input = if base > 0 {
                format!("{base} tokens already decoded and the prompt's {p}")
            } else {
                format!("the prompt's {p} tokens")
            };
            bail!(
                "{input} do not fit the plan's runtime.max_context of {} positions; compile the placement with a larger runtime.max_context (up to the model's context length)",
                self.max_context
            );
        }
        // rows to run: the prompt's, then one per generated token but the last, in the context
        let total = if max_new == 0 { p } else { p + max_new - 1 }.min(self.max_context - base);
        // the first row of a step whose logits are asked for: prompt rows from `score_from`
        let logits_from =
            |first: usize, rows: usize| score_from.saturating_sub(first).min(rows - 1);
        let mut next = 0usize;
        let mut pending: VecDeque<(usize, usize)> = VecDeque::new();
        let mut generated = Vec::new();
        let mut stopped = false;
        // Rows whose cache entries are valid for the next call: all that ran before a stop.
        let mut valid = 0usize;
        while !pending.is_empty() || (next < total && !stopped) {
            while !stopped && next < total && self.engine.in_flight() < self.window {
                let pos = (base + next) as u32;
                let (input, rows) = if next < p {
                    let rows = self.chunk.min(p - next);
                    let from = logits_from(next, rows) as u32;
                    (
                        StepInput::prompt(pos, &prompt[next..next + rows], from),
                        rows,
                    )
                } else {
                    (StepInput::sampled(pos), 1)
                };
                self.engine.submit(input)?;
                pending.push_back((next, rows));
                next += rows;
            }
            let out = self.engine.next_output()?;
            let (first, rows) = pending
                .pop_front()
                .expect("invariant: an output answers a submitted step");
            if stopped {
                continue;
            }
            let from = if first < p {
                logits_from(first, rows)
            } else {
                0
            };
            let vocab = out.logits.len() / (rows - from);
            for r in 0..rows {
                let i = first + r;
                valid = i + 1;
                let logits = if i >= score_from && r >= from && vocab > 0 {
                    out.logits[(r - from) * vocab..(r - from + 1) * vocab].to_vec()
                } else {
                    Vec::new()
                };
                let row = StepOutput {
                    step: out.step,
                    pos: out.pos + r as u32,
                    token: prompt.get(i + 1).copied().unwrap_or(out.token),
                    logits,
                    argmax: Vec::new(),
                };
                let generates = max_new > 0 && i + 1 >= p;
                if generates {
                    generated.push(out.token);
                }
                if on_step(&row, generates)? == Flow::Stop
                    || (generates && generated.len() == max_new)
                {
                    stopped = true;
                    break;
                }
            }
        }
        // An engine that cannot cut its state back (a KDA layer's) took in every row that ran,
        // also those of steps still in flight at a stop: no history describes that state, so
        // the next call starts over from position 0.
        if next > valid && !self.engine.rewinds() {
            self.history.clear();
            return Ok(generated);
        }
        // The cache holds the prompt and every generated token that was embedded before the
        // stop; the last generated token was sampled but never embedded.
        self.history.extend_from_slice(&prompt[..valid.min(p)]);
        if valid > p {
            self.history.extend_from_slice(&generated[..valid - p]);
        }
        Ok(generated)
    }
}
