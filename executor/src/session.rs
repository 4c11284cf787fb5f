//! A decoding session on an engine: the tokens whose keys and values the caches hold, and the
//! host loop that feeds prompt tokens one decode step at a time, lets generated tokens flow
//! back through the plan's sampler, and keeps up to `in_flight` steps enqueued ahead.

use anyhow::{bail, Result};

use crate::engine::{Decoder, StepInput, StepOutput};
use crate::sample::Sampler;

/// What a step's callback tells the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep decoding.
    Continue,
    /// Stop after this step: its token is the last one generated.
    Stop,
}

/// An engine (of any backend) plus the token history its caches hold.
pub struct Session {
    engine: Box<dyn Decoder>,
    history: Vec<u32>,
    window: u64,
}

impl Session {
    /// A fresh session; at most `in_flight` steps are enqueued ahead of the host.
    pub fn new(engine: impl Decoder + 'static, in_flight: u32) -> Session {
        Session {
            engine: Box::new(engine),
            history: Vec::new(),
            window: u64::from(in_flight.max(1)),
        }
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
    /// whole conversation is re-rendered every turn, only the new part is decoded.
    pub fn continue_with(
        &mut self,
        tokens: &[u32],
        max_new: usize,
        on_step: impl FnMut(&StepOutput, bool) -> Result<Flow>,
    ) -> Result<Vec<u32>> {
        let common = self.keep_prefix_of(tokens);
        self.run(&tokens[common..], max_new, on_step)
    }

    /// Truncates the history to its longest common prefix with `tokens`, leaving at least one
    /// token of `tokens` to decode; returns the prefix length.
    fn keep_prefix_of(&mut self, tokens: &[u32]) -> usize {
        let common = self
            .history
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        self.history.truncate(common);
        common
    }

    /// As `continue_with`, but the host picks every generated token from the step's logits
    /// with `sampler` (a per-request sampler, whatever the engine's was opened with) and feeds
    /// it back as the next step's token. `on_step` sees `None` after each prompt step but the
    /// last and each generated token after; it may stop at any of them (a cancelled request
    /// stops during its prompt). Returns the generated tokens.
    pub fn continue_sampled(
        &mut self,
        tokens: &[u32],
        max_new: usize,
        sampler: &mut Sampler,
        mut on_step: impl FnMut(Option<u32>) -> Result<Flow>,
    ) -> Result<Vec<u32>> {
        if tokens.is_empty() {
            bail!("the prompt is empty; at least one token is needed");
        }
        let common = self.keep_prefix_of(tokens);
        let prompt = &tokens[common..];
        let (mut fed, mut done) = (0usize, 0usize);
        let mut stopped = false;
        let mut logits = None;
        while done < fed || (fed < prompt.len() && !stopped) {
            while !stopped && fed < prompt.len() && self.engine.in_flight() < self.window {
                self.engine.submit(StepInput {
                    pos: (common + fed) as u32,
                    token: Some(prompt[fed]),
                })?;
                fed += 1;
            }
            let out = self.engine.next_output()?;
            done += 1;
            if stopped {
                continue;
            }
            if done == prompt.len() {
                logits = Some(out.logits);
            } else if on_step(None)? == Flow::Stop {
                stopped = true;
            }
        }
        self.history.extend_from_slice(&prompt[..done]);
        let mut generated = Vec::new();
        let Some(mut logits) = logits else {
            return Ok(generated);
        };
        while generated.len() < max_new {
            let token = sampler.sample(&logits);
            generated.push(token);
            if on_step(Some(token))? == Flow::Stop || generated.len() == max_new {
                break;
            }
            let out = self.engine.step(StepInput {
                pos: self.history.len() as u32,
                token: Some(token),
            })?;
            self.history.push(token);
            logits = out.logits;
        }
        Ok(generated)
    }

    /// Decodes `prompt` (one step per token, after the history) and then generates up to
    /// `max_new` tokens. `on_step` sees every step's output and whether it generated a token
    /// (the last prompt step and all later ones do); it may stop generation. Returns the
    /// generated tokens. With `max_new == 0` every prompt step is only scored.
    pub fn run(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        mut on_step: impl FnMut(&StepOutput, bool) -> Result<Flow>,
    ) -> Result<Vec<u32>> {
        if prompt.is_empty() {
            bail!("the prompt is empty; at least one token is needed");
        }
        let p = prompt.len();
        let total = if max_new == 0 { p } else { p + max_new - 1 };
        let base = self.history.len();
        let (mut submitted, mut received) = (0usize, 0usize);
        let mut generated = Vec::new();
        let mut stopped = false;
        // Steps whose cache rows are valid for the next call: all that ran before a stop.
        let mut valid = 0usize;
        while received < submitted || (submitted < total && !stopped) {
            while !stopped && submitted < total && self.engine.in_flight() < self.window {
                let token = prompt.get(submitted).copied();
                self.engine.submit(StepInput {
                    pos: (base + submitted) as u32,
                    token,
                })?;
                submitted += 1;
            }
            let out = self.engine.next_output()?;
            let i = received;
            received += 1;
            if stopped {
                continue;
            }
            valid = received;
            let generates = max_new > 0 && i + 1 >= p;
            if generates {
                generated.push(out.token);
            }
            if on_step(&out, generates)? == Flow::Stop || (generates && generated.len() == max_new)
            {
                stopped = true;
            }
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
