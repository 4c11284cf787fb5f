//! A rank's program as both engines walk it, and the one walk they share.
//!
//! `Program::of` flattens a rank's plan steps into entries: event waits and records, boundary
//! copies, the readback, and blocks (a run or an island) holding the block's work one layer
//! segment at a time. `walk` runs entries in program order over a backend's `RankOps`; a
//! backend only implements what each entry does on its hardware (op families, transfers,
//! events), never the loop. A block asks the backend first (`enter`): the CUDA engine replays
//! a captured graph there and skips the block's work; otherwise the walk runs the work items.
//! Adding a layer kind therefore touches no host loop: the compiler emits its segments, each
//! backend's segment dispatcher maps them to an op family.
//!
//! Event semantics are CUDA's, as the compiler's verify pass replays them: the host enqueues
//! decode step after decode step, each step's rank programs in plan order, and a wait binds to
//! the latest record of the same event enqueued before it. Boundary events are per slot: a
//! wait binds to the latest record of its slot. `Binder` resolves that binding for an engine
//! that has no device events (the CPU); on one thread a rank's streams run in program order,
//! so waits between a rank's own streams are always already satisfied; the same rule covers
//! them without a special case.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use memra_compiler::plan::{event_slot, Boundary, Op, Plan, Segment, Step};

use crate::engine::StepInput;

mod lockstep;
pub use lockstep::Lockstep;
#[cfg(test)]
pub(crate) mod recorder;

/// How far back a wait's record is searched, in decode steps: more than any slot count.
const MAX_LOOKBACK: u64 = 64;

/// One unit of work inside a block, in the order the block runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Look up the step's token embedding.
    Embed,
    /// One segment of one layer; the backend maps it to an op family.
    Segment { layer: u32, segment: Segment },
    /// Sum the group's partials of the current projection in the group's tree.
    AllReduce,
    /// Gather the vocab-parallel logits on the group's first rank.
    GatherLogits,
    /// Final norm and this rank's vocab rows of the head.
    Head,
    /// Pick the next token.
    Sample,
    /// Read the hidden state from the incoming boundary slot.
    LoadHidden,
    /// Write the hidden state into the outgoing boundary slots.
    StoreHidden,
    /// Write the sampled token into the outgoing token slots.
    StoreToken,
}

impl std::fmt::Display for Work {
    /// The work item as error messages name it, in plan words.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Work::Segment { layer, segment } => {
                return write!(f, "layer {layer} {}", segment.name())
            }
            Work::Embed => "embed",
            Work::AllReduce => "all_reduce",
            Work::GatherLogits => "gather_logits",
            Work::Head => "head",
            Work::Sample => "sample",
            Work::LoadHidden => "load_hidden",
            Work::StoreHidden => "store_hidden",
            Work::StoreToken => "store_token",
        };
        f.write_str(name)
    }
}

/// A run or an island: work enqueued together on one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// The plan's id of the run or island.
    pub id: String,
    /// Graph phases when the block is a run (captured), `None` for an island (eager).
    pub phases: Option<u32>,
    /// The work, flattened.
    pub work: Vec<Work>,
}

/// One entry of a rank's program.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// Wait until the bound record of `event` has happened.
    Wait { event: String },
    /// Record `event` for this step.
    Record { event: String },
    /// Copy boundary `boundary`'s `tx[slot]` into this rank's `rx[slot]`.
    Copy { boundary: u32 },
    /// Send the step's logits and token to the host.
    Readback,
    /// A run or an island.
    Block(Block),
}

/// A rank's program: its entries, each with the stream it is enqueued on; entry `i` is the
/// plan's program step `i`.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// The rank's id.
    pub rank: u32,
    /// Entries in program order, with their stream names.
    pub entries: Vec<(String, Entry)>,
}

impl Program {
    /// Flattens rank `rank`'s program.
    pub fn of(plan: &Plan, rank: u32) -> Program {
        let r = plan
            .rank(rank)
            .expect("invariant: called with a rank of the plan");
        let entries = r
            .program
            .iter()
            .map(|step| {
                let entry = match step {
                    Step::Wait { event, .. } => Entry::Wait {
                        event: event.clone(),
                    },
                    Step::Record { event, .. } => Entry::Record {
                        event: event.clone(),
                    },
                    Step::Copy { boundary, .. } => Entry::Copy {
                        boundary: *boundary,
                    },
                    Step::Readback { .. } => Entry::Readback,
                    Step::Run {
                        id, phases, ops, ..
                    } => Entry::Block(Block {
                        id: id.clone(),
                        phases: Some(*phases),
                        work: flatten(ops),
                    }),
                    Step::Island { id, ops, .. } => Entry::Block(Block {
                        id: id.clone(),
                        phases: None,
                        work: flatten(ops),
                    }),
                };
                (step.stream().to_string(), entry)
            })
            .collect();
        Program { rank, entries }
    }
}

fn flatten(ops: &[Op]) -> Vec<Work> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Embed => out.push(Work::Embed),
            Op::Head => out.push(Work::Head),
            Op::Sample => out.push(Work::Sample),
            Op::LoadHidden => out.push(Work::LoadHidden),
            Op::StoreHidden => out.push(Work::StoreHidden),
            Op::StoreToken => out.push(Work::StoreToken),
            Op::GatherLogits => out.push(Work::GatherLogits),
            Op::Layers { layers, segments } => {
                for layer in layers.start..layers.end {
                    for &segment in segments {
                        out.push(match segment {
                            Segment::AllReduce => Work::AllReduce,
                            segment => Work::Segment { layer, segment },
                        });
                    }
                }
            }
        }
    }
    out
}

/// What entering a block did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entered {
    /// The backend ran the whole block itself (a replayed graph): skip its work.
    Done,
    /// Walk the block's work.
    Walk,
}

/// What a backend's rank does for each entry. Methods that may wait for another rank take
/// `block`: with it they wait, without it they return `Ok(false)` instead of waiting, and the
/// walk resumes at the same entry later.
pub trait RankOps {
    /// A wait on `stream` for `event` at program index `at`.
    fn wait(&mut self, stream: &str, event: &str, at: usize, t: u64, block: bool) -> Result<bool>;
    /// A record of `event` on `stream`.
    fn record(&mut self, stream: &str, event: &str, t: u64) -> Result<()>;
    /// The copy of boundary `boundary`'s slot for step `t` on `stream`.
    fn copy(&mut self, stream: &str, boundary: u32, t: u64) -> Result<()>;
    /// The step's logits and token to the host.
    fn readback(&mut self, stream: &str, t: u64, input: &StepInput) -> Result<()>;
    /// Entering block `at` (its program index) on `stream`.
    fn enter(
        &mut self,
        stream: &str,
        at: usize,
        block: &Block,
        t: u64,
        input: &StepInput,
    ) -> Result<Entered>;
    /// One work item of a block on `stream`.
    fn work(
        &mut self,
        stream: &str,
        work: Work,
        t: u64,
        input: &StepInput,
        block: bool,
    ) -> Result<bool>;
}

/// Where a rank is in its program for the current step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    entry: usize,
    /// Inside a block: the next work item; `None` before the block was entered.
    work: Option<usize>,
}

/// Runs `program` for step `t` from `cursor` until the step is done (`Ok(true)`) or, without
/// `block`, until the next entry would wait (`Ok(false)`, cursor left there); `progressed`
/// becomes true when anything ran.
pub fn walk<R: RankOps + ?Sized>(
    program: &Program,
    ops: &mut R,
    cursor: &mut Cursor,
    t: u64,
    input: &StepInput,
    block: bool,
    progressed: &mut bool,
) -> Result<bool> {
    while let Some((stream, entry)) = program.entries.get(cursor.entry) {
        let at = cursor.entry;
        let done = match entry {
            Entry::Wait { event } => ops.wait(stream, event, at, t, block)?,
            Entry::Record { event } => ops.record(stream, event, t).map(|()| true)?,
            Entry::Copy { boundary } => ops.copy(stream, *boundary, t).map(|()| true)?,
            Entry::Readback => ops.readback(stream, t, input).map(|()| true)?,
            Entry::Block(b) => {
                let mut next = match cursor.work {
                    Some(i) => i,
                    None => match ops.enter(stream, at, b, t, input)? {
                        Entered::Done => b.work.len(),
                        Entered::Walk => 0,
                    },
                };
                cursor.work = Some(next);
                while let Some(&w) = b.work.get(next) {
                    if !ops.work(stream, w, t, input, block)? {
                        return Ok(false);
                    }
                    *progressed = true;
                    next += 1;
                    cursor.work = Some(next);
                }
                true
            }
        };
        if !done {
            return Ok(false);
        }
        *progressed = true;
        *cursor = Cursor {
            entry: at + 1,
            work: None,
        };
    }
    Ok(true)
}

/// Runs a block's work eagerly on `ops` (a capture records exactly this).
pub fn run_block<R: RankOps + ?Sized>(
    ops: &mut R,
    stream: &str,
    b: &Block,
    t: u64,
    input: &StepInput,
) -> Result<()> {
    for &w in &b.work {
        if !ops.work(stream, w, t, input, true)? {
            bail!("invariant: blocking work always completes");
        }
    }
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
                        bail!("event `{event}` is recorded at more than one place; an executor needs one");
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
