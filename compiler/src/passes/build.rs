//! Pass 4, build: the one-rank dataflow graph of a decode step, straight from the model:
//! embed, each layer's segments, head, sampling.

use crate::graph::{DecodeGraph, Node, NodeKind, StreamKind};
use crate::model::{FfnKind, Mixer, ModelMeta};
use crate::plan::Segment;

/// The segments of `layer`, in order, for a one-rank run (no all-reduces): the layer
/// schema's mixer, then its FFN, each after its mHC mixing when the residual has streams.
pub fn layer_segments(model: &ModelMeta, layer: u32) -> Vec<Segment> {
    let kind = model.layer_kind(layer);
    let mhc = model.mhc.is_some();
    let mut segs = Vec::new();
    if mhc {
        segs.push(Segment::HcAttnPre);
    }
    segs.extend(match kind.mixer {
        Mixer::Gqa => [Segment::AttnPre, Segment::AttnCore].as_slice(),
        Mixer::Mla => &[Segment::MlaPre, Segment::MlaCore],
        Mixer::Dsa => &[Segment::MlaPre, Segment::DsaSelect, Segment::MlaCore],
        // the selection of the closest full DSA layer before it, on this rank or received
        Mixer::DsaShared => &[Segment::MlaPre, Segment::MlaCore],
        Mixer::Kda => &[Segment::KdaPre, Segment::KdaCore],
    });
    segs.push(Segment::AttnOut);
    if mhc {
        segs.push(Segment::HcFfnPre);
    }
    match kind.ffn {
        FfnKind::Dense => segs.push(Segment::Ffn),
        FfnKind::Moe { shared } => {
            segs.extend([Segment::MoeRouter, Segment::MoeExperts]);
            if shared {
                segs.push(Segment::MoeShared);
            }
        }
    }
    segs
}

/// Elements a segment hands to the next one on one rank of a group whose attention runs
/// `heads` of the model's heads on each rank.
pub fn segment_output(model: &ModelMeta, segment: Segment, heads: u32) -> (&'static str, u64) {
    let d = u64::from(model.embedding);
    let heads = u64::from(heads);
    match segment {
        // the sublayer's input: the streams weighted into one row
        Segment::HcAttnPre | Segment::HcFfnPre => ("input", d),
        Segment::DsaSelect => {
            // the cells the token's softmax runs over
            let x = model
                .dsa
                .as_ref()
                .expect("invariant: dsa segments need dsa facts");
            ("cells", u64::from(x.top_k + x.kpool - 1))
        }
        Segment::AttnPre => {
            // a rank whose heads share kv heads with another rank holds a copy of them
            let kv = (u64::from(model.kv_heads) * heads / u64::from(model.heads)).max(1);
            ("qkv", (heads + 2 * kv) * u64::from(model.head_dim))
        }
        Segment::MlaPre => {
            // each head's query in latent space plus the token's latent and rope key
            let m = model
                .mla
                .as_ref()
                .expect("invariant: mla segments need mla facts");
            let row = u64::from(m.kv_lora_rank + m.qk_rope_head_dim);
            ("q_latent", heads * row + row)
        }
        Segment::AttnCore | Segment::MlaCore => (
            "attn",
            u64::from(model.attn_out_width()) * heads / u64::from(model.heads),
        ),
        Segment::KdaPre => {
            // q, k, v after the convolutions, the decay gate per channel, beta per head
            let w = u64::from(model.kda_width()) * heads / u64::from(model.heads);
            ("qkv_gates", 4 * w + heads)
        }
        Segment::KdaCore => (
            "attn",
            u64::from(model.kda_width()) * heads / u64::from(model.heads),
        ),
        Segment::MoeRouter => (
            "routing",
            u64::from(model.moe.as_ref().map_or(0, |m| m.top_k)),
        ),
        Segment::AttnOut
        | Segment::AllReduce
        | Segment::Ffn
        | Segment::MoeExperts
        | Segment::MoeShared => ("hidden", model.residual_width()),
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
    let mut prev = g.push(node(NodeKind::Embed));
    let mut out = ("hidden", model.residual_width());
    for layer in 0..model.layers {
        for segment in layer_segments(model, layer) {
            let ix = g.push(node(NodeKind::Layer { layer, segment }));
            g.connect(prev, ix, out.0, out.1);
            out = segment_output(model, segment, model.heads);
            prev = ix;
        }
    }
    let head = g.push(node(NodeKind::Head));
    g.connect(prev, head, out.0, out.1);
    let sample = g.push(node(NodeKind::Sample));
    g.connect(head, sample, "logits", u64::from(model.vocab));
    g
}
