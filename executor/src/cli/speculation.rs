//! `bench` of a plan with `[speculative]`: after each plain decode run, the same engine
//! decodes the same prompt by speculative decoding, and the acceptance length and tok/s are
//! reported beside plain decoding's. `--draft-replay N` drafts the plain runs' own greedy
//! continuation instead of looking drafts up, cut at N per step: acceptance 100%, so the
//! tok/s over N draws the verify step's cost against the acceptance length.

use std::time::Instant;

use anyhow::{bail, Result};
use memra_compiler::plan::Speculative;

use super::tools::mean_sd;
use crate::sample::{Sampler, SamplerConfig};
use crate::session::{Flow, Session};
use crate::speculate::{Drafts, Tally};

/// What the speculative runs measured.
pub(super) struct Measured {
    /// The draft source, as the report names it.
    pub drafts: String,
    /// Decode tok/s, mean and sd over the timed runs.
    pub tok_s: (f64, f64),
    /// Over the timed runs.
    pub tally: Tally,
}

impl Measured {
    /// The result as a line of text, or a JSON object, beside plain decoding's `plain` tok/s
    /// on a plan of up to `k` drafts a step.
    pub fn report(&self, json: bool, k: u32, plain: f64) -> String {
        let t = self.tally;
        let (steps, drafted, accepted) = (t.steps, t.drafted, t.accepted);
        let (length, (tok_s, sd)) = (t.acceptance_length(), self.tok_s);
        let (drafts, speedup) = (&self.drafts, tok_s / plain);
        if json {
            format!("{{\"speculative\": {{\"drafts\": {drafts:?}, \"tokens\": {k}, \"steps\": {steps}, \"drafted\": {drafted}, \"accepted\": {accepted}, \"acceptance_length\": {length:.3}, \"tok_s\": {tok_s:.2}, \"tok_s_sd\": {sd:.2}, \"plain_tok_s\": {plain:.2}, \"speedup\": {speedup:.3}}}}}")
        } else {
            format!("speculative ({drafts}, up to {k} drafts a step): acceptance length {length:.2} ({accepted} of {drafted} drafts in {steps} steps), {tok_s:.1} ± {sd:.1} tok/s, {speedup:.2}x plain decoding's {plain:.1}")
        }
    }
}

/// The speculative runs of a bench, each right after a plain run of the same prompt (so the
/// machine's load changes both alike).
pub(super) struct SpeculativeRuns {
    sp: Speculative,
    replay: Option<usize>,
    rates: Vec<f64>,
    tally: Tally,
}

impl SpeculativeRuns {
    /// Runs of `sp`'s drafts, or with `replay`, of the plain continuation cut at that many.
    pub fn new(sp: Speculative, replay: Option<usize>) -> SpeculativeRuns {
        SpeculativeRuns {
            sp,
            replay,
            rates: Vec::new(),
            tally: Tally::default(),
        }
    }

    /// `session` speculating with these runs' drafts; `continuation` is the plain runs'
    /// greedy continuation of `ids`.
    pub fn session(&self, session: Session, ids: &[u32], continuation: &[u32]) -> Session {
        let drafts = match self.replay {
            None => Drafts::Lookup,
            Some(cut) => Drafts::Replay {
                tokens: [ids, continuation].concat(),
                cut,
            },
        };
        let greedy = Sampler::new(SamplerConfig::GREEDY);
        session.speculating(self.sp.tokens as usize, drafts, greedy)
    }

    /// One run on the speculating `session`: `ids` and its first token plainly, then the
    /// rest of the plain runs' `continuation` (`n` tokens) by speculative decoding, timed as
    /// plain decoding's runs are (the tokens after the first over their time) when `timed`.
    /// Fails when the tokens are not the plain greedy continuation.
    pub fn run(
        &mut self,
        session: &mut Session,
        ids: &[u32],
        continuation: &[u32],
        timed: bool,
    ) -> Result<()> {
        session.reset();
        let first = session.run(ids, 1, ids.len() - 1, |_, _| Ok(Flow::Continue))?;
        let context = [ids, &first].concat();
        let before = session.tally().unwrap_or_default();
        let decode = Instant::now();
        let n = continuation.len() - 1;
        let generated = session.continue_with(&context, n, |_, _| Ok(Flow::Continue))?;
        let secs = decode.elapsed().as_secs_f64();
        if [&first[..], &generated].concat() != continuation {
            bail!("speculative decoding's greedy tokens differ from plain decoding's");
        }
        if timed {
            self.rates.push(generated.len() as f64 / secs.max(1e-9));
            let after = session.tally().unwrap_or_default();
            self.tally.add(Tally {
                steps: after.steps - before.steps,
                drafted: after.drafted - before.drafted,
                accepted: after.accepted - before.accepted,
            });
        }
        Ok(())
    }

    /// What the timed runs measured.
    pub fn measured(&self) -> Measured {
        let drafts = match self.replay {
            None => self.sp.draft.name().to_string(),
            Some(cut) => format!("replay cut at {}", cut.min(self.sp.tokens as usize)),
        };
        Measured {
            drafts,
            tok_s: mean_sd(&self.rates),
            tally: self.tally,
        }
    }
}
