//! Pass 4, build: the one-rank dataflow graph of a decode step, straight from the model:
//! embed, each layer's segments, head, sampling.

use crate::graph::{DecodeGraph, Node, NodeKind, StreamKind};
use crate::model::ModelMeta;
use crate::plan::Segment;

/// The segments of `layer`, in order, for a one-rank run (no all-reduces).
pub fn layer_segments(model: &ModelMeta, layer: u32) -> Vec<Segment> {
    let mut segs = vec![Segment::AttnPre, Segment::AttnCore, Segment::AttnOut];
    match &model.moe {
        Some(moe) if model.is_moe_layer(layer) => {
            segs.extend([Segment::MoeRouter, Segment::MoeExperts]);
            if moe.shared_expert_ffn > 0 {
                segs.push(Segment::MoeShared);
            }
        }
        _ => segs.push(Segment::Ffn),
    }
    segs
}

/// Elements a segment hands to the next one on one rank of a group of `tp`.
pub fn segment_output(model: &ModelMeta, segment: Segment, tp: u32) -> (&'static str, u64) {
    let d = u64::from(model.embedding);
    let tp = u64::from(tp);
    match segment {
        Segment::AttnPre => {
            let qkv = match &model.mla {
                Some(m) => {
                    u64::from(model.heads) * u64::from(m.qk_nope_head_dim + m.qk_rope_head_dim)
                        + u64::from(m.kv_lora_rank + m.qk_rope_head_dim) * tp
                }
                None => u64::from((model.heads + 2 * model.kv_heads) * model.head_dim),
            };
            ("qkv", qkv / tp)
        }
        Segment::AttnCore => ("attn", u64::from(model.attn_out_width()) / tp),
        Segment::MoeRouter => (
            "routing",
            u64::from(model.moe.as_ref().map_or(0, |m| m.top_k)),
        ),
        Segment::AttnOut
        | Segment::AllReduce
        | Segment::Ffn
        | Segment::MoeExperts
        | Segment::MoeShared => ("hidden", d),
    }
}

/// The graph of one decode step on a single rank.
pub fn build(model: &ModelMeta) -> DecodeGraph {
    let mut g = DecodeGraph::default();
    let node = |kind| Node {
        kind,
        rank: 0,
        stream: StreamKind::Compute,
        eager: None,
    };
    let d = u64::from(model.embedding);
    let mut prev = g.push(node(NodeKind::Embed));
    let mut out = ("hidden", d);
    for layer in 0..model.layers {
        for segment in layer_segments(model, layer) {
            let ix = g.push(node(NodeKind::Layer { layer, segment }));
            g.connect(prev, ix, out.0, out.1);
            out = segment_output(model, segment, 1);
            prev = ix;
        }
    }
    let head = g.push(node(NodeKind::Head));
    g.connect(prev, head, out.0, out.1);
    let sample = g.push(node(NodeKind::Sample));
    g.connect(head, sample, "logits", u64::from(model.vocab));
    g
}
