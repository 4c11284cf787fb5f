//! Shutting down on SIGINT or SIGTERM. The first signal stops the listener taking connections
//! and the engine taking queued jobs (they get a 503); the sequences decoding go on for the
//! grace period, then end at the engine's next step with `finish_reason` `length` and their
//! usage, so every stream gets its last chunk and `[DONE]`. The process exits 0 once every
//! connection has closed. A second signal exits at once (status 128 + the signal).
//!
//! The signals are blocked in every thread (the mask is set before any server thread starts,
//! and threads inherit it) and taken by one thread with `sigwait`, so no handler runs in
//! signal context.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use tokio::sync::watch;

use super::metrics::Metrics;

/// The shutdown state the signal thread, the HTTP side and the engine thread share.
pub struct Drain {
    /// Set by the first signal: take no more requests.
    stopping: AtomicBool,
    /// Set when the grace period is over: end every decoding sequence at the next step.
    cut: AtomicBool,
    /// Sequences that finished after the signal, and those cut by it.
    pub finished: AtomicUsize,
    /// Sequences cut short at the end of the grace period.
    pub cut_short: AtomicUsize,
    /// Queued requests refused because of the shutdown.
    pub refused: AtomicUsize,
    /// Becomes true with the first signal; every waiter of `stopped` sees it.
    signalled: watch::Sender<bool>,
}

impl Default for Drain {
    fn default() -> Drain {
        Drain {
            stopping: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            finished: AtomicUsize::new(0),
            cut_short: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            signalled: watch::Sender::new(false),
        }
    }
}

impl Drain {
    /// Whether the server is shutting down (no new request is taken).
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Whether decoding sequences are to end at the next step.
    pub fn cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Starts the shutdown, as the first signal does.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.signalled.send_replace(true);
    }

    /// Resolves once the shutdown has started.
    pub async fn stopped(&self) {
        // The sender lives in `self`, so the wait ends only with the value.
        let _ = self.signalled.subscribe().wait_for(|&s| s).await;
    }

    /// Ends the grace period: the engine cuts every sequence at its next step.
    pub fn end_grace(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }
}

/// Blocks SIGINT and SIGTERM in this thread (and so in every thread it starts from now on)
/// and starts the thread that takes them: the first calls `drain.stop()`, a second exits.
/// Call before starting any other server thread.
pub fn watch_signals(drain: Arc<Drain>) -> Result<()> {
    // SAFETY: the set is initialized by sigemptyset before use; pthread_sigmask and sigwait
    // only read it.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(anyhow!("blocking SIGINT and SIGTERM: error {rc}"));
        }
        set
    };
    std::thread::Builder::new()
        .name("memra-signals".into())
        .spawn(move || {
            let mut seen = 0;
            loop {
                let mut signal = 0;
                // SAFETY: `set` is a valid signal set and `signal` a valid out pointer.
                if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                    continue;
                }
                seen += 1;
                let name = if signal == libc::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                };
                if seen > 1 {
                    eprintln!("{name} again: exiting now");
                    std::process::exit(128 + signal);
                }
                drain.stop();
            }
        })
        .map_err(|e| anyhow!("starting the signal thread: {e}"))?;
    Ok(())
}

/// After the shutdown starts: logs it, ends the grace period after `grace`, and exits the
/// process if connections are still open `linger` after that (a client that reads nothing).
pub async fn run_down(drain: Arc<Drain>, metrics: Arc<Metrics>, grace: Duration, linger: Duration) {
    drain.stopped().await;
    let in_flight =
        metrics.slots_used.load(Ordering::Relaxed) + metrics.queued.load(Ordering::Relaxed);
    eprintln!(
        "shutting down: taking no new requests; {in_flight} sequences decoding or queued; those decoding may finish within {:.1} s (--shutdown-grace), then end with finish_reason length; a second signal exits at once",
        grace.as_secs_f64()
    );
    tokio::time::sleep(grace).await;
    drain.end_grace();
    tokio::time::sleep(linger).await;
    eprintln!(
        "shutdown: connections still open {:.1} s after the grace period; exiting",
        linger.as_secs_f64()
    );
    std::process::exit(0);
}
