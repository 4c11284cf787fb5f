//! Feed-forward tensor groups shared by the synthetic architectures: a gated SiLU FFN (dense
//! layers and shared experts differ only in the name suffix) and the routed experts of a MoE
//! layer, laid out as llama.cpp's converters store them: one 3-d tensor per projection with
//! the expert index outermost, and the router kept in F32.

use super::plan::{f32_uniform, matrix, output_head, token_embd, Block, Planned};
use crate::GgmlType;

/// The routed experts of one MoE layer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Routed {
    /// Experts in the layer.
    pub experts: u64,
    /// Hidden width of one expert.
    pub ffn: u64,
    /// Whether the layer has the `exp_probs_b` selection bias (DeepSeek-V3 style).
    pub probs_bias: bool,
}

/// Half-width of the uniform `exp_probs_b` values: comparable to the spread of sigmoid router
/// probabilities, so the bias changes which experts are picked.
const PROBS_BIAS: f32 = 0.1;

/// `ffn_gate{suffix}`, `ffn_up{suffix}`, `ffn_down{suffix}` of block `b` for an FFN of hidden
/// width `ffn`; the down projection is divided by `res`.
pub(crate) fn gated(b: &Block, suffix: &str, dim: u64, ffn: u64, res: f32) -> Vec<Planned> {
    vec![
        b.matrix(&format!("ffn_gate{suffix}"), &[dim, ffn], 1.0),
        b.matrix(&format!("ffn_up{suffix}"), &[dim, ffn], 1.0),
        b.matrix(&format!("ffn_down{suffix}"), &[ffn, dim], res),
    ]
}

/// The router (`ffn_gate_inp`, F32 as the converter forces it), the optional selection bias
/// and the three expert tensors of block `b`.
pub(crate) fn routed(b: &Block, dim: u64, r: &Routed, res: f32) -> Vec<Planned> {
    let (e, f) = (r.experts, r.ffn);
    let router = b.name("ffn_gate_inp.weight");
    let mut p = vec![matrix(router, &[dim, e], 1.0, GgmlType::F32)];
    if r.probs_bias {
        p.push(f32_uniform(b.name("exp_probs_b.bias"), &[e], PROBS_BIAS));
    }
    p.push(b.matrix("ffn_gate_exps", &[dim, f, e], 1.0));
    p.push(b.matrix("ffn_up_exps", &[dim, f, e], 1.0));
    p.push(b.matrix("ffn_down_exps", &[f, dim, e], res));
    p
}

/// The FFN half of a DeepSeek-style model's layers: `ffn_norm`, then a dense gated FFN of
/// width `dense_ffn` in the first `dense_layers` layers, else the routed experts and the
/// shared experts of width `shared_ffn`; down projections divided by `res`.
pub(crate) struct DeepseekFfn {
    pub dim: u64,
    pub dense_layers: u32,
    pub dense_ffn: u64,
    pub experts: Routed,
    pub shared_ffn: u64,
    pub res: f32,
}

/// The [`DeepseekFfn`] of `s`, a shape with the fields of one (`dim`, `dense_layers`, `ffn`
/// for the dense layers, `experts`, `expert_ffn`, `shared_experts`), with the selection bias
/// if `probs_bias` and down projections divided by `res`.
macro_rules! deepseek_ffn {
    ($s:expr, $probs_bias:expr, $res:expr) => {
        DeepseekFfn {
            dim: $s.dim,
            dense_layers: $s.dense_layers,
            dense_ffn: $s.ffn,
            experts: Routed {
                experts: u64::from($s.experts),
                ffn: $s.expert_ffn,
                probs_bias: $probs_bias,
            },
            shared_ffn: $s.expert_ffn * u64::from($s.shared_experts),
            res: $res,
        }
    };
}
pub(crate) use deepseek_ffn;

impl DeepseekFfn {
    /// Every tensor of a model of `layers` such layers and `vocab` tokens, matrices in
    /// `dtype`, in file order: the embedding, each layer's `mixer` tensors (block `b` of layer
    /// `l`) then its FFN's, the untied head.
    pub fn model(
        &self,
        layers: u32,
        vocab: u64,
        dtype: GgmlType,
        mut mixer: impl FnMut(&Block, u32) -> Vec<Planned>,
    ) -> Vec<Planned> {
        let mut p = vec![token_embd(self.dim, vocab, dtype)];
        for l in 0..layers {
            let b = Block::new(l, dtype);
            p.extend(mixer(&b, l));
            p.extend(self.tensors(&b, l));
        }
        p.extend(output_head(self.dim, vocab, false, dtype));
        p
    }

    /// The tensors of layer `l` (block `b`).
    pub fn tensors(&self, b: &Block, l: u32) -> Vec<Planned> {
        let mut p = vec![b.norm("ffn_norm", self.dim)];
        if l < self.dense_layers {
            p.extend(gated(b, "", self.dim, self.dense_ffn, self.res));
        } else {
            p.extend(routed(b, self.dim, &self.experts, self.res));
            p.extend(gated(b, "_shexp", self.dim, self.shared_ffn, self.res));
        }
        p
    }
}
