//! Speculative decoding on any engine: each step verifies the tokens a draft source proposes
//! in one step of one sequence's consecutive positions (the last emitted token, then the
//! drafts), a `StepInput::verify` step whose rows must have decode's bits, so row `i`'s
//! logits are the ones a one-token step at its position gives. The sampler takes the drafts row after row while
//! it accepts them, then one token of its own: greedy, exactly plain decoding's tokens and
//! logits; sampled, plain sampling's distribution (`Sampler::verify`).
//!
//! A rejected draft leaves no trace: the KV rows past the accepted ones are written again by
//! the next step, and a recurrent (KDA) state returns to the last accepted row's (the engine
//! keeps each verify row's state).

mod lookup;

use anyhow::{bail, Result};

use crate::engine::{Decoder, StepInput};
use crate::sample::Sampler;
use crate::session::Flow;
pub use lookup::lookup;

/// Where a step's drafts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drafts {
    /// Prompt lookup (`lookup`) over the context: the prompt and the tokens generated so far.
    Lookup,
    /// A fixed sequence: after a context of `n` tokens, the draft is `tokens[n..]`, at most
    /// `cut` a step. The model's own greedy sequence is accepted whole (a draft of
    /// acceptance 100%, cut at the lengths whose verify cost is measured); other tokens are
    /// rejected (the tests' drafts that must leave no trace).
    Replay { tokens: Vec<u32>, cut: usize },
}

impl Drafts {
    /// At most `k` drafts after `context`.
    fn propose(&self, context: &[u32], k: usize) -> Vec<u32> {
        match self {
            Drafts::Lookup => lookup(context, k),
            Drafts::Replay { tokens, cut } => {
                let from = context.len().min(tokens.len());
                tokens[from..(from + k.min(*cut)).min(tokens.len())].to_vec()
            }
        }
    }
}

/// What speculation did over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Verify steps (each emits the accepted drafts and one token more).
    pub steps: u64,
    /// Drafted tokens.
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
}

impl Tally {
    /// Mean accepted drafts per verify step (the acceptance length); 0 before any step.
    pub fn acceptance_length(&self) -> f64 {
        self.accepted as f64 / (self.steps.max(1)) as f64
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: Tally) {
        self.steps += other.steps;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
    }
}

/// One speculative run: a context, and how to continue it.
pub struct Run<'a> {
    /// The tokens before generation: the first `cached` are in the engine's caches already
    /// (sequence slot 0), the rest are the prompt to feed.
    pub context: &'a [u32],
    pub cached: usize,
    /// Most tokens to generate.
    pub max_new: usize,
    /// Positions the caches hold (the plan's `runtime.max_context`).
    pub max_context: usize,
    /// Most drafts per verify step (the plan's `speculative.tokens`).
    pub tokens: usize,
    pub drafts: &'a Drafts,
}

/// What a run gave: the generated tokens and the speculation counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spoken {
    pub generated: Vec<u32>,
    pub tally: Tally,
}

/// Decodes `run` on `engine` (nothing in flight): its prompt as prefill steps, then verify
/// steps of drafts. `on_token` sees each generated token with its logits, in order, and may
/// stop generation. Generation ends at `max_new` tokens or where the context is full (the
/// last generated token needs no position, as in plain decoding).
pub fn speculate(
    engine: &mut dyn Decoder,
    run: Run,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32, &[f32]) -> Result<Flow>,
) -> Result<Spoken> {
    let Run {
        context,
        cached,
        max_new,
        max_context,
        tokens: k,
        drafts,
    } = run;
    if cached >= context.len() {
        bail!("the prompt is empty; at least one token is needed");
    }
    if context.len() > max_context {
        bail!(
            "{} tokens of context do not fit the plan's runtime.max_context of {max_context} positions",
            context.len()
        );
    }
    let chunk = engine.prompt_mode().rows().max(1) as usize;
    if k + 1 > chunk {
        bail!(
            "a verify step of {k} drafts takes {} rows; the engine takes at most {chunk} per step",
            k + 1
        );
    }
    let mut spoken = Spoken::default();
    if max_new == 0 {
        return Ok(spoken);
    }
    // the prompt: prefill steps, the last row's logits give the first token
    let mut logits = Vec::new();
    let mut next = cached;
    while next < context.len() {
        let rows = chunk.min(context.len() - next);
        let last = (rows - 1) as u32;
        let out = engine.step(StepInput::prompt(
            next as u32,
            &context[next..next + rows],
            last,
        ))?;
        (next, logits) = (next + rows, out.logits);
    }
    if logits.is_empty() {
        bail!("speculative decoding needs the logits of every step in this process; run it in one process (not under launch)");
    }
    let mut all = context.to_vec();
    let mut token = sampler.sample(&logits);
    loop {
        spoken.generated.push(token);
        all.push(token);
        // `token` sits at position `n` once a step embeds it
        let n = all.len() - 1;
        let left = max_new - spoken.generated.len();
        if on_token(token, &logits)? == Flow::Stop || left == 0 || n >= max_context {
            return Ok(spoken);
        }
        let room = k.min(max_context - 1 - n).min(left - 1);
        let draft = drafts.propose(&all, room);
        let mut rows = Vec::with_capacity(draft.len() + 1);
        rows.push(token);
        rows.extend_from_slice(&draft);
        let out = engine.step(StepInput::verify(n as u32, &rows))?;
        let vocab = out.logits.len() / rows.len();
        if vocab == 0 || out.logits.len() != vocab * rows.len() {
            bail!(
                "a verify step of {} rows returned {} logits",
                rows.len(),
                out.logits.len()
            );
        }
        spoken.tally.steps += 1;
        spoken.tally.drafted += draft.len() as u64;
        // every accepted draft is emitted from the row before it; the first token that is
        // not a draft (a rejection's, or the one after all drafts) ends the step
        let row = |i: usize| &out.logits[i * vocab..(i + 1) * vocab];
        let mut i = 0;
        token = loop {
            if i == draft.len() {
                break sampler.sample(row(i));
            }
            let picked = sampler.verify(row(i), draft[i]);
            if picked != draft[i] {
                break picked;
            }
            spoken.tally.accepted += 1;
            spoken.generated.push(picked);
            all.push(picked);
            let left = max_new - spoken.generated.len();
            if on_token(picked, row(i))? == Flow::Stop || left == 0 {
                return Ok(spoken);
            }
            i += 1;
        };
        logits = row(i).to_vec();
    }
}
