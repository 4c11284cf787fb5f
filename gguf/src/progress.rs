//! Progress of long work (loading weights, a perplexity run, writing a synthetic model) on
//! stderr: a bar while stderr is a terminal, and one summary line when the work is done (the
//! bar is cleared first, so a terminal and a log both end with just that line). The
//! binaries turn it on with `report_to_stderr`; until then every `Progress` is silent, so
//! library users and tests print nothing.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

static REPORT: AtomicBool = AtomicBool::new(false);

/// Turns progress reports on for the rest of the process (called by the binaries' `main`).
pub fn report_to_stderr() {
    REPORT.store(true, Ordering::Relaxed);
}

/// What a `Progress` counts.
#[derive(Debug, Clone, Copy)]
pub enum Unit {
    /// Bytes, shown in binary units.
    Bytes,
    /// Items named by the plural noun given (`"tokens decoded"`).
    Items(&'static str),
}

/// A shared handle on one piece of long work; clones count into the same total.
#[derive(Debug, Clone)]
pub struct Progress(Option<Arc<Work>>);

#[derive(Debug)]
struct Work {
    label: String,
    unit: Unit,
    total: u64,
    done: AtomicU64,
    finished: AtomicBool,
    started: Instant,
    bar: ProgressBar,
}

impl Progress {
    /// Starts reporting `total` units of work named `label`; silent when reports are off or
    /// there is nothing to do.
    pub fn new(label: &str, total: u64, unit: Unit) -> Progress {
        if !REPORT.load(Ordering::Relaxed) || total == 0 {
            return Progress::silent();
        }
        let counts = match unit {
            Unit::Bytes => {
                "{binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}".to_string()
            }
            Unit::Items(noun) => format!("{{human_pos}}/{{human_len}} {noun} ({{per_sec:1}}"),
        };
        let style = ProgressStyle::with_template(&format!(
            "{{prefix}} [{{wide_bar}}] {counts}, eta {{eta}})"
        ))
        .expect("invariant: the template names known keys");
        // An abandoned bar (the work failed) is cleared, so the error prints on a clean line.
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
            .with_style(style)
            .with_prefix(label.to_string())
            .with_finish(ProgressFinish::AndClear);
        Progress(Some(Arc::new(Work {
            label: label.to_string(),
            unit,
            total,
            done: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            started: Instant::now(),
            bar,
        })))
    }

    /// A progress that reports nothing.
    pub fn silent() -> Progress {
        Progress(None)
    }

    /// Like `new`, but draws no bar while stdout is a terminal too: work that prints partial
    /// lines there (perplexity's running values) would have them erased by the bar's redraws.
    /// The summary line still comes.
    pub fn new_beside_stdout(label: &str, total: u64, unit: Unit) -> Progress {
        let progress = Progress::new(label, total, unit);
        if let Some(work) = &progress.0 {
            if std::io::stdout().is_terminal() {
                work.bar.set_draw_target(ProgressDrawTarget::hidden());
            }
        }
        progress
    }

    /// Counts `n` more units done.
    pub fn inc(&self, n: u64) {
        if let Some(work) = &self.0 {
            work.done.fetch_add(n, Ordering::Relaxed);
            work.bar.inc(n);
        }
    }

    /// Clears the bar and prints the summary line; only the first call does.
    pub fn finish(&self) {
        if let Some(work) = &self.0 {
            if !work.finished.swap(true, Ordering::Relaxed) {
                work.bar.finish_and_clear();
                eprintln!("{}", work.summary());
            }
        }
    }

    /// Finishes once the count has reached the total: for work that several owners count
    /// (the ranks of one weight load), where none of them knows it is the last.
    pub fn finish_when_complete(&self) {
        if let Some(work) = &self.0 {
            if work.done.load(Ordering::Relaxed) >= work.total {
                self.finish();
            }
        }
    }
}

impl Work {
    /// `loading weights: 98.2 MiB in 0.4 s (245.5 MiB/s)`.
    fn summary(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64();
        let done = self.done.load(Ordering::Relaxed);
        let rate = done as f64 / secs.max(1e-9);
        let mut line = format!("{}: ", self.label);
        match self.unit {
            Unit::Bytes => write!(
                line,
                "{} in {secs:.1} s ({}/s)",
                HumanBytes(done),
                HumanBytes(rate as u64)
            ),
            Unit::Items(noun) => write!(line, "{} {noun} in {secs:.1} s ({rate:.1}/s)", done),
        }
        .expect("invariant: writing to a String cannot fail");
        line
    }
}
