//! Pass 8, partition: mark each node capturable or say why not, then walk each rank's schedule
//! and cut it into steps. Consecutive nodes of one capture class form a graph run (capturable)
//! or an eager island (with its reason); boundary receives and the readback close the current
//! run. Each run is wrapped in the event waits and records that order it against other
//! streams: `ready`/`consumed` for the boundary slots it writes, and the readback pair for the
//! logits and token it writes. A run that touches boundary slots has one phase per distinct
//! set of slot addresses: the lcm of their slot counts (2 for double buffering).

use super::Topology;
use crate::graph::{DecodeGraph, NodeKind, StreamKind};
use crate::placement::Placement;
use crate::plan::{CaptureMode, Carries, IslandReason, LayerRange, Op, Segment, Step};

/// Event the sampler records once logits and token are written.
pub fn logits_ready(rank: u32) -> String {
    format!("r{rank}.logits_ready")
}

/// Event the readback stream records once it has copied logits and token away.
pub fn readback_done(rank: u32) -> String {
    format!("r{rank}.readback_done")
}

/// Decide, for every node, whether it can be captured. Every segment can: MoE routing picks
/// its top-k on the device and the expert products read the chosen ids from device memory;
/// KDA segments read and rewrite their layer's state in place, at one address, so a replay
/// needs no host swap and no second phase. Only the placement (capture mode, forced ranges)
/// makes work eager.
pub fn mark_capture(g: &mut DecodeGraph, placement: &Placement) {
    for node in g.graph.node_weights_mut() {
        let is_op = !matches!(
            node.kind,
            NodeKind::Send { .. } | NodeKind::Recv { .. } | NodeKind::Readback
        );
        node.eager = match (&node.kind, placement.capture) {
            (_, CaptureMode::Eager) if is_op => Some(IslandReason::CaptureDisabled),
            (NodeKind::Layer { layer, .. }, _) => placement
                .forced_eager
                .iter()
                .find(|f| f.layers.contains(*layer))
                .map(|f| IslandReason::Forced(f.reason.clone())),
            _ => None,
        };
    }
}

/// One item of a group before compression into ops.
enum Item {
    Op(Op),
    Layer(u32, Segment),
}

/// A run or island under construction.
struct Group {
    class: Option<IslandReason>,
    items: Vec<Item>,
}

/// Per-rank step lists, in rank order.
pub fn partition(g: &DecodeGraph, topo: &Topology) -> Vec<Vec<Step>> {
    (0..g.ranks()).map(|r| partition_rank(g, topo, r)).collect()
}

fn partition_rank(g: &DecodeGraph, topo: &Topology, rank: u32) -> Vec<Step> {
    let mut out = Builder {
        topo,
        rank,
        steps: Vec::new(),
        runs: 0,
        islands: 0,
        guarded_readback: false,
    };
    let mut group: Option<Group> = None;
    let mut pending_load = false;
    let compute = StreamKind::Compute.name().to_string();
    for node in g.rank_nodes(rank) {
        let item = match &node.kind {
            NodeKind::Recv { boundary } => {
                out.close(group.take());
                let b = &topo.boundaries[*boundary as usize];
                out.steps.push(Step::Wait {
                    stream: compute.clone(),
                    event: b.ready(),
                });
                out.steps.push(Step::Copy {
                    stream: compute.clone(),
                    boundary: *boundary,
                });
                out.steps.push(Step::Record {
                    stream: compute.clone(),
                    event: b.consumed(),
                });
                pending_load |= b.carries == Carries::Hidden;
                continue;
            }
            NodeKind::Readback => {
                out.close(group.take());
                let rb = StreamKind::Readback.name().to_string();
                out.steps.push(Step::Wait {
                    stream: rb.clone(),
                    event: logits_ready(rank),
                });
                out.steps.push(Step::Readback { stream: rb.clone() });
                out.steps.push(Step::Record {
                    stream: rb,
                    event: readback_done(rank),
                });
                continue;
            }
            NodeKind::Send { boundary } => {
                let op = match topo.boundaries[*boundary as usize].carries {
                    Carries::Hidden => Op::StoreHidden,
                    Carries::Token => Op::StoreToken,
                };
                // A store joins whatever group is open: it is as capturable as its producer.
                // One store op serves every boundary of its kind leaving this rank.
                match group.as_mut() {
                    Some(open)
                        if open
                            .items
                            .iter()
                            .any(|i| matches!(i, Item::Op(o) if *o == op)) => {}
                    Some(open) => open.items.push(Item::Op(op)),
                    None => {
                        group = Some(Group {
                            class: None,
                            items: vec![Item::Op(op)],
                        })
                    }
                }
                continue;
            }
            NodeKind::Embed => Item::Op(Op::Embed),
            NodeKind::Head => Item::Op(Op::Head),
            NodeKind::GatherLogits => Item::Op(Op::GatherLogits),
            NodeKind::Sample => Item::Op(Op::Sample),
            NodeKind::Layer { layer, segment } => Item::Layer(*layer, *segment),
        };
        if group.as_ref().is_some_and(|open| open.class != node.eager) {
            out.close(group.take());
        }
        let open = group.get_or_insert_with(|| Group {
            class: node.eager.clone(),
            items: Vec::new(),
        });
        if std::mem::take(&mut pending_load) {
            open.items.push(Item::Op(Op::LoadHidden));
        }
        open.items.push(item);
    }
    out.close(group);
    out.steps
}

/// The id of `rank`'s next step of `kind` (`r0.run0`, `r0.run1`, ...), `count` of them so far.
fn next_id(rank: u32, kind: &str, count: &mut u32) -> String {
    let id = format!("r{rank}.{kind}{count}");
    *count += 1;
    id
}

struct Builder<'a> {
    topo: &'a Topology,
    rank: u32,
    steps: Vec<Step>,
    runs: u32,
    islands: u32,
    guarded_readback: bool,
}

impl Builder<'_> {
    fn close(&mut self, group: Option<Group>) {
        let Some(group) = group else { return };
        let ops = compress(group.items);
        let compute = StreamKind::Compute.name().to_string();
        let stores: Vec<u32> = self
            .topo
            .boundaries
            .iter()
            .filter(|b| b.from_rank == self.rank)
            .filter(|b| {
                let op = match b.carries {
                    Carries::Hidden => Op::StoreHidden,
                    Carries::Token => Op::StoreToken,
                };
                ops.contains(&op)
            })
            .map(|b| b.boundary)
            .collect();
        let writes_readback = self.topo.ranks[self.rank as usize].sampler
            && ops
                .iter()
                .any(|op| matches!(op, Op::Head | Op::GatherLogits | Op::Sample));
        if writes_readback && !self.guarded_readback {
            self.guarded_readback = true;
            let event = readback_done(self.rank);
            self.steps.push(Step::Wait {
                stream: compute.clone(),
                event,
            });
        }
        for &b in &stores {
            let event = self.topo.boundaries[b as usize].consumed();
            self.steps.push(Step::Wait {
                stream: compute.clone(),
                event,
            });
        }
        // the period of the slot addresses the run's graph bakes in
        let phases = self
            .topo
            .boundaries
            .iter()
            .filter(|b| b.addressed_by(self.rank, &ops))
            .fold(1, |acc, b| lcm(acc, b.slots));
        let step = match group.class {
            None => Step::Run {
                id: next_id(self.rank, "run", &mut self.runs),
                stream: compute.clone(),
                phases,
                ops: ops.clone(),
            },
            Some(reason) => Step::Island {
                id: next_id(self.rank, "island", &mut self.islands),
                stream: compute.clone(),
                reason,
                ops: ops.clone(),
            },
        };
        self.steps.push(step);
        for &b in &stores {
            let event = self.topo.boundaries[b as usize].ready();
            self.steps.push(Step::Record {
                stream: compute.clone(),
                event,
            });
        }
        if self.topo.ranks[self.rank as usize].sampler && ops.contains(&Op::Sample) {
            let event = logits_ready(self.rank);
            self.steps.push(Step::Record {
                stream: compute,
                event,
            });
        }
    }
}

/// Least common multiple: a run touching slots of periods a and b repeats every lcm(a, b).
fn lcm(a: u32, b: u32) -> u32 {
    let gcd = |mut x: u32, mut y: u32| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}

/// Turn items into ops, merging runs of layers that have the same segments into one range.
fn compress(items: Vec<Item>) -> Vec<Op> {
    let mut ops: Vec<Op> = Vec::new();
    let mut layer: Option<(u32, Vec<Segment>)> = None;
    let flush = |ops: &mut Vec<Op>, layer: &mut Option<(u32, Vec<Segment>)>| {
        let Some((l, segments)) = layer.take() else {
            return;
        };
        if let Some(Op::Layers {
            layers,
            segments: prev,
        }) = ops.last_mut()
        {
            if *prev == segments && layers.end == l {
                layers.end = l + 1;
                return;
            }
        }
        ops.push(Op::Layers {
            layers: LayerRange {
                start: l,
                end: l + 1,
            },
            segments,
        });
    };
    for item in items {
        match item {
            Item::Layer(l, seg) => match layer.as_mut() {
                Some((cur, segs)) if *cur == l => segs.push(seg),
                _ => {
                    flush(&mut ops, &mut layer);
                    layer = Some((l, vec![seg]));
                }
            },
            Item::Op(op) => {
                flush(&mut ops, &mut layer);
                ops.push(op);
            }
        }
    }
    flush(&mut ops, &mut layer);
    ops
}
