//! Several sequences decoding together on one engine (continuous batching). Each sequence
//! holds a sequence slot (its region of every KV cache, `runtime.max_sequences` of them) and
//! the tokens its caches hold there. A `step` advances every sequence that has tokens to
//! decode in one engine step: the generating sequences first (one row each: the token the
//! host sampled and fed; taking turns when an engine takes fewer rows per step than there
//! are sequences), then the prompts of joining sequences, in the order they joined, as
//! chunks that fill the rest of the engine's rows per step. Sequences join (`join`) and
//! leave (`leave`) between steps. With the pipelined arm of a plan of several stages, that
//! many steps are in flight, each over its own group of the sequences, so the stages work
//! on different sequences at once (`window`). The host samples each sequence's next token from the
//! logits its step returns, so every sequence keeps its own sampler.
//!
//! A slot is never cleared: a row attends only to its own slot's rows up to its position,
//! all written by its own sequence. A joining prompt takes the free slot whose cached tokens
//! share the longest prefix with it and decodes only the rest.
//!
//! Speculative decoding (`verify`): a generating sequence may be fed its token with drafted
//! tokens after it. Its span then goes into a step whole, brings back every row's logits,
//! and once the host knows how many drafts it accepted (`accept`), the rejected ones leave
//! the slot's history; the next span writes their positions again (a recurrent state returns
//! to the last accepted row's, which the engine kept).

use std::collections::VecDeque;

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::Plan;

use crate::engine::{Arm, Decoder, Readback, Span, StepInput};
use crate::session::common_prefix;

/// An engine decoding up to its plan's `runtime.max_sequences` sequences together.
pub struct Batch {
    engine: Box<dyn Decoder>,
    slots: Vec<Slot>,
    max_rows: usize,
    /// Most steps in flight.
    window: usize,
    /// The spans of the steps in flight, oldest first.
    flying: VecDeque<(Vec<Span>, Readback)>,
    joins: u64,
    steps: u64,
}

/// One sequence slot.
#[derive(Default)]
struct Slot {
    /// Tokens at positions `0..len` of the slot's caches.
    history: Vec<u32>,
    /// Tokens fed and not decoded yet.
    pending: Vec<u32>,
    /// When the sequence holding the slot joined; `None`: the slot is free.
    joined: Option<u64>,
    /// The last step that carried the slot's rows.
    stepped: u64,
    /// Whether a step in flight carries the slot's rows.
    flying: bool,
    /// Whether the sequence picks its tokens greedily (`Batch::greedy`).
    greedy: bool,
    /// Drafted tokens at the end of `pending` (`Batch::verify`), then, once stepped, at the
    /// end of `history` until `Batch::accept`.
    drafts: usize,
}

impl Slot {
    /// Drops the drafts at the end of the history, which the host did not accept.
    fn drop_drafts(&mut self) {
        let keep = self.history.len() - self.drafts;
        self.history.truncate(keep);
        self.drafts = 0;
    }
}

/// What one engine step gave back.
#[derive(Debug, Default)]
pub struct Stepped {
    /// Sequences the step carried.
    pub sequences: usize,
    /// Each sequence whose fed tokens are all decoded now, in slot order.
    pub done: Vec<Decoded>,
    /// The step's logits: a row of `vocab` values per sequence it carried (a verify span's
    /// every row), as the engine returned them (kept whole, not copied per sequence); empty in a step of greedy
    /// sequences only (`Batch::greedy`).
    logits: Vec<f32>,
    vocab: usize,
    /// In a step of greedy sequences only, each row's argmax; else empty.
    argmax: Vec<u32>,
}

/// A sequence a step decoded all its fed tokens of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decoded {
    /// The sequence's slot.
    pub slot: usize,
    /// Its last row of the step's logits.
    row: usize,
    /// Its rows of logits: one, or a verify span's every row (its token, then each draft).
    pub rows: usize,
}

impl Stepped {
    /// The logits after the last token fed to sequence `d`; `None` in a step of greedy
    /// sequences only, which brings back their argmaxes instead.
    pub fn logits(&self, d: &Decoded) -> Option<&[f32]> {
        self.row_logits(d, d.rows - 1)
    }

    /// The logits of row `i` of sequence `d`'s rows (`Decoded::rows`): after its token and
    /// its first `i` drafts.
    pub fn row_logits(&self, d: &Decoded, i: usize) -> Option<&[f32]> {
        if self.logits.is_empty() || i >= d.rows {
            return None;
        }
        let row = d.row + 1 + i - d.rows;
        Some(&self.logits[row * self.vocab..(row + 1) * self.vocab])
    }

    /// The greedy token after the last token fed to sequence `d`: the argmax of its logits,
    /// taken by the engine in a step of greedy sequences only; an error where a logit is NaN
    /// or infinite (a NaN weight, an overflow), which no token may hide.
    pub fn argmax(&self, d: &Decoded) -> Result<u32> {
        let token = match (self.argmax.get(d.row), self.logits(d)) {
            (Some(&token), _) => token,
            (None, Some(logits)) => crate::sample::greedy(logits),
            (None, None) => unreachable!("invariant: a step brings back logits or argmaxes"),
        };
        if token == crate::sample::NOT_FINITE {
            bail!(
                "the model's logits are not finite (a NaN or an infinity in slot {}'s row): a weight or an activation holds NaN or infinity",
                d.slot
            );
        }
        Ok(token)
    }
}

impl Batch {
    /// `engine` with `sequences` slots (its plan's `runtime.max_sequences`), keeping up to
    /// `window` steps in flight (see `window`).
    pub fn new(engine: impl Decoder + 'static, sequences: usize, window: usize) -> Batch {
        let max_rows = engine.prompt_mode().rows().max(1) as usize;
        Batch {
            engine: Box::new(engine),
            slots: (0..sequences.max(1)).map(|_| Slot::default()).collect(),
            max_rows,
            window: window.max(1),
            flying: VecDeque::new(),
            joins: 0,
            steps: 0,
        }
    }

    /// The sequence in `slot` picks its tokens greedily (`Stepped::argmax`) and needs no
    /// logits: a step whose sequences all do brings back each one's argmax, taken where the
    /// engine computed the logits, and leaves the logits there.
    pub fn greedy(&mut self, slot: usize) -> Result<()> {
        self.held(slot)?.greedy = true;
        Ok(())
    }

    /// How the engine ran its steps so far (`Decoder::activity`).
    pub fn activity(&self) -> Vec<String> {
        self.engine.activity()
    }

    /// Sequence slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots held by a sequence.
    pub fn used(&self) -> usize {
        self.slots.iter().filter(|s| s.joined.is_some()).count()
    }

    /// A new sequence with prompt `tokens` takes a free slot: the one whose cached tokens
    /// share the longest prefix with the prompt (the lowest of equals). `None` when every
    /// slot is taken.
    pub fn join(&mut self, tokens: &[u32]) -> Result<Option<usize>> {
        if tokens.is_empty() {
            bail!("the prompt is empty; at least one token is needed");
        }
        let best = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.joined.is_none() && !s.flying)
            .max_by_key(|&(i, s)| (self.reuse(&s.history, tokens), std::cmp::Reverse(i)));
        let Some((slot, _)) = best else {
            return Ok(None);
        };
        let common = self.reuse(&self.slots[slot].history, tokens);
        let s = &mut self.slots[slot];
        s.history.truncate(common);
        s.pending = tokens[common..].to_vec();
        s.joined = Some(self.joins);
        s.greedy = false;
        self.joins += 1;
        Ok(Some(slot))
    }

    /// The tokens of `history` a sequence with prompt `tokens` reuses.
    fn reuse(&self, history: &[u32], tokens: &[u32]) -> usize {
        common_prefix(history, tokens, self.engine.rewinds())
    }

    /// Feeds the token the host picked for the sequence in `slot`: its next step decodes it.
    pub fn feed(&mut self, slot: usize, token: u32) -> Result<()> {
        self.verify(slot, token, &[])
    }

    /// Feeds `token` and the tokens `drafts` drafted after it to the sequence in `slot`, whose
    /// fed tokens are all decoded: its next step verifies them, one span of every row (at
    /// most the engine's rows per step), each row's logits brought back. After it, `accept`
    /// says how many drafts the host took.
    pub fn verify(&mut self, slot: usize, token: u32, drafts: &[u32]) -> Result<()> {
        let max_rows = self.max_rows;
        let s = self.held(slot)?;
        if s.drafts > 0 {
            bail!("sequence slot {slot}: its last drafts were not accepted or rejected yet (Batch::accept)");
        }
        if !drafts.is_empty() && (!s.pending.is_empty() || drafts.len() + 1 > max_rows) {
            bail!(
                "sequence slot {slot}: a verify span of {} rows needs every fed token decoded and at most the engine's {max_rows} rows per step",
                drafts.len() + 1
            );
        }
        s.pending.push(token);
        s.pending.extend_from_slice(drafts);
        s.drafts = drafts.len();
        Ok(())
    }

    /// The host took the first `accepted` drafts of the verify span the last step decoded for
    /// the sequence in `slot`: the rest leave its history, so the next span takes their
    /// positions again.
    pub fn accept(&mut self, slot: usize, accepted: usize) -> Result<()> {
        let s = self.held(slot)?;
        if accepted > s.drafts || !s.pending.is_empty() || s.flying {
            bail!(
                "sequence slot {slot}: {accepted} drafts accepted of a decoded span of {}",
                s.drafts
            );
        }
        s.drafts -= accepted;
        s.drop_drafts();
        Ok(())
    }

    /// The sequence in `slot` leaves; its tokens not decoded yet are dropped, and so are its
    /// drafts not yet accepted.
    pub fn leave(&mut self, slot: usize) -> Result<()> {
        let s = self.held(slot)?;
        // drafts still pending go with them; decoded ones leave the history (in flight: when
        // their step lands)
        if !s.flying {
            if s.pending.is_empty() {
                s.drop_drafts();
            } else {
                s.drafts = 0;
            }
        }
        s.pending.clear();
        s.joined = None;
        Ok(())
    }

    fn held(&mut self, slot: usize) -> Result<&mut Slot> {
        self.slots
            .get_mut(slot)
            .filter(|s| s.joined.is_some())
            .ok_or_else(|| anyhow!("sequence slot {slot} holds no sequence"))
    }

    /// Runs the next engine step and returns what it gave back. Before, it submits steps
    /// until the window is full, each over sequences with tokens to decode and none in
    /// flight: one step of them all with a window of one, else about an equal share of them
    /// per free place in the window. With nothing to decode it returns an empty step.
    pub fn step(&mut self) -> Result<Stepped> {
        while self.flying.len() < self.window {
            let Some(spans) = self.next_spans() else {
                break;
            };
            let readback = if spans.iter().all(|s| self.slots[s.slot as usize].greedy) {
                Readback::Argmax
            } else {
                Readback::Logits
            };
            // a verify span's rows stand for decode steps: they need decode's bits
            let decode_bits = spans
                .iter()
                .any(|sp| self.slots[sp.slot as usize].drafts > 0);
            self.engine.submit(StepInput {
                decode_bits,
                ..StepInput::of(spans.clone()).reading(readback)
            })?;
            for span in &spans {
                let s = &mut self.slots[span.slot as usize];
                s.pending.drain(..span.tokens.len());
                s.flying = true;
            }
            self.flying.push_back((spans, readback));
        }
        let Some((spans, readback)) = self.flying.pop_front() else {
            return Ok(Stepped::default());
        };
        let out = self.engine.next_output()?;
        self.steps += 1;
        // a row of logits per span, or every row of a verify span's
        let rows: usize = spans
            .iter()
            .map(|s| (s.rows() - s.logits_from) as usize)
            .sum();
        let complete = match readback {
            Readback::Logits => !out.logits.is_empty() && out.logits.len() % rows == 0,
            Readback::Argmax => out.argmax.len() == spans.len(),
        };
        if !complete {
            let want = match readback {
                Readback::Logits => "a row of logits",
                Readback::Argmax => "an argmax",
            };
            bail!(
                "a batched step of {} sequences returned {} logits and {} argmaxes where each sequence needs {want}; batching needs the process holding the readback rank",
                spans.len(),
                out.logits.len(),
                out.argmax.len()
            );
        }
        let vocab = out.logits.len() / rows;
        let mut done = Vec::new();
        let mut row = 0;
        for (i, span) in spans.iter().enumerate() {
            let slot = span.slot as usize;
            let s = &mut self.slots[slot];
            // the cache holds the rows even of a sequence that left meanwhile, but not the
            // drafts it can no longer accept
            s.history.extend_from_slice(&span.tokens);
            s.stepped = self.steps;
            s.flying = false;
            if s.joined.is_none() {
                s.drop_drafts();
            }
            let n = (span.rows() - span.logits_from) as usize;
            row += n;
            if s.pending.is_empty() && s.joined.is_some() {
                // an argmax step brings back one value per span
                let last = if out.argmax.is_empty() { row - 1 } else { i };
                done.push(Decoded {
                    slot,
                    row: last,
                    rows: if out.argmax.is_empty() { n } else { 1 },
                });
            }
        }
        done.sort_by_key(|d| d.slot);
        Ok(Stepped {
            sequences: spans.len(),
            done,
            logits: out.logits,
            vocab,
            argmax: out.argmax,
        })
    }

    /// The spans of the next step to submit, `None` when no sequence is ready.
    fn next_spans(&self) -> Option<Vec<Span>> {
        let mut ready: Vec<usize> = (0..self.slots.len())
            .filter(|&i| !self.slots[i].pending.is_empty() && !self.slots[i].flying)
            .collect();
        if ready.is_empty() {
            return None;
        }
        // generating sequences (one token pending) first, the longest waiting first (when
        // fewer rows than sequences fit a step, they take turns), then prompts in joining
        // order
        ready.sort_by_key(|&i| {
            let s = &self.slots[i];
            match s.pending.len() - s.drafts {
                1 => (false, s.stepped, s.joined),
                _ => (true, 0, s.joined),
            }
        });
        let share = ready.len().div_ceil(self.window - self.flying.len());
        let mut spans = Vec::new();
        let mut room = self.max_rows;
        for i in ready.into_iter().take(share) {
            if room == 0 {
                break;
            }
            let s = &self.slots[i];
            // a verify span goes whole or waits for a step with room for it
            if s.drafts > 0 && s.pending.len() > room {
                continue;
            }
            let rows = s.pending.len().min(room);
            room -= rows;
            spans.push(Span {
                slot: i as u32,
                pos: s.history.len() as u32,
                tokens: s.pending[..rows].to_vec(),
                logits_from: if s.drafts > 0 { 0 } else { rows as u32 - 1 },
            });
        }
        Some(spans)
    }
}

/// Steps a batch keeps in flight on `plan` in `arm`: with the pipelined arm one per pipeline
/// stage (at most the plan's `runtime.in_flight`), so every stage works on its own group of
/// sequences at once; the serial arm runs its steps one at a time anyway.
pub fn window(plan: &Plan, arm: Arm) -> usize {
    let stages = plan.ranks.iter().map(|r| r.stage + 1).max().unwrap_or(1);
    match arm {
        Arm::Serial => 1,
        Arm::Pipelined => stages.min(plan.runtime.in_flight).max(1) as usize,
    }
}
