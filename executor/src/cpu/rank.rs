//! One rank of a plan on the CPU: its program with a cursor, its own compute state, and its
//! end of the wire. `advance` walks the program (the shared walk of `crate::program`) until
//! the step is done or the next entry would wait; the serial arm calls it without blocking
//! and moves to the next rank, the pipelined arm calls it on the rank's own thread and lets
//! it block. `CpuOps` is what each entry does on the CPU.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::{Boundary, Carries, Plan};

use super::compute::RankCompute;
use super::wire::{Payload, Wire};
use crate::dist::Takers;
use crate::engine::{Readback, RowAt, StepInput, StepOutput};
use crate::program::{walk, Binder, Block, Cursor, Entered, Program, RankOps, Work};
use crate::reduce::{ReduceOrder, Tree};
use crate::sample::greedy;

/// A rank's tensor-parallel group, as the rank sees it.
#[derive(Debug)]
struct Group {
    id: u32,
    members: usize,
    index: usize,
    tree: Tree,
}

/// A rank with its program and state.
pub struct RankRunner {
    program: Program,
    cursor: Cursor,
    step: Option<(u64, StepInput)>,
    ops: CpuOps,
}

/// What each program entry does on the CPU.
struct CpuOps {
    rank: u32,
    compute: RankCompute,
    binder: Arc<Binder>,
    wire: Arc<Wire>,
    group: Option<Group>,
    order: ReduceOrder,
    collective_seq: u64,
    contributed: bool,
    outgoing: Vec<Boundary>,
    incoming: Vec<Boundary>,
    readback: Sender<Result<StepOutput>>,
    /// Slot and position of each row of the step (kept between segments).
    at: Vec<RowAt>,
}

impl RankRunner {
    /// A runner for `rank` of `plan` around its compute state.
    pub fn new(
        plan: &Plan,
        rank: u32,
        compute: RankCompute,
        binder: Arc<Binder>,
        wire: Arc<Wire>,
        order: ReduceOrder,
        readback: Sender<Result<StepOutput>>,
    ) -> Result<RankRunner> {
        let r = plan.rank(rank).expect("invariant: a rank of the plan");
        let group = match r.group {
            Some(id) => {
                let g = plan.groups.iter().find(|g| g.group == id).ok_or_else(|| {
                    anyhow!("rank {rank} names group {id}, which is not declared")
                })?;
                let index = g
                    .ranks
                    .iter()
                    .position(|&x| x == rank)
                    .ok_or_else(|| anyhow!("group {id} does not list rank {rank}"))?;
                Some(Group {
                    id,
                    members: g.ranks.len(),
                    index,
                    tree: Tree::parse(&g.tree, &g.ranks)
                        .map_err(|e| anyhow!("group {id}: tree `{}`: {e}", g.tree))?,
                })
            }
            None => None,
        };
        // the boundaries whose `end` (sender or receiver) is this rank
        let at_rank = |end: fn(&Boundary) -> u32| {
            let at = plan.boundaries.iter().filter(|&b| end(b) == rank);
            at.cloned().collect()
        };
        let (outgoing, incoming) = (at_rank(|b| b.from_rank), at_rank(|b| b.to_rank));
        Ok(RankRunner {
            program: Program::of(plan, rank),
            cursor: Cursor::default(),
            step: None,
            ops: CpuOps {
                rank,
                compute,
                binder,
                wire,
                group,
                order,
                collective_seq: 0,
                contributed: false,
                outgoing,
                incoming,
                readback,
                at: Vec::new(),
            },
        })
    }

    /// The rank's id.
    pub fn rank(&self) -> u32 {
        self.program.rank
    }

    /// Starts decode step `t`.
    pub fn begin(&mut self, t: u64, input: StepInput) {
        debug_assert!(self.step.is_none(), "invariant: the previous step finished");
        self.step = Some((t, input));
        self.cursor = Cursor::default();
    }

    /// Whether the rank has a step in progress.
    pub fn busy(&self) -> bool {
        self.step.is_some()
    }

    /// Runs actions until the step is done (`Ok(true)`) or, without `block`, until the next
    /// action would wait (`Ok(false)`); returns whether any action ran in `progressed`.
    pub fn advance(&mut self, block: bool, progressed: &mut bool) -> Result<bool> {
        let Some((t, input)) = &self.step else {
            return Ok(true);
        };
        let t = *t;
        let done = walk(
            &self.program,
            &mut self.ops,
            &mut self.cursor,
            t,
            input,
            block,
            progressed,
        )
        .map_err(|e| anyhow!("rank {} step {t}: {e:#}", self.program.rank))?;
        if done {
            self.step = None;
        }
        Ok(done)
    }
}

impl RankOps for CpuOps {
    fn wait(&mut self, _: &str, event: &str, at: usize, t: u64, block: bool) -> Result<bool> {
        match self.binder.bound_step(event, self.rank, at, t) {
            Some(bound) => self.wire.wait(event, bound, block),
            None => Ok(true),
        }
    }

    fn record(&mut self, _: &str, event: &str, t: u64) -> Result<()> {
        self.wire.record(event, t)
    }

    fn copy(&mut self, _: &str, boundary: u32, t: u64) -> Result<()> {
        let b = self.incoming_boundary(boundary)?;
        let slot = b.recv_slot(t);
        let payload = self.wire.read_slot(b.boundary, slot)?;
        self.compute.receive(b.boundary, slot, payload);
        Ok(())
    }

    fn readback(&mut self, _: &str, t: u64, input: &StepInput) -> Result<()> {
        let logits = self.compute.logits();
        let (logits, argmax) = match input.readback {
            Readback::Logits => (logits.to_vec(), Vec::new()),
            Readback::Argmax => {
                let vocab = logits.len() / input.logit_rows().len().max(1);
                let rows = logits.chunks_exact(vocab.max(1)).map(greedy);
                (Vec::new(), rows.collect())
            }
        };
        let out = StepOutput {
            step: t,
            pos: input.pos(),
            token: self.compute.token(),
            logits,
            argmax,
        };
        self.wire.publish(&out)?;
        // A closed channel means the host stopped listening; nothing is left to do.
        let _ = self.readback.send(Ok(out));
        Ok(())
    }

    fn enter(&mut self, _: &str, _: usize, _: &Block, _: u64, _: &StepInput) -> Result<Entered> {
        Ok(Entered::Walk)
    }

    fn work(
        &mut self,
        _: &str,
        work: Work,
        t: u64,
        input: &StepInput,
        block: bool,
    ) -> Result<bool> {
        match work {
            Work::AllReduce => self.collective(Takers::All, block),
            Work::GatherLogits => self.collective(Takers::First, block),
            work => self.compute_work(work, t, input).map(|()| true),
        }
    }
}

impl CpuOps {
    fn incoming_boundary(&self, id: u32) -> Result<&Boundary> {
        self.incoming
            .iter()
            .find(|b| b.boundary == id)
            .ok_or_else(|| anyhow!("copy of boundary {id}, which does not end at this rank"))
    }

    fn compute_work(&mut self, work: Work, t: u64, input: &StepInput) -> Result<()> {
        match work {
            Work::Embed if !input.embeds_sampled() => self.compute.embed(&input.tokens()),
            Work::Embed => {
                let token = match self.incoming.iter().find(|b| b.carries == Carries::Token) {
                    Some(b) => self.compute.received_token(b.boundary, b.recv_slot(t))?,
                    None => self.compute.token(),
                };
                self.compute.embed(&[token])
            }
            Work::Segment { layer, segment } => {
                self.at.clear();
                self.at.extend(input.rows_at());
                self.compute.segment(layer, segment, &self.at)
            }
            Work::Head => self.compute.head(&input.logit_rows()),
            Work::Sample => self.compute.sample(),
            Work::LoadHidden => {
                let b = self
                    .incoming
                    .iter()
                    .find(|b| b.carries == Carries::Hidden)
                    .ok_or_else(|| anyhow!("load_hidden without an incoming hidden boundary"))?;
                self.compute
                    .load_hidden(b.boundary, b.recv_slot(t), b.selection)
            }
            Work::StoreHidden | Work::StoreToken => {
                let carries = if work == Work::StoreHidden {
                    Carries::Hidden
                } else {
                    Carries::Token
                };
                let mut sent = false;
                for b in self.outgoing.iter().filter(|b| b.carries == carries) {
                    let payload = match carries {
                        Carries::Hidden => {
                            Payload::Hidden(self.compute.hidden_payload(b.selection)?)
                        }
                        Carries::Token => Payload::Token(self.compute.token()),
                    };
                    self.wire.send(b.boundary, b.send_slot(t), payload)?;
                    sent = true;
                }
                if !sent {
                    bail!("store without an outgoing boundary");
                }
                Ok(())
            }
            Work::AllReduce | Work::GatherLogits => {
                unreachable!("invariant: collectives are dispatched by `work`")
            }
        }
    }

    /// This rank's side of its group's next collective: the all-reduce of the partial sums
    /// (`Takers::All`) or the gather of the vocab slices of the logits (`Takers::First`).
    /// Contributes once; a member that takes the parts waits for the others (without `block`,
    /// `Ok(false)` until all are in), then sums them in the group's tree order or, the first
    /// member, concatenates the slices.
    fn collective(&mut self, takers: Takers, block: bool) -> Result<bool> {
        let what = match takers {
            Takers::All => "all_reduce",
            Takers::First => "gather_logits",
        };
        let group = self
            .group
            .as_ref()
            .ok_or_else(|| anyhow!("{what} on a rank of no tensor-parallel group"))?;
        if !self.contributed {
            let part = match takers {
                Takers::All => self.compute.partial(),
                Takers::First => self.compute.logits(),
            };
            self.wire.contribute(
                group.id,
                self.collective_seq,
                group.index,
                group.members,
                takers,
                part.to_vec(),
            )?;
            self.contributed = true;
        }
        if takers == Takers::All || group.index == 0 {
            let Some(parts) = self.wire.collect(group.id, self.collective_seq, block)? else {
                return Ok(false);
            };
            match takers {
                Takers::All => {
                    let sum = group.tree.combine(&parts, self.order);
                    self.compute.add_reduced(&sum);
                }
                Takers::First => self.compute.set_full_logits(&parts),
            }
        }
        self.contributed = false;
        self.collective_seq += 1;
        Ok(true)
    }
}
