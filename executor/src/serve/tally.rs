//! One request's account: when it is dropped (the response sent, the stream ended, or the
//! client gone) it logs one line on stderr and counts the request in the metrics.

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
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.metrics.count_request(self.endpoint, self.status);
        eprintln!(
            "{} {} {} prompt={} generated={} {:.1} ms",
            self.method,
            self.path,
            self.status,
            self.prompt,
            self.generated,
            self.started.elapsed().as_secs_f64() * 1e3
        );
    }
}
