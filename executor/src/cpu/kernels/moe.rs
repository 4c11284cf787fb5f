//! Mixture-of-experts routing and the weighted combine, with llama.cpp's `build_moe_ffn`
//! semantics: router probabilities by softmax or sigmoid; an optional per-expert bias that
//! changes which experts are selected but not their weights; optional group selection (the
//! best `groups_used` groups by the sum of their two best biased probabilities); the top-k
//! by selection probability, best first; weights optionally normalized by their sum (clamped
//! below at 2^-14) and scaled.
//!
//! Numerics contract of the combine (every plan gives the 1-rank bits): the selected experts'
//! outputs, each multiplied by its weight, are rows `0..k` of one buffer in selection order;
//! an optional last row holds the shared experts' output. Under tensor or expert parallelism
//! each rank fills the rows of the experts it holds and writes `-0.0` into the others
//! (`x + -0.0 == x` for every float, `-0.0` included), and its shared-expert partial into the
//! last row; the group's all-reduce, in its canonical tree, then leaves every rank exactly the
//! 1-rank buffer: each expert row is one rank's value plus negative zeros, the shared row the
//! canonical subtree sum. Every rank then adds the rows in one fixed order, the order ggml's
//! graph adds them: `((r0 + r1) + r2) + ...`, then the shared row.

pub use memra_compiler::plan::Gating;
use memra_compiler::plan::MoeSummary;

use super::softmax;

/// A router's settings (from the plan's `model.moe`).
#[derive(Clone, Debug, PartialEq)]
pub struct Router {
    pub gating: Gating,
    /// Experts selected per token.
    pub top_k: usize,
    /// Expert groups (1: none) and the groups kept.
    pub groups: usize,
    pub groups_used: usize,
    /// Divide the selected weights by their sum.
    pub norm_weights: bool,
    /// Factor on the selected weights.
    pub scale: f32,
}

/// Smallest weight sum divided by (the smallest normal f16, as llama.cpp clamps).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// Indices of `values`, largest first; ties go to the lower index.
fn order_desc(values: &[f32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx
}

impl Router {
    /// The router a plan's `model.moe` describes.
    pub fn of(m: &MoeSummary) -> Router {
        Router {
            gating: m.gating,
            top_k: m.top_k as usize,
            groups: m.groups as usize,
            groups_used: m.groups_used as usize,
            norm_weights: m.norm_weights,
            scale: m.weights_scale as f32,
        }
    }

    /// The selected experts, best first, with their weights, from the router logits and the
    /// selection bias (`exp_probs_b`, if the model has it).
    pub fn route(&self, logits: &[f32], bias: Option<&[f32]>) -> Vec<(usize, f32)> {
        let n = logits.len();
        assert!(
            (1..=n).contains(&self.top_k),
            "route: top_k {} of {n} experts",
            self.top_k
        );
        let mut probs = logits.to_vec();
        match self.gating {
            Gating::Softmax => softmax(&mut probs),
            Gating::Sigmoid => probs
                .iter_mut()
                .for_each(|p| *p = 1.0 / (1.0 + (-*p).exp())),
        }
        let mut select: Vec<f32> = match bias {
            Some(b) => probs.iter().zip(b).map(|(p, b)| p + b).collect(),
            None => probs.clone(),
        };
        if self.groups > 1 {
            let per = n / self.groups;
            let scores: Vec<f32> = select
                .chunks_exact(per)
                .map(|g| {
                    let best = order_desc(g);
                    g[best[0]] + g[best[1]]
                })
                .collect();
            let kept = &order_desc(&scores)[..self.groups_used];
            for (g, chunk) in select.chunks_exact_mut(per).enumerate() {
                if !kept.contains(&g) {
                    chunk.fill(f32::NEG_INFINITY);
                }
            }
        }
        let mut chosen: Vec<(usize, f32)> = order_desc(&select)[..self.top_k]
            .iter()
            .map(|&e| (e, probs[e]))
            .collect();
        if self.norm_weights {
            let sum: f64 = chosen.iter().map(|&(_, w)| f64::from(w)).sum();
            let sum = (sum as f32).max(MIN_WEIGHT_SUM);
            chosen.iter_mut().for_each(|(_, w)| *w /= sum);
        }
        if self.scale != 0.0 && self.scale != 1.0 {
            chosen.iter_mut().for_each(|(_, w)| *w *= self.scale);
        }
        chosen
    }
}

/// `x += (((r0 + r1) + ...) + r[k-1]) (+ shared)`: the MoE block's output from `rows`
/// (`k` expert rows of `x.len()` values, then the shared experts' row when `shared`).
pub fn combine_into(rows: &[f32], k: usize, shared: bool, x: &mut [f32]) {
    let d = x.len();
    assert_eq!(
        rows.len(),
        (k + usize::from(shared)) * d,
        "combine: rows do not match k and the width"
    );
    let mut out = rows[..d].to_vec();
    for row in rows[d..].chunks_exact(d) {
        out.iter_mut().zip(row).for_each(|(o, &r)| *o += r);
    }
    x.iter_mut().zip(&out).for_each(|(x, &o)| *x += o);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(gating: Gating, top_k: usize, groups: (usize, usize), norm: bool) -> Router {
        Router {
            gating,
            top_k,
            groups: groups.0,
            groups_used: groups.1,
            norm_weights: norm,
            scale: 1.0,
        }
    }

    #[test]
    fn softmax_routing_matches_a_plain_version() {
        let logits = [0.3f32, -1.2, 2.0, 0.7, 1.9, -0.4, 0.0, 1.1];
        let got = router(Gating::Softmax, 3, (1, 1), true).route(&logits, None);
        let exps: Vec<f64> = logits.iter().map(|&l| f64::from(l).exp()).collect();
        let total: f64 = exps.iter().sum();
        let picked = [2usize, 4, 7];
        let sum: f64 = picked.iter().map(|&e| exps[e] / total).sum();
        for (&(e, w), &want) in got.iter().zip(&picked) {
            assert_eq!(e, want);
            let want_w = exps[want] / total / sum;
            assert!((f64::from(w) - want_w).abs() < 1e-6, "{e}: {w} vs {want_w}");
        }
        // without normalization the weights are the probabilities themselves
        let raw = router(Gating::Softmax, 2, (1, 1), false).route(&logits, None);
        assert!((f64::from(raw[0].1) - exps[2] / total).abs() < 1e-6);
    }

    #[test]
    fn bias_moves_the_selection_but_not_the_weights() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let bias = [0.0f32, 0.0, 0.0, 0.5];
        let r = Router {
            scale: 2.5,
            ..router(Gating::Sigmoid, 1, (1, 1), false)
        };
        let got = r.route(&logits, Some(&bias));
        assert_eq!(got[0].0, 0);
        let biased = r.route(&logits, Some(&[0.0, 0.0, 0.0, 1.0]));
        assert_eq!(biased[0].0, 3, "sigmoid(-1) + 1 beats sigmoid(2)");
        let sigmoid = 1.0 / (1.0 + 1f32.exp());
        assert_eq!(biased[0].1, sigmoid * 2.5);
    }

    #[test]
    fn groups_keep_only_the_best_groups() {
        // groups of 2: {0,1} scores 0.9+0.1, {2,3} 0.5+0.5, {4,5} 0.8+0.0
        let logits = [0.9f32, 0.1, 0.5, 0.5, 0.8, 0.0];
        let r = router(Gating::Sigmoid, 2, (3, 1), false);
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let scores: Vec<f32> = [(0.9f32, 0.1f32), (0.5, 0.5), (0.8, 0.0)]
            .iter()
            .map(|&(a, b)| sig(a) + sig(b))
            .collect();
        let best_group = order_desc(&scores)[0];
        let got = r.route(&logits, None);
        let experts: Vec<usize> = got.iter().map(|&(e, _)| e).collect();
        assert!(experts.iter().all(|&e| e / 2 == best_group), "{experts:?}");
        assert_eq!(experts.len(), 2);
    }

    #[test]
    fn combine_adds_rows_in_selection_order_then_the_shared_row() {
        let rows = [1e8f32, 1.0, -1e8, 3.0, 0.5, 0.25];
        let mut x = [10.0f32];
        combine_into(&rows[..3], 3, false, &mut x);
        assert_eq!(x[0], ((1e8f32 + 1.0) + -1e8) + 10.0);
        let mut y = [0.0f32, 1.0];
        combine_into(&rows, 2, true, &mut y);
        assert_eq!(y, [(1e8 + -1e8) + 0.5, (1.0 + 3.0) + 0.25 + 1.0]);
        // negative zeros for experts held elsewhere change nothing
        let mut a = [0.75f32];
        let mut b = [0.75f32];
        combine_into(&[0.3, -0.0, 0.2], 3, false, &mut a);
        combine_into(&[0.3, 0.0, 0.2], 3, false, &mut b);
        assert_eq!(a, [((0.3f32 + -0.0) + 0.2) + 0.75]);
        assert_eq!(a, b);
    }
}
