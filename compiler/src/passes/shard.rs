//! Pass 5, shard: give every stage its ranks (one per device of the stage) and copy each
//! stage's nodes onto them. Under tensor parallelism, row-parallel partial sums are followed
//! by an all-reduce node fed by every rank of the group, and the vocab-parallel head by a
//! logits gather; only the group's first rank samples. A placement with replicated
//! attention (expert parallelism) has no all-reduce after the attention output.

use super::build::layer_segments;
use super::build::segment_output;
use super::{RankInfo, Topology};
use crate::graph::{DecodeGraph, Node, NodeKind};
use crate::model::ModelMeta;
use crate::placement::Placement;
use crate::plan::{AttentionSplit, Segment};
use petgraph::stable_graph::NodeIndex;

/// Whether a segment leaves a partial sum that the group must all-reduce: the row-parallel
/// products, and the routed experts (each rank holds some; the rows of the others are zero).
/// Experts and shared experts of one layer are reduced together, after the shared ones.
pub fn ends_partial(segments: &[Segment], segment: Segment, attention: AttentionSplit) -> bool {
    match segment {
        Segment::AttnOut => attention == AttentionSplit::Heads,
        Segment::Ffn | Segment::MoeShared => true,
        Segment::MoeExperts => !segments.contains(&Segment::MoeShared),
        _ => false,
    }
}

/// Expand the one-rank graph over the placement's stages and TP groups.
pub fn shard(
    logical: &DecodeGraph,
    model: &ModelMeta,
    placement: &Placement,
) -> (DecodeGraph, Topology) {
    let mut g = DecodeGraph::default();
    let mut topo = Topology::default();
    let last_stage = placement.stages.len() - 1;
    for (s, stage) in placement.stages.iter().enumerate() {
        let tp = stage.devices.len() as u32;
        let first_rank = topo.ranks.len() as u32;
        let mut reduce_nodes: Vec<Vec<(NodeIndex, NodeIndex)>> = Vec::new();
        let mut gathers: Vec<(NodeIndex, NodeIndex)> = Vec::new();
        for (i, &device) in stage.devices.iter().enumerate() {
            let rank = first_rank + i as u32;
            let info = RankInfo {
                rank,
                stage: s as u32,
                device,
                tp_index: i as u32,
                tp_degree: tp,
                layers: stage.layers,
                embed: s == 0,
                head: s == last_stage,
                sampler: s == last_stage && i == 0,
            };
            let mut prev: Option<(NodeIndex, (&'static str, u64))> = None;
            let mut reduces = Vec::new();
            let d = model.residual_width();
            let heads = match placement.attention {
                AttentionSplit::Heads => model.heads / tp,
                AttentionSplit::Replicated => model.heads,
            };
            for node in logical.rank_nodes(0) {
                let keep = match &node.kind {
                    NodeKind::Embed => info.embed,
                    NodeKind::Layer { layer, .. } => stage.layers.contains(*layer),
                    NodeKind::Head => info.head,
                    NodeKind::Sample => info.sampler,
                    _ => false,
                };
                if !keep {
                    continue;
                }
                let ix = g.push(Node {
                    rank,
                    ..node.clone()
                });
                link(&mut g, prev, ix);
                let out = match &node.kind {
                    NodeKind::Embed => ("hidden", d),
                    NodeKind::Layer { segment, .. } => segment_output(model, *segment, heads),
                    NodeKind::Head => ("logits", u64::from(model.vocab / tp)),
                    _ => ("token", 1),
                };
                prev = Some((ix, out));
                if node.kind == NodeKind::Head && tp > 1 {
                    let gather = g.push(Node {
                        kind: NodeKind::GatherLogits,
                        rank,
                        ..node.clone()
                    });
                    link(&mut g, prev, gather);
                    gathers.push((ix, gather));
                    prev = Some((gather, ("logits", u64::from(model.vocab))));
                }
                if let NodeKind::Layer { layer, segment } = node.kind {
                    let segments = layer_segments(model, layer);
                    if tp > 1 && ends_partial(&segments, segment, placement.attention) {
                        let kind = NodeKind::Layer {
                            layer,
                            segment: Segment::AllReduce,
                        };
                        let ar = g.push(Node {
                            kind,
                            rank,
                            ..node.clone()
                        });
                        link(&mut g, prev, ar);
                        reduces.push((ix, ar));
                        prev = Some((ar, ("hidden", d)));
                    }
                }
            }
            reduce_nodes.push(reduces);
            topo.ranks.push(info);
        }
        // Every rank's all-reduce reads every other rank's partial sum.
        for (i, mine) in reduce_nodes.iter().enumerate() {
            for (j, theirs) in reduce_nodes.iter().enumerate() {
                if i != j {
                    for (&(_, ar), &(partial, _)) in mine.iter().zip(theirs) {
                        g.connect(partial, ar, "partial", u64::from(model.embedding));
                    }
                }
            }
        }
        // The first rank's gather reads every other rank's vocab slice.
        if let Some(&(_, gather0)) = gathers.first() {
            for &(head, _) in &gathers[1..] {
                g.connect(head, gather0, "logits", u64::from(model.vocab / tp));
            }
        }
    }
    (g, topo)
}

fn link(g: &mut DecodeGraph, prev: Option<(NodeIndex, (&'static str, u64))>, to: NodeIndex) {
    if let Some((from, (name, elems))) = prev {
        g.connect(from, to, name, elems);
    }
}
