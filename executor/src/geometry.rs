//! The shape facts of one rank's arithmetic, read off the plan once and shared by both backends:
//! which layers it runs, head size, norm epsilon, rope, and the chunk counts of its row-parallel
//! products in the canonical reduction tree.

use memra_compiler::plan::Plan;

use crate::rope::RopeStyle;

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
}

impl RankGeometry {
    /// The geometry of `rank` in `plan`.
    pub fn of(plan: &Plan, rank: u32) -> RankGeometry {
        let r = plan.rank(rank).expect("invariant: a rank of the plan");
        let m = &plan.model;
        let exact = match r.group {
            Some(g) => plan.groups.iter().any(|x| x.group == g && x.exact),
            None => true,
        };
        let c = m.reduction_chunks;
        RankGeometry {
            first_layer: r.layers.start,
            head_dim: m.head_dim as usize,
            eps: m.rms_eps as f32,
            theta: m.rope_theta as f32,
            rope: RopeStyle::of_architecture(&m.architecture),
            row_chunks: exact.then(|| {
                (
                    (c.attn_out / r.tp_degree) as usize,
                    (c.ffn_down / r.tp_degree) as usize,
                )
            }),
            tp_degree: r.tp_degree,
        }
    }
}
