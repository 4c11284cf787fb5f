//! Several sequences decoding together on one engine (continuous batching). Each sequence
//! holds a sequence slot (its region of every KV cache, `runtime.max_sequences` of them) and
//! the tokens its caches hold there. A `step` advances every sequence that has tokens to
//! decode in one engine step: the generating sequences first (one row each: the token the
//! host sampled and fed; taking turns when an engine takes fewer rows per step than there
//! are sequences), then the prompts of joining sequences, in the order they joined, as
//! chunks that fill the rest of the engine's rows per step. Sequences join (`join`) and
//! leave (`leave`) between steps. The host samples each sequence's next token from the
//! logits its step returns, so every sequence keeps its own sampler.
//!
//! A slot is never cleared: a row attends only to its own slot's rows up to its position,
//! all written by its own sequence. A joining prompt takes the free slot whose cached tokens
//! share the longest prefix with it and decodes only the rest.

use anyhow::{anyhow, bail, Result};

use crate::engine::{Decoder, Span, StepInput};
use crate::session::common_prefix;

/// An engine decoding up to its plan's `runtime.max_sequences` sequences together.
pub struct Batch {
    engine: Box<dyn Decoder>,
    slots: Vec<Slot>,
    max_rows: usize,
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
}

/// What a step gave one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotLogits {
    /// The sequence's slot.
    pub slot: usize,
    /// The logits after the last token fed to it.
    pub logits: Vec<f32>,
}

impl Batch {
    /// `engine` with `sequences` slots (its plan's `runtime.max_sequences`).
    pub fn new(engine: impl Decoder + 'static, sequences: usize) -> Batch {
        let max_rows = engine.prompt_mode().rows().max(1) as usize;
        Batch {
            engine: Box::new(engine),
            slots: (0..sequences.max(1)).map(|_| Slot::default()).collect(),
            max_rows,
            joins: 0,
            steps: 0,
        }
    }

    /// Sequence slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots held by a sequence.
    pub fn used(&self) -> usize {
        self.slots.iter().filter(|s| s.joined.is_some()).count()
    }

    /// Whether a step has rows to decode.
    pub fn has_work(&self) -> bool {
        self.slots.iter().any(|s| !s.pending.is_empty())
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
            .filter(|(_, s)| s.joined.is_none())
            .max_by_key(|&(i, s)| (self.reuse(&s.history, tokens), std::cmp::Reverse(i)));
        let Some((slot, _)) = best else {
            return Ok(None);
        };
        let common = self.reuse(&self.slots[slot].history, tokens);
        let s = &mut self.slots[slot];
        s.history.truncate(common);
        s.pending = tokens[common..].to_vec();
        s.joined = Some(self.joins);
        self.joins += 1;
        Ok(Some(slot))
    }

    /// The tokens of `history` a sequence with prompt `tokens` reuses.
    fn reuse(&self, history: &[u32], tokens: &[u32]) -> usize {
        common_prefix(history, tokens, self.engine.rewinds())
    }

    /// Feeds the token the host picked for the sequence in `slot`: its next step decodes it.
    pub fn feed(&mut self, slot: usize, token: u32) -> Result<()> {
        let s = self.held(slot)?;
        s.pending.push(token);
        Ok(())
    }

    /// The sequence in `slot` leaves; its tokens not decoded yet are dropped.
    pub fn leave(&mut self, slot: usize) -> Result<()> {
        let s = self.held(slot)?;
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

    /// Runs one engine step over the sequences with tokens to decode and returns the logits
    /// of each whose fed tokens are all decoded now, in slot order. A step with nothing to
    /// decode returns nothing.
    pub fn step(&mut self) -> Result<Vec<SlotLogits>> {
        let mut order: Vec<usize> = (0..self.slots.len())
            .filter(|&i| !self.slots[i].pending.is_empty())
            .collect();
        // generating sequences (one token pending) first, the longest waiting first (when
        // fewer rows than sequences fit a step, they take turns), then prompts in joining
        // order
        order.sort_by_key(|&i| {
            let s = &self.slots[i];
            match s.pending.len() {
                1 => (false, s.stepped, s.joined),
                _ => (true, 0, s.joined),
            }
        });
        let mut spans = Vec::new();
        let mut room = self.max_rows;
        for i in order {
            if room == 0 {
                break;
            }
            let s = &self.slots[i];
            let rows = s.pending.len().min(room);
            room -= rows;
            spans.push(Span {
                slot: i as u32,
                pos: s.history.len() as u32,
                tokens: s.pending[..rows].to_vec(),
                logits_from: rows as u32 - 1,
            });
        }
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let out = self.engine.step(StepInput::of(spans.clone()))?;
        self.steps += 1;
        if out.logits.is_empty() || out.logits.len() % spans.len() != 0 {
            bail!(
                "a batched step returned {} logits for {} sequences; batching needs the process holding the readback rank",
                out.logits.len(),
                spans.len()
            );
        }
        let vocab = out.logits.len() / spans.len();
        let mut done = Vec::new();
        for (span, logits) in spans.iter().zip(out.logits.chunks_exact(vocab)) {
            let slot = span.slot as usize;
            let s = &mut self.slots[slot];
            let rows = span.tokens.len();
            s.history.extend(s.pending.drain(..rows));
            s.stepped = self.steps;
            if s.pending.is_empty() {
                done.push(SlotLogits {
                    slot,
                    logits: logits.to_vec(),
                });
            }
        }
        done.sort_by_key(|d| d.slot);
        Ok(done)
    }
}
