//! The engine thread and its queue. HTTP handlers send `Job`s through a channel; the thread
//! owns the engine's session and decodes one sequence at a time, in arrival order, sending
//! each piece of text back as an `Event`. Between two decode steps it checks the job's
//! cancellation flag (set when the client goes away), so a dropped request frees its
//! sequence at the next step. An engine error fails only its own request: the engine is
//! reopened before the next job.
//!
//! Continuous batching slots in here and nowhere else: the loop becomes "admit queued jobs
//! into free KV slots (up to `runtime.max_sequences`), run one batched step over the active
//! sequences, sample each row with its own `Sampler`, send each row's text, retire the rows
//! that finished or were cancelled". A job's per-sequence state (sampler, stream decoder,
//! stop matcher, cancellation flag, event channel) is already its own, and the HTTP side,
//! `Job` and `Event` do not change.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Result};
use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::metrics::Metrics;
use super::stop::StopMatcher;
use crate::sample::{Sampler, SamplerConfig};
use crate::session::{Flow, Session};
use crate::text::Tokenizer;

/// One request's sequence, as queued for the engine.
pub struct Job {
    /// Prompt tokens (the rendered chat or the completion prompt).
    pub tokens: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How this sequence picks its tokens.
    pub sampler: SamplerConfig,
    /// Strings that end the text.
    pub stop: Vec<String>,
    /// Set when the client is gone; the engine drops the sequence at its next step.
    pub cancel: Arc<AtomicBool>,
    /// Where the text goes.
    pub events: UnboundedSender<Event>,
}

/// What the engine sends back for a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The next piece of text.
    Text(String),
    /// The sequence ended.
    Done(Finish),
    /// The engine failed on this sequence.
    Failed(String),
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
}

impl Scheduler {
    /// Starts the engine thread: `open` makes a session on it (again after an engine
    /// error). Returns once the first session is open, or with its error.
    pub fn start(
        open: impl FnMut() -> Result<Session> + Send + 'static,
        tokenizer: Arc<Tokenizer>,
        metrics: Arc<Metrics>,
    ) -> Result<Scheduler> {
        let (queue, jobs) = channel();
        let (ready_tx, ready) = channel();
        let thread_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("memra-engine".into())
            .spawn(move || {
                let mut engine = Engine {
                    open,
                    session: None,
                    tokenizer,
                    metrics: thread_metrics,
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
        Ok(Scheduler { queue, metrics })
    }

    /// Queues a job behind the ones waiting.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.metrics.queued.fetch_add(1, Ordering::Relaxed);
        self.queue.send(job).map_err(|_| {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            ApiError::engine("the engine thread has stopped")
        })
    }
}

/// The engine thread's state.
struct Engine<F> {
    open: F,
    session: Option<Session>,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
}

impl<F: FnMut() -> Result<Session>> Engine<F> {
    fn reopen(&mut self) -> Result<()> {
        self.session = None;
        self.session = Some((self.open)()?);
        Ok(())
    }

    /// Runs jobs until every sender is gone.
    fn serve(&mut self, jobs: Receiver<Job>) {
        for job in jobs {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            if job.cancel.load(Ordering::Relaxed) {
                continue;
            }
            self.metrics.slots_used.store(1, Ordering::Relaxed);
            let result = self.decode(&job);
            self.metrics.slots_used.store(0, Ordering::Relaxed);
            let event = match result {
                Ok(finish) => Event::Done(finish),
                Err(e) => {
                    // The request is answered first; the next one waits for the reopen.
                    let _ = job.events.send(Event::Failed(format!("{e:#}")));
                    if let Err(e) = self.reopen() {
                        eprintln!("error: reopening the engine: {e:#}");
                    }
                    continue;
                }
            };
            // A client that is gone no longer listens; nothing else to do.
            let _ = job.events.send(event);
        }
    }

    /// Decodes one job, sending its text as it comes.
    fn decode(&mut self, job: &Job) -> Result<Finish> {
        if self.session.is_none() {
            self.reopen()?;
        }
        let session = self
            .session
            .as_mut()
            .expect("invariant: a session was just opened");
        let tokenizer = &*self.tokenizer;
        let metrics = &*self.metrics;
        metrics.count_prompt(job.tokens.len());
        let mut sampler = Sampler::new(job.sampler);
        let mut decoder = tokenizer.stream_decoder();
        let mut stop = StopMatcher::new(job.stop.clone());
        let mut reason = FinishReason::Length;
        let mut completion = 0usize;
        let mut first: Option<Instant> = None;
        let gone = || job.cancel.load(Ordering::Relaxed) || job.events.is_closed();
        let send = |text: String| {
            if !text.is_empty() {
                let _ = job.events.send(Event::Text(text));
            }
        };
        session.continue_sampled(&job.tokens, job.max_tokens, &mut sampler, |token| {
            if gone() {
                return Ok(Flow::Stop);
            }
            let Some(token) = token else {
                return Ok(Flow::Continue);
            };
            if tokenizer.is_eog(token) {
                reason = FinishReason::Stop;
                return Ok(Flow::Stop);
            }
            first.get_or_insert_with(Instant::now);
            completion += 1;
            metrics.count_generated();
            let Some(text) = decoder.push(token)? else {
                return Ok(Flow::Continue);
            };
            let released = stop.push(&text);
            send(released.text);
            if released.stopped {
                reason = FinishReason::Stop;
                return Ok(Flow::Stop);
            }
            Ok(Flow::Continue)
        })?;
        // A tail held for a stop string that never came is text after all.
        send(stop.finish());
        if let Some(first) = first.filter(|_| completion > 1) {
            let seconds = first.elapsed().as_secs_f64().max(1e-9);
            metrics.set_tokens_per_second((completion - 1) as f64 / seconds);
        }
        Ok(Finish {
            reason,
            prompt_tokens: job.tokens.len(),
            completion_tokens: completion,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicUsize;

    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    use super::*;
    use crate::engine::{Decoder, PromptMode, StepInput, StepOutput};
    use crate::text::TokenizerSpec;

    /// A byte-level vocabulary: end of text (id 0) and the 256 byte symbols.
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

    /// An engine whose logits always pick `token`, failing at position `fail_at` if given;
    /// with `ticks`, each step waits for one.
    struct Fixed {
        token: u32,
        fail_at: Option<u32>,
        ticks: Option<Receiver<()>>,
        outputs: VecDeque<StepOutput>,
    }

    impl Fixed {
        fn new(token: u32, fail_at: Option<u32>, ticks: Option<Receiver<()>>) -> Fixed {
            Fixed {
                token,
                fail_at,
                ticks,
                outputs: VecDeque::new(),
            }
        }
    }

    impl Decoder for Fixed {
        fn submit(&mut self, input: StepInput) -> Result<()> {
            if let Some(ticks) = &self.ticks {
                ticks.recv()?;
            }
            if Some(input.pos) == self.fail_at {
                anyhow::bail!("the device fell over at position {}", input.pos);
            }
            let mut logits = vec![0.0; 257];
            logits[self.token as usize] = 1.0;
            self.outputs.push_back(StepOutput {
                step: 0,
                pos: input.pos,
                token: self.token,
                logits,
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
            PromptMode::TokenByToken("a test engine of one row per step")
        }
    }

    fn job(tokens: Vec<u32>, max_tokens: usize) -> (Job, UnboundedReceiver<Event>) {
        let (events, rx) = unbounded_channel();
        let job = Job {
            tokens,
            max_tokens,
            sampler: SamplerConfig::GREEDY,
            stop: Vec::new(),
            cancel: Arc::new(AtomicBool::new(false)),
            events,
        };
        (job, rx)
    }

    fn events(mut rx: UnboundedReceiver<Event>) -> Vec<Event> {
        let mut all = Vec::new();
        while let Some(e) = rx.blocking_recv() {
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
            Ok(Session::new(Fixed::new(a, first.then_some(3), None), 2))
        };
        let metrics = Arc::new(Metrics::new(1));
        let scheduler = Scheduler::start(open, tokenizer, metrics.clone()).unwrap();
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
                Event::Text("a".into()),
                Event::Text("a".into()),
                Event::Text("a".into()),
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
        let open = move || Ok(Session::new(Fixed::new(a, None, ticks.take()), 1));
        let scheduler = Scheduler::start(open, tokenizer, Arc::new(Metrics::new(1))).unwrap();
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
        assert_eq!(rx.blocking_recv(), Some(Event::Text("a".into())));
        cancel.store(true, Ordering::Relaxed);
        for _ in 0..50 {
            tick.send(()).unwrap();
        }
        let done = Finish {
            reason: FinishReason::Length,
            prompt_tokens: 1,
            completion_tokens: 1,
        };
        assert_eq!(rx.blocking_recv(), Some(Event::Done(done)));
    }
}
