//! A rank's program as the CPU runs it: the plan's steps flattened into actions (one per
//! layer segment), and the binding of every event wait to the record it waits for.
//!
//! Event semantics are CUDA's, as the compiler's verify pass replays them: the host enqueues
//! decode step after decode step, each step's rank programs in plan order, and a wait binds to
//! the latest record of the same event enqueued before it. Boundary events are per slot: a
//! wait binds to the latest record of its slot. On the CPU a rank's streams run in program
//! order on one thread, so waits between a rank's own streams are always already satisfied;
//! the same rule covers them without a special case.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use memra_compiler::plan::{event_slot, Boundary, Op, Plan, Segment, Step};

/// How far back a wait's record is searched, in decode steps: more than any slot count.
const MAX_LOOKBACK: u64 = 64;

/// One unit of a rank's per-step work.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Wait until the bound record of `event` has happened (`at` is the program index).
    Wait { event: String, at: usize },
    /// Record `event` for this step.
    Record { event: String },
    /// Copy boundary `boundary`'s `tx[slot]` into this rank's `rx[slot]`.
    Copy { boundary: u32 },
    /// Send the step's logits and token to the host.
    Readback,
    /// Compute that touches only the rank's own state.
    Work(Work),
    /// Sum the group's partials of the current projection in the group's tree.
    AllReduce,
    /// Gather the vocab-parallel logits on the group's first rank.
    GatherLogits,
}

/// Rank-local compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Embed,
    Segment { layer: u32, segment: Segment },
    Head,
    Sample,
    LoadHidden,
    StoreHidden,
    StoreToken,
}

/// Flattens rank `rank`'s program into actions.
pub fn actions(plan: &Plan, rank: u32) -> Result<Vec<Action>> {
    let r = plan
        .rank(rank)
        .expect("invariant: called with a rank of the plan");
    let mut out = Vec::new();
    for (at, step) in r.program.iter().enumerate() {
        match step {
            Step::Wait { event, .. } => out.push(Action::Wait {
                event: event.clone(),
                at,
            }),
            Step::Record { event, .. } => out.push(Action::Record {
                event: event.clone(),
            }),
            Step::Copy { boundary, .. } => out.push(Action::Copy {
                boundary: *boundary,
            }),
            Step::Readback { .. } => out.push(Action::Readback),
            Step::Run { ops, .. } | Step::Island { ops, .. } => {
                for op in ops {
                    push_op(&mut out, op)?;
                }
            }
        }
    }
    Ok(out)
}

fn push_op(out: &mut Vec<Action>, op: &Op) -> Result<()> {
    let work = match op {
        Op::Embed => Work::Embed,
        Op::Head => Work::Head,
        Op::Sample => Work::Sample,
        Op::LoadHidden => Work::LoadHidden,
        Op::StoreHidden => Work::StoreHidden,
        Op::StoreToken => Work::StoreToken,
        Op::GatherLogits => {
            out.push(Action::GatherLogits);
            return Ok(());
        }
        Op::Layers { layers, segments } => {
            for layer in layers.start..layers.end {
                for &segment in segments {
                    match segment {
                        Segment::AllReduce => out.push(Action::AllReduce),
                        Segment::AttnPre | Segment::AttnCore | Segment::AttnOut | Segment::Ffn => {
                            out.push(Action::Work(Work::Segment { layer, segment }))
                        }
                        other => bail!(
                            "segment `{}` is not supported by the cpu executor yet",
                            other.name()
                        ),
                    }
                }
            }
            return Ok(());
        }
    };
    out.push(Action::Work(work));
    Ok(())
}

/// Where an event is recorded: the recording rank's position in plan order and its program
/// index.
#[derive(Debug, Clone, Copy)]
struct RecordSite {
    rank_pos: usize,
    rank: u32,
    at: usize,
}

/// Resolves waits to the decode step of the record they bind to.
#[derive(Debug)]
pub struct Binder {
    records: BTreeMap<String, RecordSite>,
    boundaries: Vec<Boundary>,
    rank_pos: BTreeMap<u32, usize>,
}

impl Binder {
    /// Indexes the records of `plan`; each event must be recorded at exactly one place.
    pub fn new(plan: &Plan) -> Result<Binder> {
        let mut records = BTreeMap::new();
        let mut rank_pos = BTreeMap::new();
        for (pos, r) in plan.ranks.iter().enumerate() {
            rank_pos.insert(r.rank, pos);
            for (at, step) in r.program.iter().enumerate() {
                if let Step::Record { event, .. } = step {
                    let site = RecordSite {
                        rank_pos: pos,
                        rank: r.rank,
                        at,
                    };
                    if records.insert(event.clone(), site).is_some() {
                        bail!("event `{event}` is recorded at more than one place; the cpu executor needs one");
                    }
                }
            }
        }
        for r in &plan.ranks {
            for step in &r.program {
                if let Step::Wait { event, .. } = step {
                    if !records.contains_key(event) {
                        bail!(
                            "rank {} waits for event `{event}`, which no rank records",
                            r.rank
                        );
                    }
                }
            }
        }
        Ok(Binder {
            records,
            boundaries: plan.boundaries.clone(),
            rank_pos,
        })
    }

    /// The decode step whose record of `event` a wait of `rank` at program index `at` in
    /// decode step `t` binds to; `None` when nothing was recorded before it (a no-op wait).
    pub fn bound_step(&self, event: &str, rank: u32, at: usize, t: u64) -> Option<u64> {
        let site = self.records.get(event)?;
        let me = (self.rank_pos[&rank], at);
        let want = event_slot(&self.boundaries, event, rank, t);
        let first = t.saturating_sub(MAX_LOOKBACK);
        (first..=t).rev().find(|&tr| {
            let before = tr < t || (site.rank_pos, site.at) < me;
            before && event_slot(&self.boundaries, event, site.rank, tr) == want
        })
    }
}
