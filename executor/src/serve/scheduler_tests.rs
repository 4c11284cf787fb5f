//! The engine thread's tests over a fixed engine: failures, cancellation, the queue limit,
//! sequences decoding together.

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
/// most sequences one step carried, `written` the token each step embedded at each
/// position, by slot and position.
struct Fixed {
    token: u32,
    fail_at: Option<u32>,
    ticks: Option<Receiver<()>>,
    rows: u32,
    widest: Arc<AtomicUsize>,
    written: Arc<std::sync::Mutex<std::collections::BTreeMap<(u32, u32), u32>>>,
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
            written: Arc::default(),
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
        let mut written = self.written.lock().unwrap();
        for span in input.spans.iter() {
            for (i, &t) in span.tokens.iter().enumerate() {
                written.insert((span.slot, span.pos + i as u32), t);
            }
        }
        // a row of logits per span, or a verify span's every row
        let rows: usize = input
            .spans
            .iter()
            .map(|s| (s.rows() - s.logits_from) as usize)
            .sum();
        let argmaxes = input.spans.len();
        let (logits, argmax) = match input.readback {
            Readback::Logits => {
                let mut logits = vec![0.0; 257 * rows];
                for row in logits.chunks_exact_mut(257) {
                    row[self.token as usize] = 1.0;
                }
                (logits, Vec::new())
            }
            Readback::Argmax => (Vec::new(), vec![self.token; argmaxes]),
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
        Scheduler::start(open, tokenizer, metrics.clone(), Arc::default(), 8, None).unwrap();
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

/// The token of "a" and a scheduler of one slot decoding it, at most `max_queued` jobs
/// waiting, a step waiting for a tick on the sender.
fn ticked(metrics: Arc<Metrics>, max_queued: usize) -> (u32, Sender<()>, Scheduler) {
    let tokenizer = tokenizer();
    let a = tokenizer.encode("a", false).unwrap()[0];
    let (tick, ticks) = channel();
    let mut ticks = Some(ticks);
    let open = move || Ok(Batch::new(Fixed::new(a, None, ticks.take()), 1, 1));
    let scheduler =
        Scheduler::start(open, tokenizer, metrics, Arc::default(), max_queued, None).unwrap();
    (a, tick, scheduler)
}

#[test]
fn a_cancelled_job_is_dropped_before_its_next_step() {
    let (a, tick, scheduler) = ticked(Arc::new(Metrics::new(1)), 8);
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
    let metrics = Arc::new(Metrics::new(1));
    let (a, tick, scheduler) = ticked(metrics.clone(), 1);
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
        Scheduler::start(open, tokenizer, metrics.clone(), Arc::default(), 8, None).unwrap();
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

/// The value of the unlabelled metric `name` in `metrics`' exposition.
fn metric(metrics: &Metrics, name: &str) -> f64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}

/// A job of prompt `prompt` speculating (up to 3 drafts a step) over an engine that always
/// picks `picks`: its events and the (drafted, accepted, steps) counts. Fails unless every
/// position the engine embedded last holds the prompt's token or a generated one there (a
/// rejected draft's position written again).
fn speculate(prompt: &str, picks: &str, n: usize) -> (Vec<Event>, [f64; 3]) {
    let tokenizer = tokenizer();
    let tokens = tokenizer.encode(prompt, false).unwrap();
    let pick = tokenizer.encode(picks, false).unwrap()[0];
    let written = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let seen = written.clone();
    let open = move || {
        let mut engine = Fixed::new(pick, None, None);
        engine.rows = 4;
        engine.written = seen.clone();
        Ok(Batch::new(engine, 2, 1))
    };
    let metrics = Arc::new(Metrics::new(2));
    let drafting = Some(Drafting {
        tokens: 3,
        max_context: 64,
    });
    let scheduler = Scheduler::start(
        open,
        tokenizer,
        metrics.clone(),
        Arc::default(),
        8,
        drafting,
    )
    .unwrap();
    let (job, rx) = job(tokens.clone(), n);
    scheduler.submit(job).unwrap();
    let all = events(rx);
    // the last generated token is never embedded
    let want: Vec<u32> = tokens.into_iter().chain(vec![pick; n - 1]).collect();
    let got: Vec<u32> = written
        .lock()
        .unwrap()
        .range((0, 0)..(1, 0))
        .map(|(_, &t)| t)
        .collect();
    assert_eq!(
        got[..want.len()],
        want[..],
        "the tokens at each position of slot 0"
    );
    let counts = [
        "memra_draft_tokens_total",
        "memra_draft_tokens_accepted_total",
        "memra_steps_total",
    ]
    .map(|name| metric(&metrics, name));
    (all, counts)
}

fn text_of(all: &[Event]) -> String {
    all.iter()
        .filter_map(|e| match e {
            Event::Text { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_speculating_job_takes_accepted_drafts_without_steps_of_their_own() {
    let (all, [drafted, accepted, steps]) = speculate("aaaa", "a", 10);
    assert_eq!(text_of(&all), "a".repeat(10));
    assert_eq!(
        all.last(),
        Some(&Event::Done(Finish {
            reason: FinishReason::Length,
            prompt_tokens: 4,
            completion_tokens: 10,
        }))
    );
    // every draft is the engine's pick; the prompt's step gives one token and each verify
    // step its accepted drafts and one more
    assert!(
        drafted > 0.0 && accepted == drafted,
        "{accepted} of {drafted}"
    );
    assert_eq!(accepted + steps, 10.0);
}

#[test]
fn a_rejected_draft_leaves_the_text_plain_decodings() {
    // after "xyxy" and the engine's "x", lookup drafts "y" ("xyx" was followed by "y"), which
    // the engine rejects; once "xx" repeats, it drafts "x"
    let (all, [drafted, accepted, _]) = speculate("xyxy", "x", 8);
    assert_eq!(text_of(&all), "x".repeat(8));
    assert!(
        accepted < drafted && accepted > 0.0,
        "{accepted} of {drafted}: the test wants rejected and accepted drafts"
    );
}
