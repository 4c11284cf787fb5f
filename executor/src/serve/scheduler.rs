//! The engine thread and its queue: continuous batching. HTTP handlers send `Job`s through a
//! channel; the thread owns the engine's `Batch` and loops: retire the sequences whose
//! clients went away (a dropped request frees its slot at the next step), admit waiting jobs
//! into free sequence slots (up to `runtime.max_sequences`, in arrival order), run one step
//! over every sequence in the batch (each generating sequence's next token, and the prompt
//! chunks of joining ones), and let each sequence whose logits came back pick its token
//! with its own sampler and send its text (`sequence`). A sequence's text does not depend
//! on the company it decoded in: every row of a step is computed as it would be alone. An
//! engine error fails the sequences of that step only: the engine is reopened for the next
//! jobs. On a plan with `[speculative]` (`Drafting`), each sequence feeds its token with the
//! drafts prompt lookup finds in its own context, and its next step verifies them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;

use anyhow::{anyhow, Result};
use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::grammar::Constraint;
use super::logprobs::TokenLogprob;
use super::metrics::Metrics;
use super::sequence::Sequence;
use super::shutdown::Drain;
use crate::batch::{Batch, Decoded, Stepped};
use crate::sample::{PenaltyConfig, SamplerConfig};
use crate::text::Tokenizer;

/// One choice of a request, as queued for the engine (a request of `n` choices queues `n`).
pub struct Job {
    /// Prompt tokens (the rendered chat or the completion prompt).
    pub tokens: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How this sequence picks its tokens.
    pub sampling: Sampling,
    /// Strings that end the text.
    pub stop: Vec<String>,
    /// The `response_format` grammar the tokens must follow, if any.
    pub constraint: Option<Constraint>,
    /// Set when the client is gone; the engine drops the sequence at its next step.
    pub cancel: Arc<AtomicBool>,
    /// The choice's index in its request.
    pub index: usize,
    /// Where the text goes, tagged with `index` (the request's choices share the channel).
    pub events: UnboundedSender<(usize, Event)>,
}

/// How a sequence picks its tokens: the sampler, min-p, the penalties, and the logprobs it
/// reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Temperature, top-k, top-p and seed.
    pub config: SamplerConfig,
    /// Min-p truncation; 0 keeps all.
    pub min_p: f32,
    /// Presence, frequency and repetition penalties.
    pub penalties: PenaltyConfig,
    /// With `Some(top)`, each token's logprob and the `top` best tokens' are reported.
    pub logprobs: Option<usize>,
}

impl Sampling {
    /// Whether the sequence needs its step's logits (as it does under a `response_format`
    /// grammar too); else the engine's argmax is its token.
    pub fn needs_logits(&self) -> bool {
        !self.config.is_greedy() || !self.penalties.is_none() || self.logprobs.is_some()
    }
}

/// What the engine sends back for a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The next piece of text, the tokens generated so far (so a request cut short still
    /// logs what it cost), and the logprobs of the tokens since the last piece when asked.
    Text {
        text: String,
        completion: usize,
        logprobs: Vec<TokenLogprob>,
    },
    /// The sequence ended.
    Done(Finish),
    /// The engine failed on this sequence.
    Failed(String),
    /// The job was refused before it started (the server is shutting down).
    Refused(ApiError),
}

/// How a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    /// Why it stopped.
    pub reason: FinishReason,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (an end-of-generation token is not counted).
    pub completion_tokens: usize,
}

/// OpenAI's `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End of generation or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    /// The name in responses.
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Speculative decoding by prompt lookup (a plan's `[speculative]`): up to `tokens` drafts a
/// step, within `max_context` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drafting {
    pub tokens: usize,
    pub max_context: usize,
}

/// The handle HTTP handlers queue jobs through.
pub struct Scheduler {
    queue: Sender<Job>,
    metrics: Arc<Metrics>,
    drain: Arc<Drain>,
    /// Most jobs waiting for the engine.
    max_queued: usize,
}

impl Scheduler {
    /// Starts the engine thread: `open` makes a batch on it (again after an engine error);
    /// with `drafting`, its sequences decode speculatively. Returns once the first batch is
    /// open, or with its error.
    pub fn start(
        open: impl FnMut() -> Result<Batch> + Send + 'static,
        tokenizer: Arc<Tokenizer>,
        metrics: Arc<Metrics>,
        drain: Arc<Drain>,
        max_queued: usize,
        drafting: Option<Drafting>,
    ) -> Result<Scheduler> {
        let (queue, jobs) = channel();
        let (ready_tx, ready) = channel();
        let thread_metrics = metrics.clone();
        let thread_drain = drain.clone();
        std::thread::Builder::new()
            .name("memra-engine".into())
            .spawn(move || {
                let mut engine = Engine {
                    open,
                    batch: None,
                    tokenizer,
                    metrics: thread_metrics,
                    drain: thread_drain,
                    drafting,
                };
                let opened = engine.reopen();
                let ok = opened.is_ok();
                // The server waits for this; it cannot be gone.
                let _ = ready_tx.send(opened);
                if ok {
                    engine.serve(jobs);
                }
            })
            .map_err(|e| anyhow!("starting the engine thread: {e}"))?;
        ready
            .recv()
            .map_err(|_| anyhow!("the engine thread stopped while opening"))??;
        Ok(Scheduler {
            queue,
            metrics,
            drain,
            max_queued,
        })
    }

    /// Queues a job behind the ones waiting, or refuses it (503) when `max_queued` wait or
    /// the server is shutting down.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        if self.drain.stopping() {
            return Err(ApiError::shutting_down());
        }
        let max = self.max_queued;
        self.metrics
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                (q < max).then_some(q + 1)
            })
            .map_err(|_| ApiError::busy(max))?;
        self.queue.send(job).map_err(|_| {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            ApiError::engine("the engine thread has stopped")
        })
    }
}

/// The engine thread's state.
struct Engine<F> {
    open: F,
    batch: Option<Batch>,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    drain: Arc<Drain>,
    drafting: Option<Drafting>,
}

impl<F: FnMut() -> Result<Batch>> Engine<F> {
    fn reopen(&mut self) -> Result<()> {
        self.batch = None;
        self.batch = Some((self.open)()?);
        Ok(())
    }

    /// Runs jobs until every sender is gone and the last sequence has ended: between two
    /// steps, retires the sequences whose clients are gone, admits waiting jobs into free
    /// slots, then steps every sequence in the batch at once.
    fn serve(&mut self, jobs: Receiver<Job>) {
        let tokenizer = self.tokenizer.clone();
        let mut waiting: VecDeque<Job> = VecDeque::new();
        let mut running: Vec<Sequence> = Vec::new();
        let mut listening = true;
        loop {
            if running.is_empty() && waiting.is_empty() {
                match jobs.recv() {
                    Ok(job) => waiting.push_back(job),
                    Err(_) => return,
                }
            }
            while listening {
                match jobs.try_recv() {
                    Ok(job) => waiting.push_back(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => listening = false,
                }
            }
            let (gone, kept) = running.into_iter().partition(Sequence::gone);
            running = kept;
            for sequence in gone {
                self.leave(sequence, None);
            }
            if self.drain.stopping() {
                self.refuse(&mut waiting);
            }
            if self.drain.cut() {
                for mut sequence in std::mem::take(&mut running) {
                    sequence.cut();
                    self.drain.cut_short.fetch_add(1, Ordering::Relaxed);
                    self.leave(sequence, None);
                }
            }
            if let Err(e) = self.admit(&mut waiting, &mut running, &tokenizer) {
                // The engine could not be reopened: the waiting jobs fail one by one.
                if let Some(job) = waiting.pop_front() {
                    self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                    let _ = job
                        .events
                        .send((job.index, Event::Failed(format!("{e:#}"))));
                }
                continue;
            }
            if running.is_empty() {
                if !listening && waiting.is_empty() {
                    return;
                }
                continue;
            }
            running = self.step(running);
        }
    }

    /// Answers every waiting job with the shutdown's 503.
    fn refuse(&mut self, waiting: &mut VecDeque<Job>) {
        for job in waiting.drain(..) {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            self.drain.refused.fetch_add(1, Ordering::Relaxed);
            let _ = job
                .events
                .send((job.index, Event::Refused(ApiError::shutting_down())));
        }
    }

    /// Moves waiting jobs into free slots, in arrival order; a cancelled one is dropped.
    fn admit<'t>(
        &mut self,
        waiting: &mut VecDeque<Job>,
        running: &mut Vec<Sequence<'t>>,
        tokenizer: &'t Tokenizer,
    ) -> Result<()> {
        while let Some(job) = waiting.pop_front() {
            if job.cancel.load(Ordering::Relaxed) {
                self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            if self.batch.is_none() {
                waiting.push_front(job);
                self.reopen()?;
                continue;
            }
            let batch = self.batch.as_mut().expect("invariant: opened above");
            match batch.join(&job.tokens) {
                Ok(Some(slot)) => {
                    self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                    self.metrics.count_prompt(job.tokens.len());
                    running.push(Sequence::new(job, slot, tokenizer));
                }
                Ok(None) => {
                    waiting.push_front(job);
                    break;
                }
                Err(e) => {
                    self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                    let _ = job
                        .events
                        .send((job.index, Event::Failed(format!("{e:#}"))));
                }
            }
        }
        self.count_slots();
        Ok(())
    }

    /// One batched step: each sequence whose tokens are all decoded picks its next token
    /// from its logits and goes on or ends. An engine error fails every running sequence
    /// (the next admission reopens the engine).
    fn step<'t>(&mut self, running: Vec<Sequence<'t>>) -> Vec<Sequence<'t>> {
        let batch = self
            .batch
            .as_mut()
            .expect("invariant: running sequences have a batch");
        let stepped = match batch.step() {
            Ok(stepped) => {
                self.metrics.count_step(stepped.sequences);
                stepped
            }
            Err(e) => {
                let message = format!("{e:#}");
                for sequence in running {
                    sequence.fail(&message);
                }
                self.batch = None;
                self.count_slots();
                return Vec::new();
            }
        };
        let mut kept = Vec::with_capacity(running.len());
        for mut sequence in running {
            // a client gone during the step gets nothing of it
            if sequence.gone() {
                self.leave(sequence, None);
                continue;
            }
            let Some(d) = stepped.done.iter().find(|d| d.slot == sequence.slot) else {
                kept.push(sequence);
                continue;
            };
            let fed = self.advance(&mut sequence, &stepped, d);
            match fed {
                Ok(Some(())) => kept.push(sequence),
                Ok(None) => self.leave(sequence, None),
                Err(e) => self.leave(sequence, Some(format!("{e:#}"))),
            }
        }
        self.count_slots();
        kept
    }

    /// `sequence`'s next token from its step `d`, fed for the next step (with its drafts when
    /// speculating); `None` when the sequence has ended.
    fn advance(
        &mut self,
        sequence: &mut Sequence,
        stepped: &Stepped,
        d: &Decoded,
    ) -> Result<Option<()>> {
        let batch = self.batch.as_mut().expect("invariant: stepped before");
        let Some(drafting) = self.drafting else {
            let Some(token) = sequence.advance(stepped, d, &self.metrics)? else {
                return Ok(None);
            };
            if sequence.argmax_from_now() {
                // its argmax comes back from the engine, not its logits
                batch.greedy(sequence.slot)?;
            }
            return batch.feed(sequence.slot, token).map(Some);
        };
        let drafted = d.rows - 1;
        let (next, accepted) = sequence.advance_drafts(stepped, d, &self.metrics)?;
        self.metrics.count_drafts(drafted, accepted);
        let Some(token) = next else {
            return Ok(None);
        };
        batch.accept(sequence.slot, accepted)?;
        let drafts = sequence.draft(drafting.tokens, drafting.max_context);
        batch.verify(sequence.slot, token, &drafts).map(Some)
    }

    /// Frees `sequence`'s slot and ends its request (failed with `error` if given).
    fn leave(&mut self, sequence: Sequence, error: Option<String>) {
        if let Some(batch) = self.batch.as_mut() {
            // The slot is the sequence's own; freeing it cannot fail.
            let _ = batch.leave(sequence.slot);
        }
        // counted before the client hears of the end
        self.count_slots();
        if self.drain.stopping() {
            self.drain.finished.fetch_add(1, Ordering::Relaxed);
        }
        match error {
            Some(message) => sequence.fail(&message),
            None => sequence.finish(&self.metrics),
        }
    }

    fn count_slots(&self) {
        let used = self.batch.as_ref().map_or(0, Batch::used);
        self.metrics.slots_used.store(used, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
