//! Feed-forward tensor groups shared by the synthetic architectures: a gated SiLU FFN (dense
//! layers and shared experts differ only in the name suffix) and the routed experts of a MoE
//! layer, laid out as llama.cpp's converters store them: one 3-d tensor per projection with
//! the expert index outermost, and the router kept in F32.

use super::plan::{f32_uniform, matrix, output_head, token_embd, Block, Planned};
use crate::{GgmlType, Value};

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

/// The FFN layout of a DeepSeek-style model (deepseek2, kimi-linear, glm5-next): leading
/// dense layers, then MoE layers with shared experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeepseekMoe {
    /// Hidden width of the leading dense layers.
    pub ffn: u64,
    /// Leading layers with a dense FFN instead of MoE.
    pub dense_layers: u32,
    /// Routed experts per MoE layer.
    pub experts: u32,
    /// Experts used per token.
    pub experts_used: u32,
    /// Hidden width of one expert (and of each shared expert).
    pub expert_ffn: u64,
    /// Shared experts, fused into one FFN `expert_ffn * shared_experts` wide.
    pub shared_experts: u32,
}

impl DeepseekMoe {
    /// The tiny shapes' layout: one dense layer of 512, then 8 experts of 256 (2 used) and one
    /// shared.
    pub const TINY: DeepseekMoe = DeepseekMoe {
        ffn: 512,
        dense_layers: 1,
        experts: 8,
        experts_used: 2,
        expert_ffn: 256,
        shared_experts: 1,
    };

    /// These layers of a model of width `dim`, with the selection bias if `probs_bias` and
    /// down projections divided by `res`.
    pub(crate) fn ffn(&self, dim: u64, probs_bias: bool, res: f32) -> DeepseekFfn {
        DeepseekFfn {
            dim,
            dense_layers: self.dense_layers,
            dense_ffn: self.ffn,
            experts: Routed {
                experts: u64::from(self.experts),
                ffn: self.expert_ffn,
                probs_bias,
            },
            shared_ffn: self.expert_ffn * u64::from(self.shared_experts),
            res,
        }
    }

    /// The keys `expert_count` and `expert_used_count`.
    pub(crate) fn count_keys(&self) -> [(&'static str, Value); 2] {
        [
            ("expert_count", Value::U32(self.experts)),
            ("expert_used_count", Value::U32(self.experts_used)),
        ]
    }

    /// The keys `expert_feed_forward_length` and `expert_shared_count`.
    pub(crate) fn width_keys(&self) -> [(&'static str, Value); 2] {
        [
            (
                "expert_feed_forward_length",
                Value::U32(self.expert_ffn as u32),
            ),
            ("expert_shared_count", Value::U32(self.shared_experts)),
        ]
    }
}

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
