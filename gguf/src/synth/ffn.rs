//! Feed-forward tensor groups shared by the synthetic architectures: a gated SiLU FFN (dense
//! layers and shared experts differ only in the name suffix) and the routed experts of a MoE
//! layer, laid out as llama.cpp's converters store them: one 3-d tensor per projection with
//! the expert index outermost, and the router kept in F32.

use super::plan::{f32_uniform, matrix, Planned};
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
pub(crate) fn gated(
    b: &str,
    suffix: &str,
    dim: u64,
    ffn: u64,
    res: f32,
    dtype: GgmlType,
) -> Vec<Planned> {
    vec![
        matrix(
            format!("{b}.ffn_gate{suffix}.weight"),
            &[dim, ffn],
            1.0,
            dtype,
        ),
        matrix(
            format!("{b}.ffn_up{suffix}.weight"),
            &[dim, ffn],
            1.0,
            dtype,
        ),
        matrix(
            format!("{b}.ffn_down{suffix}.weight"),
            &[ffn, dim],
            res,
            dtype,
        ),
    ]
}

/// The router (`ffn_gate_inp`, F32 as the converter forces it), the optional selection bias
/// and the three expert tensors of block `b`.
pub(crate) fn routed(b: &str, dim: u64, r: &Routed, res: f32, dtype: GgmlType) -> Vec<Planned> {
    let gate_inp = matrix(
        format!("{b}.ffn_gate_inp.weight"),
        &[dim, r.experts],
        1.0,
        GgmlType::F32,
    );
    let mut p = vec![gate_inp];
    if r.probs_bias {
        p.push(f32_uniform(
            format!("{b}.exp_probs_b.bias"),
            &[r.experts],
            PROBS_BIAS,
        ));
    }
    let (e, f) = (r.experts, r.ffn);
    p.push(matrix(
        format!("{b}.ffn_gate_exps.weight"),
        &[dim, f, e],
        1.0,
        dtype,
    ));
    p.push(matrix(
        format!("{b}.ffn_up_exps.weight"),
        &[dim, f, e],
        1.0,
        dtype,
    ));
    p.push(matrix(
        format!("{b}.ffn_down_exps.weight"),
        &[f, dim, e],
        res,
        dtype,
    ));
    p
}
