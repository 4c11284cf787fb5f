//! One request's sequence while it holds a sequence slot: its own sampler and penalties, the
//! text decoder and stop matcher between its tokens and the client, its logprobs and its
//! counts. The scheduler hands it the logits each step leaves it; it picks the next token,
//! sends the text that token releases and says whether the sequence goes on.

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use super::logprobs::{token_logprob, TokenLogprob};
use super::metrics::Metrics;
use super::scheduler::{Event, Finish, FinishReason, Job};
use super::stop::StopMatcher;
use crate::batch::{Decoded, Stepped};
use crate::sample::{argmax, Penalties, Sampler};
use crate::text::{StreamDecoder, Tokenizer};

/// A job decoding in a slot.
pub(super) struct Sequence<'t> {
    job: Job,
    /// The slot of the batch it holds.
    pub slot: usize,
    sampler: Sampler,
    penalties: Penalties,
    /// Logprobs of the tokens whose text has not been sent yet.
    logprobs: Vec<TokenLogprob>,
    tokenizer: &'t Tokenizer,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    reason: FinishReason,
    /// Tokens sampled, an end-of-generation token included.
    sampled: usize,
    /// Tokens generated (an end-of-generation token is not counted).
    completion: usize,
    first: Option<Instant>,
}

impl<'t> Sequence<'t> {
    /// `job`'s sequence in `slot`.
    pub fn new(job: Job, slot: usize, tokenizer: &'t Tokenizer) -> Sequence<'t> {
        let sampling = job.sampling;
        Sequence {
            sampler: Sampler::new(sampling.config).with_min_p(sampling.min_p),
            penalties: Penalties::new(sampling.penalties, &job.tokens),
            logprobs: Vec::new(),
            stop: StopMatcher::new(job.stop.clone()),
            job,
            slot,
            tokenizer,
            decoder: tokenizer.stream_decoder(),
            reason: FinishReason::Length,
            sampled: 0,
            completion: 0,
            first: None,
        }
    }

    /// Whether the client is gone (cancelled, or its event channel closed).
    pub fn gone(&self) -> bool {
        self.job.cancel.load(Ordering::Relaxed) || self.job.events.is_closed()
    }

    /// Picks the next token from the step's output for it, `d` (the engine's argmax where
    /// the sequence needs no logits, else the argmax or a draw from its penalized logits),
    /// and sends the text it releases. Returns the token to decode next, or `None` when the
    /// sequence has ended (end of generation, a stop string, `max_tokens`).
    pub fn advance(
        &mut self,
        stepped: &Stepped,
        d: &Decoded,
        metrics: &Metrics,
    ) -> Result<Option<u32>> {
        let sampling = self.job.sampling;
        // a greedy sequence's first token comes from its logits too, so that a model whose
        // logits are not finite fails there
        let token = if self.needs_logits() || self.sampled == 0 {
            let logits = stepped.logits(d).ok_or_else(|| {
                anyhow!("invariant: a sampled sequence's step brings back its logits")
            })?;
            if let Some(at) = logits.iter().position(|l| !l.is_finite()) {
                bail!(
                    "the model's logits are not finite (token {at}: {}) after {} generated tokens: a weight or an activation holds NaN or infinity",
                    logits[at],
                    self.sampled
                );
            }
            let mut shaped = self.penalties.apply(logits);
            if let Some(constraint) = self.job.constraint.as_mut() {
                shaped = constraint.mask(shaped)?;
            }
            let mut token = if sampling.config.is_greedy() {
                argmax(shaped)
            } else {
                self.sampler.sample(shaped)
            };
            // the draw's fallback for a sum rounded past its target is the last candidate,
            // which a mask may have ruled out: the best allowed one instead
            if shaped.get(token as usize) == Some(&f32::NEG_INFINITY) {
                token = argmax(shaped);
            }
            if let (Some(top), false) = (sampling.logprobs, self.tokenizer.is_eog(token)) {
                self.logprobs.push(token_logprob(logits, token, top));
            }
            token
        } else {
            stepped.argmax(d)?
        };
        self.penalties.record(token);
        self.sampled += 1;
        if self.tokenizer.is_eog(token) {
            self.reason = FinishReason::Stop;
            return Ok(None);
        }
        self.first.get_or_insert_with(Instant::now);
        self.completion += 1;
        metrics.count_generated();
        let complete = match self.job.constraint.as_mut() {
            Some(constraint) => constraint.consume(token)?,
            None => false,
        };
        if let Some(text) = self.decoder.push(token)? {
            let released = self.stop.push(&text);
            self.send(released.text);
            if released.stopped {
                self.reason = FinishReason::Stop;
                return Ok(None);
            }
        }
        if complete {
            self.reason = FinishReason::Stop;
            return Ok(None);
        }
        Ok((self.sampled < self.job.max_tokens).then_some(token))
    }

    /// Whether the sequence picks from its logits: its sampling asks for them, or a grammar
    /// masks them.
    fn needs_logits(&self) -> bool {
        self.job.sampling.needs_logits() || self.job.constraint.is_some()
    }

    /// Whether the sequence has just picked its first token and needs no logits from now on:
    /// the engine's argmax picks the rest (`Batch::greedy`).
    pub fn argmax_from_now(&self) -> bool {
        self.sampled == 1 && !self.needs_logits()
    }

    /// Sends `text` and the logprobs held for it, unless both are empty.
    fn send(&mut self, text: String) {
        if !text.is_empty() || !self.logprobs.is_empty() {
            let event = Event::Text {
                text,
                completion: self.completion,
                logprobs: std::mem::take(&mut self.logprobs),
            };
            // A client that is gone no longer listens; nothing else to do.
            let _ = self.job.events.send((self.job.index, event));
        }
    }

    /// Marks the sequence as cut short (by the shutdown): it ends with `length`.
    pub fn cut(&mut self) {
        self.reason = FinishReason::Length;
    }

    /// Ends the sequence: the text held for a stop string that never came, its rate, `Done`.
    pub fn finish(mut self, metrics: &Metrics) {
        let tail = self.stop.finish();
        self.send(tail);
        if let Some(first) = self.first.filter(|_| self.completion > 1) {
            let seconds = first.elapsed().as_secs_f64().max(1e-9);
            metrics.set_sequence_tokens_per_second((self.completion - 1) as f64 / seconds);
        }
        let done = Event::Done(Finish {
            reason: self.reason,
            prompt_tokens: self.job.tokens.len(),
            completion_tokens: self.completion,
        });
        let _ = self.job.events.send((self.job.index, done));
    }

    /// Fails the request with `message`.
    pub fn fail(self, message: &str) {
        let failed = Event::Failed(message.to_owned());
        let _ = self.job.events.send((self.job.index, failed));
    }
}
