//! The shape facts of one rank's arithmetic, read off the plan once and shared by both backends:
//! which layers it runs, head size, norm epsilon, rope (with YaRN), whether its attention
//! output is all-reduced, and the chunk counts of its row-parallel products in the canonical
//! reduction tree.

use memra_compiler::plan::{AttentionSplit, Plan};

use crate::rope::{RopeStyle, Yarn};

/// How one rank computes, beyond its weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankGeometry {
    /// The first layer the rank runs (its layer weights are indexed from here).
    pub first_layer: u32,
    pub head_dim: usize,
    pub eps: f32,
    pub theta: f32,
    pub rope: RopeStyle,
    /// Chunks of the attention-output and FFN-down products on this rank: the plan's canonical
    /// counts divided over the group, or `None` when the group does not nest in the tree (each
    /// rank then picks chunks for its own columns).
    pub row_chunks: Option<(usize, usize)>,
    pub tp_degree: u32,
    /// Whether the attention output is a partial sum the group all-reduces (heads split over
    /// a group of several ranks); otherwise the rank adds it to the residual at once.
    pub attn_reduced: bool,
    /// YaRN on the rotated dims, when the model scales its rope.
    pub yarn: Option<Yarn>,
}

impl RankGeometry {
    /// The index among the rank's `held` layers of plan layer `layer`.
    pub fn layer_index(&self, layer: u32, held: usize) -> anyhow::Result<usize> {
        layer
            .checked_sub(self.first_layer)
            .map(|i| i as usize)
            .filter(|&i| i < held)
            .ok_or_else(|| anyhow::anyhow!("layer {layer} is not held by this rank"))
    }

    /// The geometry of `rank` in `plan`.
    pub fn of(plan: &Plan, rank: u32) -> RankGeometry {
        let r = plan.rank(rank).expect("invariant: a rank of the plan");
        let m = &plan.model;
        let group = r
            .group
            .and_then(|g| plan.groups.iter().find(|x| x.group == g));
        let exact = group.is_none_or(|g| g.exact);
        let split_heads = group.is_some_and(|g| g.attention == AttentionSplit::Heads);
        let heads_over = if split_heads { r.tp_degree } else { 1 };
        let c = m.reduction_chunks;
        let rope_dims = m
            .mla
            .as_ref()
            .map_or(m.head_dim, |mla| mla.qk_rope_head_dim);
        let deepseek2 = m.architecture == "deepseek2";
        RankGeometry {
            first_layer: r.layers.start,
            head_dim: m.head_dim as usize,
            eps: m.rms_eps as f32,
            theta: m.rope_theta as f32,
            rope: RopeStyle::of_architecture(&m.architecture),
            row_chunks: exact.then(|| {
                (
                    (c.attn_out / heads_over) as usize,
                    (c.ffn_down / r.tp_degree) as usize,
                )
            }),
            tp_degree: r.tp_degree,
            attn_reduced: split_heads && r.tp_degree > 1,
            yarn: m
                .rope_yarn
                .as_ref()
                .map(|y| Yarn::of(y, rope_dims as usize, m.rope_theta as f32, deepseek2)),
        }
    }
}
