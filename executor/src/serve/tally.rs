//! One request's account: when it is dropped (the response sent, the stream ended, or the
//! client gone) it logs one line on stderr (with the time to the first text and the decode
//! rate after it, for a request that generated) and counts the request in the metrics.

use std::sync::Arc;
use std::time::Instant;

use super::metrics::Metrics;

/// Status recorded for a client that went away before its answer was complete (nginx's
/// "client closed request").
pub const CLIENT_GONE: u16 = 499;

/// The log line and metric of one request, written on drop.
pub struct Tally {
    metrics: Arc<Metrics>,
    method: String,
    path: String,
    /// The endpoint label in the metrics (`other` for paths without an endpoint).
    endpoint: &'static str,
    started: Instant,
    /// HTTP status; `CLIENT_GONE` until an answer is complete.
    pub status: u16,
    /// Prompt tokens.
    pub prompt: usize,
    /// Generated tokens.
    pub generated: usize,
    /// When the first text came from the engine.
    first: Option<Instant>,
}

impl Tally {
    /// Starts the account of a request to `path`, counted under `endpoint`.
    pub fn new(metrics: &Arc<Metrics>, method: &str, path: &str, endpoint: &'static str) -> Tally {
        Tally {
            metrics: metrics.clone(),
            method: method.to_owned(),
            path: path.to_owned(),
            endpoint,
            started: Instant::now(),
            status: CLIENT_GONE,
            prompt: 0,
            generated: 0,
            first: None,
        }
    }

    /// Notes that text came from the engine (the first call counts).
    pub fn text_came(&mut self) {
        self.first.get_or_insert_with(Instant::now);
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.metrics.count_request(self.endpoint, self.status);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let timing = match self.first {
            Some(first) => {
                let after = first.elapsed().as_secs_f64();
                let rate = match self.generated {
                    n if n > 1 && after > 0.0 => format!("{:.1}", (n - 1) as f64 / after),
                    _ => "-".to_owned(),
                };
                format!(
                    " ttft={:.1} ms decode={rate} tok/s",
                    ms(first - self.started)
                )
            }
            None => String::new(),
        };
        eprintln!(
            "{} {} {} prompt={} generated={}{timing} {:.1} ms",
            self.method,
            self.path,
            self.status,
            self.prompt,
            self.generated,
            ms(self.started.elapsed())
        );
    }
}
