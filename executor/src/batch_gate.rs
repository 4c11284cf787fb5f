//! The continuous-batching gate: sequences decoded together by a plan of several sequence
//! slots (different prompts, joining at different steps, leaving early, their slots taken
//! again by later sequences, one of them reusing a cached prefix) get, at every generated
//! token, the logits of their run alone with a reference plan, bit for bit. Both runs go
//! through `Batch` with greedy host sampling, so the reference may be the batched plan itself
//! (a sequence alone in it) or a plan of one sequence slot. The runs alone share one engine
//! of the reference, one sequence after the other (a later one reuses a cached prefix only
//! where its prompt repeats the last one's, as the batched run's last sequence does).

use anyhow::{anyhow, bail, Result};

use crate::batch::{window, Batch};
use crate::engine::{open, Arm, EngineOptions};
use crate::plan_load::LoadedPlan;
use crate::sample::argmax;

/// A sequence of the gate: the step it joins at (or later, when every slot is taken), its
/// prompt and how many tokens it generates.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub joins_at: usize,
    pub prompt: Vec<u32>,
    pub generate: usize,
}

/// Sequences over `vocab` tokens for a plan of `slots` slots: prompts of 1 to 7 tokens (each
/// token offset by `seed`), joining at different steps, two more of them than `slots` so the
/// later ones wait and take the slots of those that left; the last repeats the first's
/// prompt, reusing the prefix its slot holds.
pub fn sequences(vocab: u32, slots: usize, seed: u32) -> Vec<Sequence> {
    let mut out: Vec<Sequence> = (0..slots + 2)
        .map(|i| {
            let len = 1 + (i * 5) % 7;
            let prompt = (0..len)
                .map(|j| (17 + seed + 31 * i as u32 + 7 * j as u32) % vocab)
                .collect();
            Sequence {
                joins_at: [0, 0, 1, 3, 4, 4, 7, 9, 10, 12][i % 10],
                prompt,
                generate: 3 + (i * 3) % 5,
            }
        })
        .collect();
    let first = out[0].prompt.clone();
    out.push(Sequence {
        joins_at: 14,
        prompt: first,
        generate: 4,
    });
    out
}

/// `plan` opened with `options`, decoding through a `Batch` of all its slots.
fn batch_of(plan: &LoadedPlan, options: EngineOptions) -> Result<Batch> {
    let slots = plan.plan.runtime.max_sequences as usize;
    let window = window(&plan.plan, options.arm);
    Ok(Batch::new(open(plan, options)?, slots, window))
}

/// What `together` decoded: per sequence, per generated token, its logits (empty where only
/// its argmax came back) and its greedy token; and the most sequences one step carried.
pub struct Together {
    pub logits: Vec<Vec<Vec<f32>>>,
    pub tokens: Vec<Vec<u32>>,
    pub widest: usize,
}

/// Which sequences of a run are the batch's greedy ones (`Batch::greedy`: a step of those
/// only brings back their argmaxes, not their logits); all pick greedy tokens either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    None,
    All,
    /// Sequences 0, 2, 4, ...: steps mix both kinds.
    EveryOther,
}

impl Marked {
    fn greedy(self, sequence: usize) -> bool {
        match self {
            Marked::None => false,
            Marked::All => true,
            Marked::EveryOther => sequence.is_multiple_of(2),
        }
    }
}

/// Every sequence decoded greedily, all together by `batch`, those `marked` as the batch's
/// greedy ones.
pub fn together(batch: &mut Batch, sequences: &[Sequence], marked: Marked) -> Result<Together> {
    let mut logits: Vec<Vec<Vec<f32>>> = vec![Vec::new(); sequences.len()];
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); sequences.len()];
    let mut slot_of: Vec<Option<usize>> = vec![None; sequences.len()];
    let (mut next, mut widest, mut step) = (0, 0, 0);
    while next < sequences.len() || batch.used() > 0 {
        while next < sequences.len() && sequences[next].joins_at <= step {
            let Some(slot) = batch.join(&sequences[next].prompt)? else {
                break;
            };
            if marked.greedy(next) {
                batch.greedy(slot)?;
            }
            slot_of[next] = Some(slot);
            next += 1;
        }
        widest = widest.max(batch.used());
        let stepped = batch.step()?;
        for done in &stepped.done {
            let i = slot_of
                .iter()
                .position(|&s| s == Some(done.slot))
                .ok_or_else(|| anyhow!("invariant: slot {} holds a sequence", done.slot))?;
            logits[i].push(
                stepped
                    .logits(done)
                    .map(<[f32]>::to_vec)
                    .unwrap_or_default(),
            );
            let token = stepped.argmax(done)?;
            tokens[i].push(token);
            if tokens[i].len() == sequences[i].generate {
                batch.leave(done.slot)?;
                slot_of[i] = None;
            } else {
                batch.feed(done.slot, token)?;
            }
        }
        step += 1;
    }
    Ok(Together {
        logits,
        tokens,
        widest,
    })
}

/// What the gate found.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchGateReport {
    /// The arms the batched plan ran in.
    pub arms: Vec<Arm>,
    /// The most sequences one step carried, per arm.
    pub widest: Vec<usize>,
    /// Generated tokens compared, per arm.
    pub tokens: usize,
    /// The first difference: arm, sequence, generated token, and what differs.
    pub mismatch: Option<String>,
    /// How the batched engine ran its steps (`Decoder::activity`), per arm, each line after
    /// its arm's name.
    pub activity: Vec<String>,
}

/// Decodes every sequence alone with `reference` (serial arm) and all together with
/// `batched` in each arm of `arms`, and compares every logit bit of every generated token;
/// in each arm also with every sequence marked greedy (the engine's argmax of each row comes
/// back, not its logits), and in the serial arm with every other one marked (steps of both
/// kinds), whose tokens must be the argmaxes of the logits alone.
pub fn batch_gate(
    reference: &LoadedPlan,
    batched: &LoadedPlan,
    sequences: &[Sequence],
    options: EngineOptions,
    arms: &[Arm],
) -> Result<BatchGateReport> {
    if batched.plan.runtime.max_sequences < 2 {
        bail!(
            "{}: runtime.max_sequences is {}; the batch gate needs a plan of several sequence slots",
            batched.path.display(),
            batched.plan.runtime.max_sequences
        );
    }
    let serial = EngineOptions {
        arm: Arm::Serial,
        ..options
    };
    let mut single = batch_of(reference, serial)?;
    let mut alone = Vec::new();
    for s in sequences {
        let one = [Sequence {
            joins_at: 0,
            ..s.clone()
        }];
        let mut run = together(&mut single, &one, Marked::None)?;
        alone.push(run.logits.remove(0));
    }
    drop(single);
    let mut report = BatchGateReport {
        arms: arms.to_vec(),
        widest: Vec::new(),
        tokens: alone.iter().map(Vec::len).sum(),
        mismatch: None,
        activity: Vec::new(),
    };
    for &arm in arms {
        let mut batch = batch_of(batched, EngineOptions { arm, ..options })?;
        let run = together(&mut batch, sequences, Marked::None)?;
        report.widest.push(run.widest);
        let activity = batch.activity();
        report.activity.extend(
            activity
                .iter()
                .map(|line| format!("{} arm: {line}", arm.name())),
        );
        if report.mismatch.is_none() {
            report.mismatch = first_difference(arm, &alone, &run.logits);
        }
        let marks = match arm {
            Arm::Serial => &[Marked::All, Marked::EveryOther][..],
            Arm::Pipelined => &[Marked::All],
        };
        for &marked in marks {
            if report.mismatch.is_none() {
                let mut batch = batch_of(batched, EngineOptions { arm, ..options })?;
                let run = together(&mut batch, sequences, marked)?;
                report.mismatch = first_token_difference(arm, marked, &alone, &run.tokens);
            }
        }
    }
    Ok(report)
}

/// `run`'s first sequence whose count of generated tokens differs from its run alone.
fn count_difference(run: &str, alone: &[Vec<Vec<f32>>], got: &[usize]) -> Option<String> {
    let (i, (want, got)) = alone
        .iter()
        .zip(got)
        .enumerate()
        .find(|(_, (want, &got))| want.len() != got)?;
    Some(format!(
        "{run}, sequence {i}: {} generated tokens alone, {got} together",
        want.len()
    ))
}

fn first_token_difference(
    arm: Arm,
    marked: Marked,
    alone: &[Vec<Vec<f32>>],
    got: &[Vec<u32>],
) -> Option<String> {
    let run = format!("{} arm, greedy sequences marked {marked:?}", arm.name());
    let counts: Vec<usize> = got.iter().map(Vec::len).collect();
    if let Some(m) = count_difference(&run, alone, &counts) {
        return Some(m);
    }
    for (i, (want, got)) in alone.iter().zip(got).enumerate() {
        for (t, (w, &g)) in want.iter().zip(got).enumerate() {
            let w = argmax(w);
            if w != g {
                return Some(format!(
                    "{run}, sequence {i} token {t}: the argmax of its logits alone is {w}, together {g}"
                ));
            }
        }
    }
    None
}

fn first_difference(arm: Arm, alone: &[Vec<Vec<f32>>], got: &[Vec<Vec<f32>>]) -> Option<String> {
    let run = format!("{} arm", arm.name());
    let counts: Vec<usize> = got.iter().map(Vec::len).collect();
    if let Some(m) = count_difference(&run, alone, &counts) {
        return Some(m);
    }
    for (i, (want, got)) in alone.iter().zip(got).enumerate() {
        for (t, (w, g)) in want.iter().zip(got).enumerate() {
            if w.len() != g.len() {
                return Some(format!(
                    "{run}, sequence {i} token {t}: {} logits alone, {} together",
                    w.len(),
                    g.len()
                ));
            }
            if let Some(index) = (0..w.len()).find(|&k| w[k].to_bits() != g[k].to_bits()) {
                return Some(format!(
                    "{run}, sequence {i} token {t}, logit {index}: alone {:e} ({:#010x}), together {:e} ({:#010x})",
                    w[index],
                    w[index].to_bits(),
                    g[index],
                    g[index].to_bits()
                ));
            }
        }
    }
    None
}
