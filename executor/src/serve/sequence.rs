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
    /// The prompt and the tokens sampled since: what prompt lookup drafts from.
    context: Vec<u32>,
    /// The drafts fed after the sequence's last token (`verify`).
    drafts: Vec<u32>,
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
            context: job.tokens.clone(),
            job,
            slot,
            tokenizer,
            decoder: tokenizer.stream_decoder(),
            reason: FinishReason::Length,
            sampled: 0,
            completion: 0,
            first: None,
            drafts: Vec::new(),
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
        // a greedy sequence's first token comes from its logits too, so that a model whose
        // logits are not finite fails there
        let token = if self.needs_logits() || self.sampled == 0 {
            let logits = stepped.logits(d).ok_or_else(|| {
                anyhow!("invariant: a sampled sequence's step brings back its logits")
            })?;
            self.pick(logits, None)?
        } else {
            stepped.argmax(d)?
        };
        Ok(self.emit(token, metrics)?.then_some(token))
    }

    /// `advance` over a verify span's rows (`Sequence::verify`): row i's logits verify draft
    /// i (`Sampler::verify`) after the tokens before it were taken; the first token that is
    /// not a draft (a rejection's, or the one after every draft) ends the walk. Returns the
    /// token to decode next (`None`: the sequence ended) and the drafts accepted.
    pub fn advance_drafts(
        &mut self,
        stepped: &Stepped,
        d: &Decoded,
        metrics: &Metrics,
    ) -> Result<(Option<u32>, usize)> {
        let drafts = std::mem::take(&mut self.drafts);
        if d.rows != drafts.len() + 1 {
            bail!(
                "invariant: a verify span of {} drafts brought back {} rows of logits",
                drafts.len(),
                d.rows
            );
        }
        for (i, draft) in drafts.iter().map(Some).chain([None]).enumerate() {
            let logits = stepped.row_logits(d, i).ok_or_else(|| {
                anyhow!("invariant: a verify step brings back every row's logits")
            })?;
            let token = self.pick(logits, draft.copied())?;
            let taken = draft == Some(&token);
            let accepted = i + usize::from(taken);
            if !self.emit(token, metrics)? {
                return Ok((None, accepted));
            }
            if !taken {
                return Ok((Some(token), accepted));
            }
        }
        unreachable!("invariant: the last row has no draft, so its token ends the walk")
    }

    /// The drafts prompt lookup finds for the sequence after its last token: at most
    /// `tokens`, none past `max_context` positions or its `max_tokens`. `Sequence::advance_drafts`
    /// verifies them after the step that decodes them.
    pub fn draft(&mut self, tokens: usize, max_context: usize) -> Vec<u32> {
        // the last token sits at position context.len() - 1 once a step embeds it
        let room = tokens
            .min(max_context.saturating_sub(self.context.len()))
            .min(self.job.max_tokens.saturating_sub(self.sampled + 1));
        self.drafts = crate::speculate::lookup(&self.context, room);
        self.drafts.clone()
    }

    /// The next token from `logits` (a draw, or the argmax, of its penalized and masked
    /// logits; with `draft`, speculative sampling of it), and its logprob when asked.
    fn pick(&mut self, logits: &[f32], draft: Option<u32>) -> Result<u32> {
        let sampling = self.job.sampling;
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
        let mut token = match draft {
            _ if sampling.config.is_greedy() => argmax(shaped),
            Some(draft) => self.sampler.verify(shaped, draft),
            None => self.sampler.sample(shaped),
        };
        // the draw's fallback for a sum rounded past its target is the last candidate,
        // which a mask may have ruled out: the best allowed one instead
        if shaped.get(token as usize) == Some(&f32::NEG_INFINITY) {
            token = argmax(shaped);
        }
        if let (Some(top), false) = (sampling.logprobs, self.tokenizer.is_eog(token)) {
            self.logprobs.push(token_logprob(logits, token, top));
        }
        Ok(token)
    }

    /// Takes `token` as the sequence's next and sends the text it releases; whether the
    /// sequence goes on (not at its end of generation, a stop string, a completed grammar or
    /// `max_tokens`).
    fn emit(&mut self, token: u32, metrics: &Metrics) -> Result<bool> {
        self.penalties.record(token);
        self.sampled += 1;
        self.context.push(token);
        if self.tokenizer.is_eog(token) {
            self.reason = FinishReason::Stop;
            return Ok(false);
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
                return Ok(false);
            }
        }
        if complete {
            self.reason = FinishReason::Stop;
            return Ok(false);
        }
        Ok(self.sampled < self.job.max_tokens)
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
