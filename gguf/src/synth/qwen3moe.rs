//! Synthetic `qwen3moe` shapes: GQA attention with per-head RMS norms on q and k, and a MoE
//! FFN in every layer (softmax router, normalized top-k weights, no shared expert), with the
//! tensors and metadata keys llama.cpp's converter writes for Qwen3-MoE checkpoints.

use super::emit::{common_head, head_of, keyed, Head, Spec};
use super::ffn::{routed, Routed};
use super::plan::{output_head, residual, token_embd, Block, Planned};
use crate::{GgmlType, Value};

/// A Qwen3-MoE shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Qwen3MoeShape {
    /// Name used on the command line.
    pub name: &'static str,
    /// Embedding width.
    pub dim: u64,
    /// Number of transformer blocks.
    pub layers: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Width of one head (`attention.key_length`); heads * head_dim may differ from `dim`.
    pub head_dim: u64,
    /// `feed_forward_length` as the converter writes it (the checkpoint's dense width; no
    /// qwen3moe layer uses it).
    pub ffn: u64,
    /// Routed experts per layer.
    pub experts: u32,
    /// Experts used per token.
    pub experts_used: u32,
    /// Hidden width of one expert.
    pub expert_ffn: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// `context_length`.
    pub context: u32,
    /// `rope.freq_base`.
    pub rope_base: f32,
}

/// The qwen3moe shapes. `tiny-qwen3moe` keeps every row a multiple of 256 so each k-quant
/// applies, and its heads are wider in total (512) than the embedding (256), as Qwen3-30B-A3B's
/// are (4096 against 2048).
pub const QWEN3MOE_SHAPES: &[Qwen3MoeShape] = &[
    Qwen3MoeShape {
        name: "tiny-qwen3moe",
        dim: 256,
        layers: 2,
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
        ffn: 768,
        experts: 8,
        experts_used: 4,
        expert_ffn: 256,
        vocab: 256,
        context: 512,
        rope_base: 1_000_000.0,
    },
    Qwen3MoeShape {
        name: "qwen3-30b-a3b",
        dim: 2048,
        layers: 48,
        heads: 32,
        kv_heads: 4,
        head_dim: 128,
        ffn: 6144,
        experts: 128,
        experts_used: 8,
        expert_ffn: 768,
        vocab: 151_936,
        context: 40960,
        rope_base: 1_000_000.0,
    },
];

/// RMS-norm epsilon of Qwen3 checkpoints.
const RMS_EPS: f32 = 1e-6;

/// The tensors of `s` with matrices in `dtype`, in file order.
fn plan(s: &Qwen3MoeShape, dtype: GgmlType) -> Vec<Planned> {
    let q = s.head_dim * u64::from(s.heads);
    let kv = s.head_dim * u64::from(s.kv_heads);
    let res = residual(s.layers);
    let experts = Routed {
        experts: u64::from(s.experts),
        ffn: s.expert_ffn,
        probs_bias: false,
    };
    let mut p = vec![token_embd(s.dim, s.vocab, dtype)];
    for l in 0..s.layers {
        let b = Block::new(l, dtype);
        p.push(b.norm("attn_norm", s.dim));
        p.push(b.matrix("attn_q", &[s.dim, q], 1.0));
        p.push(b.norm("attn_q_norm", s.head_dim));
        p.push(b.matrix("attn_k", &[s.dim, kv], 1.0));
        p.push(b.norm("attn_k_norm", s.head_dim));
        p.push(b.matrix("attn_v", &[s.dim, kv], 1.0));
        p.push(b.matrix("attn_output", &[q, s.dim], res));
        p.push(b.norm("ffn_norm", s.dim));
        p.extend(routed(&b, s.dim, &experts, res));
    }
    p.extend(output_head(s.dim, s.vocab, false, dtype));
    p
}

/// The qwen3moe metadata keys of `s`, in the converter's order. The converter writes no
/// `vocab_size` and no `rope.dimension_count` for this architecture (llama.cpp then rotates
/// the whole head).
fn metadata(s: &Qwen3MoeShape) -> Vec<(String, Value)> {
    keyed(
        "qwen3moe",
        common_head(
            head_of!("qwen3moe", s),
            [
                ("attention.head_count_kv", Value::U32(s.kv_heads)),
                ("rope.freq_base", Value::F32(s.rope_base)),
                ("attention.layer_norm_rms_epsilon", Value::F32(RMS_EPS)),
                ("expert_count", Value::U32(s.experts)),
                ("expert_used_count", Value::U32(s.experts_used)),
                ("attention.key_length", Value::U32(s.head_dim as u32)),
                ("attention.value_length", Value::U32(s.head_dim as u32)),
                (
                    "expert_feed_forward_length",
                    Value::U32(s.expert_ffn as u32),
                ),
            ],
        ),
    )
}

/// The planned model of `s` with matrices in `dtype`.
pub(crate) fn spec(s: &Qwen3MoeShape, dtype: GgmlType) -> Spec {
    Spec {
        metadata: metadata(s),
        vocab: s.vocab,
        tensors: plan(s, dtype),
    }
}
