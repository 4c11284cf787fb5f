//! `bench` of a plan with `[speculative]`: after the plain decode runs, the same engine
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

/// Decodes `ids` and then `n - 1` tokens after the first (the plain runs' `continuation`,
/// `n` tokens) by speculative decoding on `session`, one warm-up and `reps` timed runs, as
/// plain decoding's runs time them: the tokens after the first over their time. Fails when
/// a run's tokens are not the plain greedy continuation.
pub(super) fn measure(
    session: Session,
    sp: Speculative,
    (ids, continuation): (&[u32], &[u32]),
    replay: Option<usize>,
    reps: usize,
) -> Result<Measured> {
    let k = sp.tokens as usize;
    let (drafts, name) = match replay {
        None => (Drafts::Lookup, sp.draft.name().to_string()),
        Some(cut) => (
            Drafts::Replay {
                tokens: [ids, continuation].concat(),
                cut,
            },
            format!("replay cut at {}", cut.min(k)),
        ),
    };
    let sampler = Sampler::new(SamplerConfig::GREEDY);
    let mut session = session.speculating(k, drafts, sampler);
    let mut rates = Vec::new();
    let mut tally = Tally::default();
    for rep in 0..=reps {
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
        if rep > 0 {
            rates.push(generated.len() as f64 / secs.max(1e-9));
            let after = session.tally().unwrap_or_default();
            tally.add(Tally {
                steps: after.steps - before.steps,
                drafted: after.drafted - before.drafted,
                accepted: after.accepted - before.accepted,
            });
        }
    }
    Ok(Measured {
        drafts: name,
        tok_s: mean_sd(&rates),
        tally,
    })
}
