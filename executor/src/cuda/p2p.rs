//! Boundaries between processes (one process per device, `memra-run launch`): each boundary
//! whose two ranks run in different processes is a two-rank NCCL communicator, the sender
//! rank 0, the receiver rank 1, bound to the stream its plan steps use on each side.
//!
//! The plan's steps keep their meaning: the sender's `record ready` is followed by an
//! `ncclSend` of the slot it just wrote; the receiver's `copy` is the matching `ncclRecv` into
//! its slot, so its `wait ready` has nothing left to wait for. The sender's `wait consumed`
//! becomes a wait on the event recorded after its last send of that slot: a send finishes
//! once the data has left the slot, which is all the slot rule asks. Sends and receives of a
//! boundary match in order, one per step; a boundary with lag (the sampled token fed back to
//! the first stage) is not received in its first `lag` steps (the prompt's tokens come from
//! the host), so the receiver takes the last `lag` sends when the engine closes (`drain`).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::Comm;
use memra_compiler::plan::{Boundary, Carries, Plan, Step};

use super::nccl::shared_id;
use super::rank::RankDevice;
use crate::dist::{ProcessMap, World};

/// This process's end of one boundary to another process.
pub(super) struct Crossing {
    comm: Comm,
    boundary: Boundary,
    end: End,
}

enum End {
    /// Recorded after each send, per slot.
    Send {
        rank: usize,
        sent: Vec<CudaEvent>,
    },
    Recv {
        rank: usize,
    },
}

/// The boundaries of this process's ranks that cross to other processes.
#[derive(Default)]
pub(super) struct Crossings {
    by_boundary: BTreeMap<u32, Crossing>,
}

/// The stream `rank`'s program enqueues `pick`'s step on.
fn stream_of(plan: &Plan, rank: u32, pick: impl Fn(&Step) -> bool) -> Result<String> {
    plan.rank(rank)
        .and_then(|r| r.program.iter().find(|s| pick(s)))
        .map(|s| s.stream().to_string())
        .ok_or_else(|| anyhow!("rank {rank} has no step for a boundary it is an end of"))
}

impl Crossings {
    /// Connects every boundary between two processes. Every process takes every crossing
    /// boundary in plan order (sharing its NCCL id even when it is no end of it), so the
    /// communicators form in the same order everywhere.
    pub(super) fn connect(
        plan: &Plan,
        map: &ProcessMap,
        world: &World,
        ranks: &[RankDevice],
    ) -> Result<Crossings> {
        let me = world.process();
        let mut by_boundary = BTreeMap::new();
        for b in &plan.boundaries {
            let (from, to) = (map.process_of(b.from_rank), map.process_of(b.to_rank));
            if from == to {
                continue;
            }
            let id = shared_id(world, from)?;
            let (nccl_rank, rank, stream_name) = if me == from {
                let ready = b.ready();
                let s = stream_of(
                    plan,
                    b.from_rank,
                    |s| matches!(s, Step::Record { event, .. } if *event == ready),
                )?;
                (0, b.from_rank, s)
            } else if me == to {
                let s = stream_of(
                    plan,
                    b.to_rank,
                    |s| matches!(s, Step::Copy { boundary, .. } if *boundary == b.boundary),
                )?;
                (1, b.to_rank, s)
            } else {
                continue;
            };
            let ri = ranks
                .iter()
                .position(|r| r.rank == rank)
                .ok_or_else(|| anyhow!("invariant: rank {rank} runs in this process"))?;
            let stream: Arc<CudaStream> = ranks[ri].stream(&stream_name)?.clone();
            stream.context().bind_to_thread()?;
            let comm = Comm::from_rank(stream, nccl_rank, 2, id).map_err(|e| {
                anyhow!(
                    "cuda backend: boundary {} (rank {} to rank {}): nccl communicator setup: {e:?}",
                    b.boundary,
                    b.from_rank,
                    b.to_rank
                )
            })?;
            let end = if nccl_rank == 0 {
                End::Send {
                    rank: ri,
                    sent: (0..b.slots)
                        .map(|_| ranks[ri].dev.new_event(false))
                        .collect::<Result<_>>()?,
                }
            } else {
                End::Recv { rank: ri }
            };
            by_boundary.insert(
                b.boundary,
                Crossing {
                    comm,
                    boundary: b.clone(),
                    end,
                },
            );
        }
        let crossings = Crossings { by_boundary };
        crossings.warm_up(ranks)?;
        Ok(crossings)
    }

    /// One send and receive per boundary in plan order, so the connections exist before the
    /// first step (NCCL connects a pair on its first operation, both ends at once).
    fn warm_up(&self, ranks: &[RankDevice]) -> Result<()> {
        for c in self.by_boundary.values() {
            match &c.end {
                End::Send { rank, .. } => c.send(&ranks[*rank], 0, 1)?,
                End::Recv { rank } => c.recv(&ranks[*rank], 0, 1)?,
            }
        }
        for c in self.by_boundary.values() {
            c.comm.stream().synchronize().map_err(|e| {
                anyhow!(
                    "cuda backend: boundary {}: warm-up: {e:?}",
                    c.boundary.boundary
                )
            })?;
        }
        Ok(())
    }

    /// The crossing boundary `event` belongs to, if any.
    fn of_event(&self, event: &str) -> Option<&Crossing> {
        self.by_boundary
            .values()
            .find(|c| event == c.boundary.ready() || event == c.boundary.consumed())
    }

    /// A wait on `stream` for `event` at step `t` whose record happens in another process:
    /// `Some` when the crossing stands in for it.
    pub(super) fn wait(&self, stream: &CudaStream, event: &str, t: u64) -> Option<Result<()>> {
        let c = self.of_event(event)?;
        Some(match &c.end {
            // the receive that follows is the wait
            End::Recv { .. } if event == c.boundary.ready() => Ok(()),
            End::Send { sent, .. } if event == c.boundary.consumed() => {
                let slot = c.boundary.send_slot(t) as usize;
                stream
                    .wait(&sent[slot])
                    .map_err(|e| anyhow!("waiting for the send of `{event}`'s slot: {e:?}"))
            }
            _ => Err(anyhow!(
                "`{event}` is waited on by the rank that records it, across processes"
            )),
        })
    }

    /// After the record of `event` at step `t` (of `rows` token rows): the send of the slot
    /// the step wrote, when `event` is the ready record of a boundary to another process.
    pub(super) fn recorded(
        &self,
        ranks: &[RankDevice],
        event: &str,
        t: u64,
        rows: usize,
    ) -> Result<()> {
        let Some(c) = self.of_event(event) else {
            return Ok(());
        };
        match &c.end {
            End::Send { rank, sent } if event == c.boundary.ready() => {
                let slot = c.boundary.send_slot(t);
                c.send(&ranks[*rank], slot, rows)?;
                sent[slot as usize]
                    .record(&c.comm.stream())
                    .map_err(|e| anyhow!("recording the send of `{event}`: {e:?}"))
            }
            _ => Ok(()),
        }
    }

    /// The copy of `boundary` at step `t` (of `rows` token rows) when its sender runs in
    /// another process: `Some` with the receive.
    pub(super) fn copy(
        &self,
        ranks: &[RankDevice],
        boundary: u32,
        t: u64,
        rows: usize,
    ) -> Option<Result<()>> {
        let c = self.by_boundary.get(&boundary)?;
        Some(match c.end {
            End::Recv { .. } if t < u64::from(c.boundary.lag) => Ok(()),
            End::Recv { rank } => c.recv(&ranks[rank], c.boundary.recv_slot(t), rows),
            End::Send { .. } => Err(anyhow!(
                "boundary {boundary} is copied by its sender, across processes"
            )),
        })
    }

    /// Takes the sends no step received (the last `lag` of a boundary with lag) after `steps`
    /// steps, so that no send is left waiting when the engine closes.
    pub(super) fn drain(&self, ranks: &[RankDevice], steps: u64) -> Result<()> {
        for c in self.by_boundary.values() {
            if let End::Recv { rank } = c.end {
                for t in 0..steps.min(u64::from(c.boundary.lag)) {
                    // a boundary with lag carries the one sampled token a step
                    c.recv(&ranks[rank], c.boundary.recv_slot(t), 1)?;
                }
            }
        }
        Ok(())
    }
}

impl Crossing {
    /// The rows of a step's slot the boundary carries: every token row of the hidden state,
    /// the one sampled token.
    fn rows(&self, rows: usize) -> usize {
        if self.boundary.carries == Carries::Hidden {
            rows
        } else {
            1
        }
    }

    fn send(&self, rank: &RankDevice, slot: u32, rows: usize) -> Result<()> {
        let span = rank.tx_slot(&self.boundary, slot, self.rows(rows));
        self.comm.send(&span, 1).map_err(|e| {
            anyhow!(
                "cuda backend: nccl send of boundary {}: {e:?}",
                self.boundary.boundary
            )
        })
    }

    fn recv(&self, rank: &RankDevice, slot: u32, rows: usize) -> Result<()> {
        let mut span = rank.rx_slot(&self.boundary, slot, self.rows(rows));
        self.comm.recv(&mut span, 0).map(|_| ()).map_err(|e| {
            anyhow!(
                "cuda backend: nccl receive of boundary {}: {e:?}",
                self.boundary.boundary
            )
        })
    }
}

/// Refuses groups whose members run in different processes over the one-shot transport,
/// which reaches other members through peer memory of one process.
pub(super) fn check_groups(plan: &Plan, map: &ProcessMap) -> Result<()> {
    for g in &plan.groups {
        let spans = g
            .ranks
            .iter()
            .any(|&r| map.process_of(r) != map.process_of(g.ranks[0]));
        if spans && g.collective != memra_compiler::plan::Collective::Nccl {
            bail!(
                "group {} spans processes, which its one-shot collectives cannot reach (they use peer memory within one process); compile the placement with [transport] collective = \"nccl\", or run the plan in one process (without launch)",
                g.group
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::two_ranks_per_device;
    use memra_compiler::plan::Collective;

    // two_ranks_per_device: PP-2 x TP-2 over two devices, so both groups span the two processes

    #[test]
    fn one_shot_groups_across_processes_are_refused_by_name() {
        let plan = two_ranks_per_device();
        let map = ProcessMap::of(&plan);
        let e = check_groups(&plan, &map).unwrap_err().to_string();
        assert!(
            e.starts_with("group 0 spans processes") && e.contains("collective = \"nccl\""),
            "{e}"
        );
    }

    #[test]
    fn nccl_groups_across_processes_are_taken() {
        let mut plan = two_ranks_per_device();
        for g in &mut plan.groups {
            g.collective = Collective::Nccl;
        }
        assert!(check_groups(&plan, &ProcessMap::of(&plan)).is_ok());
    }

    #[test]
    fn groups_inside_one_process_keep_the_one_shot_transport() {
        // the same ranks all on device 0: one process holds both groups
        let mut plan = two_ranks_per_device();
        for r in &mut plan.ranks {
            r.device = 0;
        }
        assert!(plan
            .groups
            .iter()
            .all(|g| g.collective == Collective::Oneshot));
        assert!(check_groups(&plan, &ProcessMap::of(&plan)).is_ok());
    }
}
