//! The server's counters and gauges, and their Prometheus text exposition for `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Seconds over which `memra_tokens_per_second` counts the generated tokens.
const RATE_WINDOW: u64 = 10;

/// Everything `/metrics` reports; shared by the HTTP handlers and the engine thread.
pub struct Metrics {
    /// Requests answered, by (endpoint, HTTP status).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// Generated tokens of each of the last `RATE_WINDOW` whole seconds since `start`.
    recent: Mutex<Recent>,
    start: Instant,
    /// f64 bits: generated tokens per second of the last finished sequence, after its first.
    sequence_tokens_per_second: AtomicU64,
    /// Requests waiting for the engine.
    pub queued: AtomicUsize,
    /// Sequence slots of the KV cache in use.
    pub slots_used: AtomicUsize,
    slots_total: usize,
    /// Engine steps, and the sequences they carried (their ratio is the mean batch).
    steps: AtomicU64,
    step_sequences: AtomicU64,
    /// Speculative decoding: tokens drafted, and those accepted.
    drafted: AtomicU64,
    accepted: AtomicU64,
}

impl Metrics {
    /// Zeroed metrics for a plan with `slots` sequence slots.
    pub fn new(slots: usize) -> Metrics {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            recent: Mutex::new(Recent::default()),
            start: Instant::now(),
            sequence_tokens_per_second: AtomicU64::new(0f64.to_bits()),
            queued: AtomicUsize::new(0),
            slots_used: AtomicUsize::new(0),
            slots_total: slots,
            steps: AtomicU64::new(0),
            step_sequences: AtomicU64::new(0),
            drafted: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        }
    }

    /// Counts one answered request.
    pub fn count_request(&self, endpoint: &str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests.entry((endpoint.to_owned(), status)).or_insert(0) += 1;
    }

    /// Counts a sequence's prompt tokens when the engine takes it.
    pub fn count_prompt(&self, tokens: usize) {
        self.prompt_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// Counts a verify step's drafted tokens and those accepted.
    pub fn count_drafts(&self, drafted: usize, accepted: usize) {
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
    }

    /// Counts one generated token.
    pub fn count_generated(&self) {
        self.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let second = self.start.elapsed().as_secs();
        self.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(second);
    }

    /// Tokens generated per second over the last `RATE_WINDOW` seconds (or since the start,
    /// when it is more recent), all sequences together.
    fn tokens_per_second(&self) -> f64 {
        let elapsed = self.start.elapsed();
        let counted = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .since(elapsed.as_secs());
        counted as f64 / elapsed.as_secs_f64().clamp(1e-9, RATE_WINDOW as f64)
    }

    /// Counts one engine step carrying `sequences` sequences.
    pub fn count_step(&self, sequences: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_sequences
            .fetch_add(sequences as u64, Ordering::Relaxed);
    }

    /// Records the decode speed of a finished sequence.
    pub fn set_sequence_tokens_per_second(&self, rate: f64) {
        self.sequence_tokens_per_second
            .store(rate.to_bits(), Ordering::Relaxed);
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let requests: Vec<(String, String)> = self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|((endpoint, status), n)| {
                (
                    format!("{{endpoint=\"{endpoint}\",status=\"{status}\"}}"),
                    n.to_string(),
                )
            })
            .collect();
        let plain = |v: String| vec![(String::new(), v)];
        let load = |a: &AtomicUsize| plain(a.load(Ordering::Relaxed).to_string());
        metric(
            "memra_requests_total",
            "counter",
            "Requests answered, by endpoint and HTTP status.",
            &requests,
        );
        metric(
            "memra_prompt_tokens_total",
            "counter",
            "Prompt tokens of the sequences the engine took.",
            &plain(self.prompt_tokens.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "memra_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &plain(self.generated_tokens.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "memra_tokens_per_second",
            "gauge",
            "Tokens generated per second over the last 10 s, all sequences together.",
            &plain(format!("{:.3}", self.tokens_per_second())),
        );
        metric(
            "memra_sequence_tokens_per_second",
            "gauge",
            "Generated tokens per second of the last finished sequence, after its first token.",
            &plain(format!(
                "{:.3}",
                f64::from_bits(self.sequence_tokens_per_second.load(Ordering::Relaxed))
            )),
        );
        metric(
            "memra_queue_length",
            "gauge",
            "Requests waiting for the engine.",
            &load(&self.queued),
        );
        metric(
            "memra_kv_slots_used",
            "gauge",
            "Sequence slots of the KV cache in use.",
            &load(&self.slots_used),
        );
        metric(
            "memra_kv_slots_total",
            "gauge",
            "Sequence slots of the KV cache (the plan's runtime.max_sequences).",
            &plain(self.slots_total.to_string()),
        );
        metric(
            "memra_steps_total",
            "counter",
            "Engine steps (each decodes every sequence in the batch).",
            &plain(self.steps.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "memra_step_sequences_total",
            "counter",
            "Sequences the engine steps carried; over memra_steps_total, the mean batch.",
            &plain(self.step_sequences.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "memra_draft_tokens_total",
            "counter",
            "Tokens drafted for speculative decoding (a plan with [speculative]).",
            &plain(self.drafted.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "memra_draft_tokens_accepted_total",
            "counter",
            "Drafted tokens accepted: over memra_draft_tokens_total, the acceptance rate.",
            &plain(self.accepted.load(Ordering::Relaxed).to_string()),
        );
        out
    }
}

/// Counts per whole second for the last `RATE_WINDOW` seconds, in a ring by second.
#[derive(Default)]
struct Recent {
    /// (second, count) at index `second % RATE_WINDOW`.
    buckets: [(u64, u64); RATE_WINDOW as usize],
}

impl Recent {
    fn add(&mut self, second: u64) {
        let b = &mut self.buckets[(second % RATE_WINDOW) as usize];
        if b.0 != second {
            *b = (second, 0);
        }
        b.1 += 1;
    }

    /// The counts of the seconds `now + 1 - RATE_WINDOW ..= now`.
    fn since(&self, now: u64) -> u64 {
        let first = (now + 1).saturating_sub(RATE_WINDOW);
        self.buckets
            .iter()
            .filter(|&&(second, _)| (first..=now).contains(&second))
            .map(|&(_, n)| n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_lists_counts_by_label() {
        let m = Metrics::new(2);
        m.count_request("/v1/completions", 200);
        m.count_request("/v1/completions", 200);
        m.count_request("/v1/completions", 400);
        m.count_prompt(7);
        m.count_generated();
        m.queued.store(3, Ordering::Relaxed);
        m.count_step(2);
        m.count_step(1);
        let text = m.render();
        for line in [
            "memra_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2",
            "memra_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1",
            "memra_prompt_tokens_total 7",
            "memra_generated_tokens_total 1",
            "memra_queue_length 3",
            "memra_kv_slots_total 2",
            "memra_steps_total 2",
            "memra_step_sequences_total 3",
            "# TYPE memra_tokens_per_second gauge",
            "# TYPE memra_sequence_tokens_per_second gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }

    #[test]
    fn the_rate_counts_the_last_ten_seconds() {
        let mut r = Recent::default();
        for second in [0, 0, 3, 9, 9, 9] {
            r.add(second);
        }
        assert_eq!(r.since(9), 6);
        // second 10 takes second 0's bucket; second 0 has left the window
        r.add(10);
        assert_eq!(r.since(10), 5);
        assert_eq!(r.since(13), 4);
        assert_eq!(r.since(30), 0);
        let m = Metrics::new(1);
        m.count_generated();
        m.count_generated();
        let rate = m.tokens_per_second();
        assert!(rate > 0.0, "{rate}");
    }
}
