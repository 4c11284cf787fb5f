//! The engine thread and its queue: continuous batching. HTTP handlers send `Job`s through a
//! channel; the thread owns the engine's `Batch` and loops: retire the sequences whose
//! clients went away (a dropped request frees its slot at the next step), admit waiting jobs
//! into free sequence slots (up to `runtime.max_sequences`, in arrival order), run one step
//! over every sequence in the batch (each generating sequence's next token, and the prompt
//! chunks of joining ones), and let each sequence whose logits came back pick its token
//! with its own sampler and send its text (`sequence`). A sequence's text does not depend
//! on the company it decoded in: every row of a step is computed as it would be alone. An
//! engine error fails the sequences of that step only: the engine is reopened for the next
//! jobs.

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
use crate::batch::Batch;
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
    /// Whether a `response_format` grammar masks the logits.
    pub constrained: bool,
}

impl Sampling {
    /// Whether the sequence needs its step's logits; else the engine's argmax is its token.
    pub fn needs_logits(&self) -> bool {
        !self.config.is_greedy()
            || !self.penalties.is_none()
            || self.logprobs.is_some()
            || self.constrained
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

/// The handle HTTP handlers queue jobs through.
pub struct Scheduler {
    queue: Sender<Job>,
    metrics: Arc<Metrics>,
    drain: Arc<Drain>,
    /// Most jobs waiting for the engine.
    max_queued: usize,
}

impl Scheduler {
    /// Starts the engine thread: `open` makes a batch on it (again after an engine error).
    /// Returns once the first batch is open, or with its error.
    pub fn start(
        open: impl FnMut() -> Result<Batch> + Send + 'static,
        tokenizer: Arc<Tokenizer>,
        metrics: Arc<Metrics>,
        drain: Arc<Drain>,
        max_queued: usize,
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
            let fed = sequence
                .advance(&stepped, d, &self.metrics)
                .and_then(|next| {
                    let batch = self.batch.as_mut().expect("invariant: stepped above");
                    if sequence.argmax_from_now() {
                        // its argmax comes back from the engine, not its logits
                        batch.greedy(sequence.slot)?;
                    }
                    next.map(|token| batch.feed(sequence.slot, token))
                        .transpose()
                });
            match fed {
                Ok(Some(())) => kept.push(sequence),
                Ok(None) => self.leave(sequence, None),
                Err(e) => self.leave(sequence, Some(format!("{e:#}"))),
            }
        }
        self.count_slots();
        kept
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
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicUsize;

    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    use super::*;
    use crate::engine::{Decoder, PromptMode, Readback, StepInput, StepOutput};
    use crate::text::TokenizerSpec;

    /// A byte-level vocabulary: end of text (id 0) and the 256 byte symbols.
    fn text(text: &str, completion: usize) -> Event {
        Event::Text {
            text: text.into(),
            completion,
            logprobs: Vec::new(),
        }
    }

    fn tokenizer() -> Arc<Tokenizer> {
        let mut tokens = vec!["<|endoftext|>".to_owned()];
        let mut bytes: Vec<String> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .map(String::from)
            .collect();
        bytes.sort();
        tokens.extend(bytes);
        let spec = TokenizerSpec {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            token_types: [3].into_iter().chain([1; 256]).collect(),
            tokens,
            eos: Some(0),
            ..TokenizerSpec::default()
        };
        Arc::new(Tokenizer::from_spec(&spec).unwrap())
    }

    /// An engine of up to `rows` rows per step whose logits always pick `token`, failing at
    /// position `fail_at` if given; with `ticks`, each step waits for one. `widest` keeps the
    /// most sequences one step carried.
    struct Fixed {
        token: u32,
        fail_at: Option<u32>,
        ticks: Option<Receiver<()>>,
        rows: u32,
        widest: Arc<AtomicUsize>,
        outputs: VecDeque<StepOutput>,
    }

    impl Fixed {
        fn new(token: u32, fail_at: Option<u32>, ticks: Option<Receiver<()>>) -> Fixed {
            Fixed {
                token,
                fail_at,
                ticks,
                rows: 1,
                widest: Arc::default(),
                outputs: VecDeque::new(),
            }
        }
    }

    impl Decoder for Fixed {
        fn submit(&mut self, input: StepInput) -> Result<()> {
            if let Some(ticks) = &self.ticks {
                ticks.recv()?;
            }
            if let Some(at) = input.rows_at().find(|r| Some(r.pos as u32) == self.fail_at) {
                anyhow::bail!("the device fell over at position {}", at.pos);
            }
            self.widest.fetch_max(input.spans.len(), Ordering::Relaxed);
            let rows = input.spans.len();
            let (logits, argmax) = match input.readback {
                Readback::Logits => {
                    let mut logits = vec![0.0; 257 * rows];
                    for row in logits.chunks_exact_mut(257) {
                        row[self.token as usize] = 1.0;
                    }
                    (logits, Vec::new())
                }
                Readback::Argmax => (Vec::new(), vec![self.token; rows]),
            };
            self.outputs.push_back(StepOutput {
                step: 0,
                pos: input.pos(),
                token: self.token,
                logits,
                argmax,
            });
            Ok(())
        }
        fn next_output(&mut self) -> Result<StepOutput> {
            Ok(self.outputs.pop_front().unwrap())
        }
        fn in_flight(&self) -> u64 {
            self.outputs.len() as u64
        }
        fn prompt_mode(&self) -> PromptMode {
            PromptMode::Chunks(self.rows)
        }
    }

    fn job(tokens: Vec<u32>, max_tokens: usize) -> (Job, UnboundedReceiver<(usize, Event)>) {
        let (events, rx) = unbounded_channel();
        let job = Job {
            tokens,
            max_tokens,
            sampling: Sampling {
                config: SamplerConfig::GREEDY,
                min_p: 0.0,
                penalties: PenaltyConfig::NONE,
                logprobs: None,
                constrained: false,
            },
            stop: Vec::new(),
            constraint: None,
            cancel: Arc::new(AtomicBool::new(false)),
            index: 0,
            events,
        };
        (job, rx)
    }

    fn events(mut rx: UnboundedReceiver<(usize, Event)>) -> Vec<Event> {
        let mut all = Vec::new();
        while let Some((_, e)) = rx.blocking_recv() {
            let last = matches!(e, Event::Done(_) | Event::Failed(_));
            all.push(e);
            if last {
                break;
            }
        }
        all
    }

    #[test]
    fn an_engine_error_fails_its_request_and_the_next_gets_a_new_engine() {
        let tokenizer = tokenizer();
        let a = tokenizer.encode("a", false).unwrap()[0];
        let opened = Arc::new(AtomicUsize::new(0));
        let count = opened.clone();
        let open = move || {
            // The first engine fails at position 3, the reopened one never.
            let first = count.fetch_add(1, Ordering::Relaxed) == 0;
            Ok(Batch::new(Fixed::new(a, first.then_some(3), None), 1, 1))
        };
        let metrics = Arc::new(Metrics::new(1));
        let scheduler =
            Scheduler::start(open, tokenizer, metrics.clone(), Arc::default(), 8).unwrap();
        let (failing, rx_failing) = job(vec![a, a], 5);
        let (next, rx_next) = job(vec![a], 3);
        scheduler.submit(failing).unwrap();
        scheduler.submit(next).unwrap();
        let failed = events(rx_failing);
        assert!(
            matches!(failed.last(), Some(Event::Failed(m)) if m.contains("position 3")),
            "{failed:?}"
        );
        let done = events(rx_next);
        assert_eq!(
            done,
            [
                text("a", 1),
                text("a", 2),
                text("a", 3),
                Event::Done(Finish {
                    reason: FinishReason::Length,
                    prompt_tokens: 1,
                    completion_tokens: 3,
                }),
            ]
        );
        assert_eq!(opened.load(Ordering::Relaxed), 2);
        assert_eq!(metrics.queued.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_cancelled_job_is_dropped_before_its_next_step() {
        let tokenizer = tokenizer();
        let a = tokenizer.encode("a", false).unwrap()[0];
        let (tick, ticks) = channel();
        let mut ticks = Some(ticks);
        let open = move || Ok(Batch::new(Fixed::new(a, None, ticks.take()), 1, 1));
        let scheduler = Scheduler::start(
            open,
            tokenizer,
            Arc::new(Metrics::new(1)),
            Arc::default(),
            8,
        )
        .unwrap();
        // Cancelled while queued: never decoded, its channel closes without an event.
        let (queued, mut rx) = job(vec![a], 50);
        queued.cancel.store(true, Ordering::Relaxed);
        scheduler.submit(queued).unwrap();
        assert_eq!(rx.blocking_recv(), None);
        // Cancelled after its first token: the step under way is its last and sends nothing.
        let (running, mut rx) = job(vec![a], 50);
        let cancel = running.cancel.clone();
        scheduler.submit(running).unwrap();
        tick.send(()).unwrap();
        assert_eq!(rx.blocking_recv(), Some((0, text("a", 1))));
        cancel.store(true, Ordering::Relaxed);
        for _ in 0..50 {
            tick.send(()).unwrap();
        }
        let done = Finish {
            reason: FinishReason::Length,
            prompt_tokens: 1,
            completion_tokens: 1,
        };
        assert_eq!(rx.blocking_recv(), Some((0, Event::Done(done))));
    }

    #[test]
    fn past_the_queue_limit_a_job_is_refused_busy() {
        let tokenizer = tokenizer();
        let a = tokenizer.encode("a", false).unwrap()[0];
        let (tick, ticks) = channel();
        let mut ticks = Some(ticks);
        let open = move || Ok(Batch::new(Fixed::new(a, None, ticks.take()), 1, 1));
        let metrics = Arc::new(Metrics::new(1));
        let scheduler =
            Scheduler::start(open, tokenizer, metrics.clone(), Arc::default(), 1).unwrap();
        // the first takes the one slot (its step waits for a tick), the second waits
        let (running, rx_running) = job(vec![a], 2);
        scheduler.submit(running).unwrap();
        while metrics.slots_used.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (waiting, rx_waiting) = job(vec![a], 2);
        scheduler.submit(waiting).unwrap();
        let (refused, _) = job(vec![a], 2);
        let e = scheduler.submit(refused).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(metrics.queued.load(Ordering::Relaxed), 1);
        let ticking = std::thread::spawn(move || while tick.send(()).is_ok() {});
        for rx in [rx_running, rx_waiting] {
            assert!(matches!(events(rx).last(), Some(Event::Done(_))));
        }
        drop(scheduler);
        ticking.join().unwrap();
    }

    #[test]
    fn jobs_decode_together_up_to_the_slots_and_the_rest_wait() {
        let tokenizer = tokenizer();
        let a = tokenizer.encode("a", false).unwrap()[0];
        // a step waits for a tick, handed over one at a time
        let (tick, ticks) = std::sync::mpsc::sync_channel(0);
        let mut ticks = Some(ticks);
        let widest = Arc::new(AtomicUsize::new(0));
        let seen = widest.clone();
        let open = move || {
            let mut engine = Fixed::new(a, None, ticks.take());
            engine.rows = 4;
            engine.widest = seen.clone();
            Ok(Batch::new(engine, 2, 1))
        };
        let metrics = Arc::new(Metrics::new(2));
        let scheduler =
            Scheduler::start(open, tokenizer, metrics.clone(), Arc::default(), 8).unwrap();
        let receivers: Vec<_> = (0..3)
            .map(|_| {
                let (job, rx) = job(vec![a, a], 5);
                scheduler.submit(job).unwrap();
                rx
            })
            .collect();
        let ticking = std::thread::spawn(move || while tick.send(()).is_ok() {});
        for rx in receivers {
            let all = events(rx);
            assert_eq!(all.len(), 6, "{all:?}");
            assert_eq!(
                all.last(),
                Some(&Event::Done(Finish {
                    reason: FinishReason::Length,
                    prompt_tokens: 2,
                    completion_tokens: 5,
                }))
            );
        }
        assert_eq!(widest.load(Ordering::Relaxed), 2);
        assert_eq!(metrics.slots_used.load(Ordering::Relaxed), 0);
        drop(scheduler);
        ticking.join().unwrap();
    }
}
