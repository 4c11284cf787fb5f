//! The bit-identity gate: decode the same prompt with a plan and with the 1-rank plan of the
//! same model, in every arm, and compare every logit bit of every step. The first mismatch is
//! named by arm, step and vocabulary index.
//!
//! With one process per device, every process decodes the candidate in every arm; only the
//! process holding its readback rank has logits, so it alone decodes the 1-rank reference
//! (in one process, outside the world) and compares. Every arm runs even after a mismatch,
//! since the other processes cannot know of it and wait for their peers in the next arm.

use std::fmt;

use anyhow::{bail, Result};

use crate::engine::{open, Arm, EngineOptions, StepOutput};
use crate::plan_load::LoadedPlan;
use crate::sample::SamplerConfig;
use crate::session::{Flow, Session};

/// The first difference found between the reference and a candidate run.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// The arm of the candidate run.
    pub arm: Arm,
    /// Row of the run: a prompt token's, then a generated token's (the decode step when the
    /// prompt runs token by token).
    pub step: u64,
    /// What differs: a logit's vocabulary index, or the sampled token.
    pub what: Difference,
}

/// A differing value.
#[derive(Debug, Clone, PartialEq)]
pub enum Difference {
    /// Logit `index`: reference and candidate values.
    Logit {
        index: usize,
        reference: f32,
        got: f32,
    },
    /// The sampled token.
    Token { reference: u32, got: u32 },
    /// The runs decoded different numbers of steps.
    Steps { reference: usize, got: usize },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let arm = match self.arm {
            Arm::Serial => "serial",
            Arm::Pipelined => "pipelined",
        };
        match &self.what {
            Difference::Logit { index, reference, got } => write!(
                f,
                "{arm} arm, step {}, logit {index}: reference {reference:e} ({:#010x}), got {got:e} ({:#010x})",
                self.step,
                reference.to_bits(),
                got.to_bits()
            ),
            Difference::Token { reference, got } => write!(
                f,
                "{arm} arm, step {}: reference token {reference}, got token {got}",
                self.step
            ),
            Difference::Steps { reference, got } => write!(
                f,
                "{arm} arm: reference decoded {reference} steps, candidate {got}"
            ),
        }
    }
}

/// What the gate checked.
#[derive(Debug, Clone, PartialEq)]
pub struct GateReport {
    /// Decode steps per run (prompt plus generated).
    pub steps: usize,
    /// Logits compared per step.
    pub vocab: usize,
    /// Candidate arms that were run.
    pub arms: Vec<Arm>,
    /// Candidate runs per arm.
    pub runs: usize,
    /// Candidate runs (over all arms) that differed from the reference.
    pub failed_runs: usize,
    /// The first mismatch, if any.
    pub mismatch: Option<Mismatch>,
}

/// Greedy decoding of `prompt` plus `n` generated tokens; every step's output.
pub fn decode_all(
    loaded: &LoadedPlan,
    options: EngineOptions,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<StepOutput>> {
    let runtime = &loaded.plan.runtime;
    // every step is compared, so none may be cut off where the context ends
    let positions = prompt.len() + n.saturating_sub(1);
    if positions > runtime.max_context as usize {
        bail!(
            "the prompt's {} tokens and {n} generated take {positions} positions, more than {}'s runtime.max_context of {}; give a shorter prompt or a smaller -n",
            prompt.len(),
            loaded.path.display(),
            runtime.max_context
        );
    }
    let engine = open(loaded, options)?;
    let mut session = Session::new(engine, runtime.in_flight, runtime.max_context);
    let mut outs = Vec::new();
    session.run(prompt, n, 0, |out, _| {
        outs.push(out.clone());
        Ok(Flow::Continue)
    })?;
    Ok(outs)
}

/// The first difference between two runs' outputs.
pub fn first_mismatch(arm: Arm, reference: &[StepOutput], got: &[StepOutput]) -> Option<Mismatch> {
    // a row's index is its step in token-by-token numbering, however the prompt was cut
    for (i, (r, g)) in reference.iter().zip(got).enumerate() {
        let at = |what| Mismatch {
            arm,
            step: i as u64,
            what,
        };
        if r.logits.len() != g.logits.len() {
            return Some(at(Difference::Logit {
                index: r.logits.len().min(g.logits.len()),
                reference: f32::NAN,
                got: f32::NAN,
            }));
        }
        if let Some(index) =
            (0..r.logits.len()).find(|&i| r.logits[i].to_bits() != g.logits[i].to_bits())
        {
            return Some(at(Difference::Logit {
                index,
                reference: r.logits[index],
                got: g.logits[index],
            }));
        }
        if r.token != g.token {
            return Some(at(Difference::Token {
                reference: r.token,
                got: g.token,
            }));
        }
    }
    (reference.len() != got.len()).then(|| Mismatch {
        arm,
        step: reference.len().min(got.len()) as u64,
        what: Difference::Steps {
            reference: reference.len(),
            got: got.len(),
        },
    })
}

/// Refuses a reference plan that could itself reassociate a sum: the reference computes
/// every layer whole on one rank, so it is the 1-rank plan or a pipeline of whole layers
/// (stages add no arithmetic: a model too large for one device is gated against its
/// pipeline's eager run).
fn check_reference(reference: &LoadedPlan) -> Result<()> {
    let plan = &reference.plan;
    if let Some(rank) = plan.ranks.iter().find(|r| r.tp_degree > 1) {
        bail!(
            "the reference plan {} splits layers across ranks (rank {} is one of {} in a group); the gate compares against a plan that computes every layer whole on one rank: the 1-rank plan, or pipeline stages without tensor- or expert-parallel groups",
            reference.path.display(),
            rank.rank,
            rank.tp_degree
        );
    }
    Ok(())
}

/// Runs `reference` (the 1-rank plan or a pipeline of whole layers, serial) and `candidate` in both arms on `prompt` plus `n`
/// greedy tokens and compares them bit for bit; in one process, stops at the first arm that
/// mismatches.
pub fn gate(
    reference: &LoadedPlan,
    candidate: &LoadedPlan,
    prompt: &[u32],
    n: usize,
    options: EngineOptions,
) -> Result<GateReport> {
    gate_repeated(reference, candidate, prompt, n, options, 1)
}

/// The gate as a soak test: the reference once, then the candidate `repeat` times in both
/// arms, counting the runs that differ. With `repeat == 1` in one process it stops at the
/// first mismatch. In a process without the candidate's readback rank nothing is compared:
/// its report has no mismatch and no steps.
pub fn gate_repeated(
    reference: &LoadedPlan,
    candidate: &LoadedPlan,
    prompt: &[u32],
    n: usize,
    options: EngineOptions,
    repeat: usize,
) -> Result<GateReport> {
    check_reference(reference)?;
    if reference.plan.model.fingerprint != candidate.plan.model.fingerprint {
        bail!(
            "{} and {} were compiled for different models",
            reference.path.display(),
            candidate.path.display()
        );
    }
    let greedy = EngineOptions {
        sampler: SamplerConfig::GREEDY,
        ..options
    };
    let compares = options.holds_readback(&candidate.plan);
    let want = if compares {
        let alone = EngineOptions {
            arm: Arm::Serial,
            world: None,
            ..greedy
        };
        decode_all(reference, alone, prompt, n)?
    } else {
        Vec::new()
    };
    let mut report = GateReport {
        steps: want.len(),
        vocab: want.first().map_or(0, |o| o.logits.len()),
        arms: Vec::new(),
        runs: 0,
        failed_runs: 0,
        mismatch: None,
    };
    for run in 0..repeat.max(1) {
        report.runs = run + 1;
        for arm in [Arm::Serial, Arm::Pipelined] {
            if run == 0 {
                report.arms.push(arm);
            }
            let got = decode_all(candidate, EngineOptions { arm, ..greedy }, prompt, n)?;
            if !compares {
                continue;
            }
            if let Some(m) = first_mismatch(arm, &want, &got) {
                report.failed_runs += 1;
                report.mismatch.get_or_insert(m);
                if repeat <= 1 && options.world.is_none() {
                    return Ok(report);
                }
            }
        }
    }
    Ok(report)
}
