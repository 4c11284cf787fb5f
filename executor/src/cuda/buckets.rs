//! Which graph a step replays. A step whose spans are one row each (a decode step of one
//! sequence, a batched step of generated tokens; a one-token prompt span is such a row too)
//! is a *decode step*: it is padded up to the smallest bucket of rows that holds it, and its
//! runs replay a graph captured per (run, phase, bucket). Everything a graph bakes in (row
//! counts in launch arguments, buffer addresses) is fixed per bucket; what changes per step
//! (each row's position, slot and token) goes up in stream order through the rank's input
//! ring into device buffers the graph reads. A step with prompt rows (a prefill chunk, a
//! joining sequence's chunk in a batched step) runs eagerly. A run's first step of a (phase,
//! bucket) runs eagerly (the warm-up), the engine captures it before the second and replays
//! it from then on; a failed capture latches the run to eager for good.
//!
//! Buckets are the powers of two up to 32, then the multiples of 32, and last the widest
//! decode step the engine takes (`runtime.max_sequences`, at most the rows of one step): 13
//! graphs per run and phase at most, for 256 sequences. The batched q4 products take rows in
//! tiles of 8, 16 and 32 (`matvec_mma`): up to 32 rows a step fits the one tile its bucket
//! fills, past 32 it takes as many 32-row tiles as its bucket, so padding adds no weight tile
//! to a q4 product. It costs the pad rows' own work (norms, the head, the 8-row tiles of the
//! other dtypes' matvec), and nothing in attention.
//!
//! A speculative plan's verify step of one sequence (a span of its token and m drafts, every
//! row's logits back, on the batched decode kernels) replays graphs too: its *verify bucket*
//! is its row count, 2 to `tokens + 1`, with no pad rows (every launch of such a step reads
//! its rows' positions, slot and tokens from the input buffers, and its grid depends on the
//! row count alone). A verify span beside other sequences' rows runs eagerly.
//!
//! Pad rows come first, so the real rows are the step's last ones and the sampler's last row
//! is a real one. A pad row embeds token 0 at position 0 of the slot `PAD_SLOT`, which no
//! sequence has: `kv_store_rows_f16` and `attention_f16` skip it (no cache write, no cache
//! read, zero output), so it writes no sequence's cache, and every other kernel keeps each
//! row's bits apart from the other rows', so no real row changes. Its logits are computed
//! with the rest and never come back (`Rows::padding`).

use super::graph::Graph;
use super::rank::Rows;
use crate::engine::StepInput;

/// Rows past which buckets step by this many (the widest row tile of the batched products).
const BUCKET_STEP: usize = 32;

/// The row counts decode steps are padded to, ascending, then the verify buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Buckets {
    rows: Vec<usize>,
    /// The widest verify step with a bucket of its own (0: none): verify buckets of 2 to
    /// `verify` rows follow the decode buckets.
    verify: usize,
}

/// How a step is enqueued: its token rows, the rows of its head (a batched step's), and the
/// bucket whose graphs replay its runs (`None`: eagerly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shape {
    pub(super) rows: Rows,
    /// The rows whose logits the head computes, in row order (pad rows included).
    pub(super) logit_rows: Vec<usize>,
    pub(super) bucket: Option<usize>,
}

impl Buckets {
    /// The buckets of an engine whose decode steps have at most `widest` rows and whose
    /// verify steps up to `verify` rows (0: a plan without speculation).
    pub(super) fn new(widest: usize, verify: usize) -> Buckets {
        let widest = widest.max(1);
        let mut rows: Vec<usize> = std::iter::successors(Some(1), |&r| {
            Some(if r < BUCKET_STEP {
                2 * r
            } else {
                r + BUCKET_STEP
            })
        })
        .take_while(|&r| r < widest)
        .collect();
        rows.push(widest);
        Buckets { rows, verify }
    }

    /// Buckets of the engine.
    pub(super) fn len(&self) -> usize {
        self.rows.len() + self.verify.saturating_sub(1)
    }

    /// Rows of bucket `i`, and whether it is a verify bucket.
    pub(super) fn rows(&self, i: usize) -> (usize, bool) {
        match self.rows.get(i) {
            Some(&rows) => (rows, false),
            None => (i - self.rows.len() + 2, true),
        }
    }

    /// How `input` is enqueued: a decode step of `n` rows as its bucket's rows, the first
    /// `bucket - n` of them pad rows, every row a logit row; a verify step of one sequence
    /// in its verify bucket; any other step as it is, eagerly.
    pub(super) fn shape(&self, input: &StepInput) -> Shape {
        let n = input.rows() as usize;
        let decode = n == input.spans.len();
        let verify = !decode
            && input.decode_bits
            && input.spans.len() == 1
            && n <= self.verify
            && input.spans[0].logits_from == 0;
        if verify {
            return Shape {
                rows: Rows {
                    rows: n,
                    logits_from: 0,
                    padding: 0,
                    decode: false,
                    decode_bits: true,
                },
                logit_rows: (0..n).collect(),
                bucket: Some(self.rows.len() + n - 2),
            };
        }
        match self.rows.iter().position(|&b| b >= n).filter(|_| decode) {
            Some(i) => Shape {
                rows: Rows {
                    rows: self.rows[i],
                    logits_from: 0,
                    padding: self.rows[i] - n,
                    decode: true,
                    // a decode step's rows have decode's bits on either kernels: the graphs
                    // of its bucket are the plan's own
                    decode_bits: false,
                },
                logit_rows: (0..self.rows[i]).collect(),
                bucket: Some(i),
            },
            None => {
                let logit_rows = input.logit_rows();
                Shape {
                    rows: Rows {
                        rows: n,
                        logits_from: n - logit_rows.len(),
                        padding: 0,
                        decode: false,
                        decode_bits: input.decode_bits,
                    },
                    logit_rows,
                    bucket: None,
                }
            }
        }
    }
}

/// Where one (phase, bucket) of a run stands.
enum GraphState {
    /// Not run yet: its first step runs eagerly.
    Cold,
    /// Ran eagerly once: due for capture before its next step.
    Warm,
    Captured(Graph),
}

/// What entering a run does.
pub(super) enum Replay<'a> {
    /// Walk its work eagerly: the run is latched, or this is its phase and bucket's warm-up.
    Walk,
    /// Replay this graph.
    Graph(&'a Graph),
    /// Warmed up but not captured before its step: an engine bug.
    Uncaptured,
}

/// Graph state of one `run` step: per phase and bucket.
pub(super) struct RunGraphs {
    phases: u64,
    buckets: usize,
    /// By phase, then bucket.
    states: Vec<GraphState>,
    /// A capture failed: the run is eager from then on.
    latched: bool,
}

impl RunGraphs {
    /// A run of `phases` phases on an engine of `buckets` buckets, nothing captured.
    pub(super) fn new(phases: u32, buckets: usize) -> RunGraphs {
        let phases = u64::from(phases.max(1));
        RunGraphs {
            phases,
            buckets,
            states: (0..phases as usize * buckets)
                .map(|_| GraphState::Cold)
                .collect(),
            latched: false,
        }
    }

    fn at(&self, t: u64, bucket: usize) -> usize {
        (t % self.phases) as usize * self.buckets + bucket
    }

    /// What entering the run at step `t` in `bucket` does; the first time marks that phase
    /// and bucket warmed up.
    pub(super) fn enter(&mut self, t: u64, bucket: usize) -> Replay<'_> {
        let i = self.at(t, bucket);
        let latched = self.latched;
        let state = &mut self.states[i];
        match state {
            _ if latched => Replay::Walk,
            GraphState::Cold => {
                *state = GraphState::Warm;
                Replay::Walk
            }
            GraphState::Warm => Replay::Uncaptured,
            GraphState::Captured(g) => Replay::Graph(g),
        }
    }

    /// Whether the run's graph of step `t` in `bucket` is due for capture: warmed up, not
    /// captured, not latched.
    pub(super) fn due(&self, t: u64, bucket: usize) -> bool {
        !self.latched && matches!(self.states[self.at(t, bucket)], GraphState::Warm)
    }

    /// Keeps the graph captured for step `t`'s phase in `bucket`.
    pub(super) fn captured(&mut self, t: u64, bucket: usize, graph: Graph) {
        let i = self.at(t, bucket);
        self.states[i] = GraphState::Captured(graph);
    }

    /// Runs the run eagerly from now on (its capture failed).
    pub(super) fn latch(&mut self) {
        self.latched = true;
    }

    /// Whether the run was latched to eager.
    pub(super) fn latched(&self) -> bool {
        self.latched
    }

    /// Graphs captured for `bucket`, over the phases.
    pub(super) fn graphs(&self, bucket: usize) -> usize {
        (0..self.phases as usize)
            .filter(|p| {
                matches!(
                    self.states[p * self.buckets + bucket],
                    GraphState::Captured(_)
                )
            })
            .count()
    }
}

/// What an engine's steps were, for its activity line: per bucket, the decode steps and
/// their pad rows; the steps run eagerly for their prompt rows.
#[derive(Debug, Default)]
pub(super) struct Tally {
    steps: Vec<u64>,
    pad_rows: Vec<u64>,
    eager: u64,
}

impl Tally {
    /// Counts a step of `shape`.
    pub(super) fn count(&mut self, shape: &Shape) {
        let Some(b) = shape.bucket else {
            self.eager += 1;
            return;
        };
        if self.steps.len() <= b {
            self.steps.resize(b + 1, 0);
            self.pad_rows.resize(b + 1, 0);
        }
        self.steps[b] += 1;
        self.pad_rows[b] += shape.rows.padding as u64;
    }

    /// One line: per bucket its rows (`verify N` for a verify bucket), steps, pad rows and
    /// `graphs(bucket)` graphs captured; the eager steps; `latched` runs latched to eager
    /// when there are any.
    pub(super) fn line(
        &self,
        buckets: &Buckets,
        graphs: impl Fn(usize) -> usize,
        latched: usize,
    ) -> String {
        let per: Vec<String> = (0..buckets.len())
            .map(|b| {
                let of = |v: &[u64]| v.get(b).copied().unwrap_or(0);
                let rows = match buckets.rows(b) {
                    (rows, false) => rows.to_string(),
                    (rows, true) => format!("verify {rows}"),
                };
                format!(
                    "{rows}: {}, {}, {}",
                    of(&self.steps),
                    of(&self.pad_rows),
                    graphs(b)
                )
            })
            .collect();
        let latched = match latched {
            0 => String::new(),
            n => format!("; {n} runs latched to eager after a failed capture"),
        };
        format!(
            "cuda graphs of decode and verify steps by bucket (rows: steps, pad rows, graphs captured): {}; other steps with prompt or verify rows, eager: {}{latched}",
            per.join("; "),
            self.eager
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Span;

    fn step(rows_per_span: &[usize]) -> StepInput {
        StepInput::of(
            rows_per_span
                .iter()
                .enumerate()
                .map(|(slot, &n)| Span {
                    slot: slot as u32,
                    pos: 3,
                    tokens: vec![7; n],
                    logits_from: n as u32 - 1,
                })
                .collect(),
        )
    }

    #[test]
    fn buckets_double_to_32_then_step_by_32_up_to_the_widest_step() {
        let rows = |widest| Buckets::new(widest, 0).rows;
        assert_eq!(rows(1), [1]);
        assert_eq!(rows(8), [1, 2, 4, 8]);
        assert_eq!(rows(6), [1, 2, 4, 6]);
        assert_eq!(rows(64), [1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(rows(100), [1, 2, 4, 8, 16, 32, 64, 96, 100]);
        assert_eq!(rows(256).len(), 13);
    }

    #[test]
    fn a_decode_step_is_padded_in_front_to_its_bucket() {
        let b = Buckets::new(8, 0);
        let s = b.shape(&step(&[1, 1, 1]));
        assert_eq!(
            s.rows,
            Rows {
                rows: 4,
                logits_from: 0,
                padding: 1,
                decode: true,
                decode_bits: false,
            }
        );
        assert_eq!(s.bucket, Some(2));
        assert_eq!(s.logit_rows, [0, 1, 2, 3]);
        assert_eq!(s.rows.out(), 4);
        assert_eq!(s.rows.returned(), 3);
        let exact = b.shape(&step(&[1; 8]));
        assert_eq!((exact.rows.rows, exact.rows.padding), (8, 0));
        assert_eq!(exact.bucket, Some(3));
    }

    #[test]
    fn a_step_with_prompt_rows_runs_eagerly_as_it_is() {
        let b = Buckets::new(8, 0);
        let s = b.shape(&step(&[1, 3, 1]));
        assert_eq!(s.bucket, None);
        assert_eq!(
            s.rows,
            Rows {
                rows: 5,
                logits_from: 2,
                padding: 0,
                decode: false,
                decode_bits: false,
            }
        );
        assert_eq!(s.logit_rows, [0, 3, 4]);
        assert_eq!(s.rows.returned(), 3);
    }

    #[test]
    fn one_sequence_decodes_in_the_one_bucket_and_prefills_eagerly() {
        let b = Buckets::new(1, 0);
        let decode = b.shape(&StepInput::sampled(9));
        let one = Rows {
            rows: 1,
            logits_from: 0,
            padding: 0,
            decode: true,
            decode_bits: false,
        };
        assert_eq!((decode.rows, decode.bucket), (one, Some(0)));
        let prefill = b.shape(&StepInput::prompt(0, &[1, 2, 3, 4], 3));
        assert_eq!(prefill.bucket, None);
        assert_eq!((prefill.rows.rows, prefill.rows.logits_from), (4, 3));
        assert!(!prefill.rows.decode_bits);
        // a verify step: eager, every row's logits, on the batched decode kernels
        let verify = b.shape(&StepInput::verify(5, &[1, 2, 3, 4]));
        assert_eq!((verify.bucket, verify.logit_rows.len()), (None, 4));
        assert!(verify.rows.decode_bits && !verify.rows.decode);
        // with no drafts, a plain decode step
        let one = b.shape(&StepInput::verify(5, &[1]));
        assert_eq!((one.bucket, one.rows.decode_bits), (Some(0), false));
    }

    #[test]
    fn a_verify_step_of_one_sequence_takes_the_verify_bucket_of_its_rows() {
        // a speculative plan of 3 drafts: decode buckets 1, 2, 4, then verify 2, 3, 4
        let b = Buckets::new(4, 4);
        assert_eq!(b.len(), 6);
        assert_eq!(
            (b.rows(2), b.rows(3), b.rows(5)),
            ((4, false), (2, true), (4, true))
        );
        let verify = b.shape(&StepInput::verify(5, &[1, 2, 3]));
        assert_eq!(verify.bucket, Some(4));
        assert_eq!(verify.logit_rows, [0, 1, 2]);
        let want = Rows {
            rows: 3,
            logits_from: 0,
            padding: 0,
            decode: false,
            decode_bits: true,
        };
        assert_eq!(verify.rows, want);
        // a prompt chunk of the same rows, and a verify span beside another sequence: eager
        assert_eq!(b.shape(&StepInput::prompt(0, &[1, 2, 3], 0)).bucket, None);
        let spans = [
            StepInput::verify(5, &[1, 2, 3]).spans[0].clone(),
            step(&[1]).spans[0].clone(),
        ];
        let beside = StepInput {
            decode_bits: true,
            ..StepInput::of(spans.to_vec())
        };
        assert_eq!(b.shape(&beside).bucket, None);
        // wider than the plan's drafts: eager
        assert_eq!(
            b.shape(&StepInput::verify(5, &[1, 2, 3, 4, 5])).bucket,
            None
        );
    }

    #[test]
    fn a_run_warms_up_once_per_phase_and_bucket_then_is_due_until_latched() {
        let mut run = RunGraphs::new(2, 3);
        assert!(matches!(run.enter(4, 1), Replay::Walk));
        // phase 0 of bucket 1 is due; the other phase and buckets are still cold
        assert!(run.due(6, 1) && !run.due(5, 1) && !run.due(6, 2));
        assert!(matches!(run.enter(8, 1), Replay::Uncaptured));
        assert_eq!(run.graphs(1), 0);
        run.latch();
        assert!(!run.due(6, 1) && run.latched());
        assert!(matches!(run.enter(6, 1), Replay::Walk));
    }

    #[test]
    fn the_tally_counts_steps_and_pad_rows_per_bucket() {
        let b = Buckets::new(4, 0);
        let mut tally = Tally::default();
        for spans in [&[1, 1, 1][..], &[1, 1, 1], &[1], &[2, 1]] {
            tally.count(&b.shape(&step(spans)));
        }
        assert_eq!(
            tally.line(&b, |bucket| usize::from(bucket == 2), 0),
            "cuda graphs of decode and verify steps by bucket (rows: steps, pad rows, graphs captured): 1: 1, 0, 0; 2: 0, 0, 0; 4: 2, 2, 1; other steps with prompt or verify rows, eager: 1"
        );
    }
}
