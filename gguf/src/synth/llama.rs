//! Synthetic llama-architecture shapes: the dense GQA transformer llama.cpp calls `llama`,
//! with the tensor names and metadata keys its converter writes.

use std::path::Path;

use anyhow::{anyhow, Result};

use super::emit::{common_head, head_of, keyed, Head, Spec};
use super::ffn::gated;
use super::plan::{output_head, residual, token_embd, Block, Planned};
use crate::{GgmlType, Value};

/// A model shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Name used on the command line.
    pub name: &'static str,
    /// Embedding width.
    pub dim: u64,
    /// Feed-forward hidden width.
    pub ffn: u64,
    /// Number of transformer blocks.
    pub layers: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Vocabulary size.
    pub vocab: u64,
    /// Whether the output projection reuses `token_embd.weight`.
    pub tied: bool,
    /// `llama.context_length`.
    pub context: u32,
    /// `llama.rope.freq_base`.
    pub rope_base: f32,
}

/// The known shapes. `tiny` is 256 wide so every k-quant applies to every matrix.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "tiny",
        dim: 256,
        ffn: 768,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        vocab: 256,
        tied: false,
        context: 512,
        rope_base: 10000.0,
    },
    Shape {
        name: "tiny-tp",
        dim: 256,
        ffn: 512,
        layers: 2,
        heads: 32,
        kv_heads: 8,
        vocab: 512,
        tied: false,
        context: 512,
        rope_base: 10000.0,
    },
    Shape {
        name: "smol135m",
        dim: 576,
        ffn: 1536,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        vocab: 49152,
        tied: true,
        context: 8192,
        rope_base: 100000.0,
    },
    Shape {
        name: "llama1b",
        dim: 2048,
        ffn: 8192,
        layers: 16,
        heads: 32,
        kv_heads: 8,
        vocab: 128256,
        tied: true,
        context: 131072,
        rope_base: 500000.0,
    },
    Shape {
        name: "llama8b",
        dim: 4096,
        ffn: 14336,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        vocab: 128256,
        tied: false,
        context: 131072,
        rope_base: 500000.0,
    },
    // one rank of llama8b under TP-2 as a model of its own (half the heads, the FFN width and
    // the vocabulary): its 1-rank profile is the compute of a TP-2 token without collectives
    Shape {
        name: "llama8b-tp2-rank",
        dim: 4096,
        ffn: 7168,
        layers: 32,
        heads: 16,
        kv_heads: 4,
        vocab: 64128,
        tied: false,
        context: 131072,
        rope_base: 500000.0,
    },
];

/// The shape called `name`; the error lists the known names.
pub fn shape(name: &str) -> Result<Shape> {
    SHAPES
        .iter()
        .find(|s| s.name == name)
        .copied()
        .ok_or_else(|| {
            let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
            anyhow!("unknown shape `{name}`; known shapes: {}", names.join(", "))
        })
}

/// The tensors of `shape` with matrices in `dtype`, in file order.
fn plan(s: &Shape, dtype: GgmlType) -> Vec<Planned> {
    let hd = s.dim / u64::from(s.heads);
    let kv = hd * u64::from(s.kv_heads);
    let res = residual(s.layers);
    let mut p = vec![token_embd(s.dim, s.vocab, dtype)];
    for l in 0..s.layers {
        let b = Block::new(l, dtype);
        p.push(b.norm("attn_norm", s.dim));
        p.push(b.matrix("attn_q", &[s.dim, s.dim], 1.0));
        p.push(b.matrix("attn_k", &[s.dim, kv], 1.0));
        p.push(b.matrix("attn_v", &[s.dim, kv], 1.0));
        p.push(b.matrix("attn_output", &[s.dim, s.dim], res));
        p.push(b.norm("ffn_norm", s.dim));
        p.extend(gated(&b, "", s.dim, s.ffn, res));
    }
    p.extend(output_head(s.dim, s.vocab, s.tied, dtype));
    p
}

/// The llama metadata keys of `s`, in file order.
fn metadata(s: &Shape) -> Vec<(String, Value)> {
    let hd = s.dim / u64::from(s.heads);
    let kv = common_head(
        head_of!("llama", s),
        [
            ("attention.head_count_kv", Value::U32(s.kv_heads)),
            ("rope.freq_base", Value::F32(s.rope_base)),
            ("rope.dimension_count", Value::U32(hd as u32)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("vocab_size", Value::U32(s.vocab as u32)),
        ],
    );
    keyed("llama", kv)
}

/// The planned model of `s` with matrices in `dtype`.
pub(crate) fn spec(s: &Shape, dtype: GgmlType) -> Spec {
    Spec {
        metadata: metadata(s),
        vocab: s.vocab,
        tensors: plan(s, dtype),
    }
}

/// Writes the model for `shape` with matrices in `dtype` to `path`; progress goes to stderr
/// when `progress` is set.
pub fn write_model(
    s: &Shape,
    dtype: GgmlType,
    seed: u64,
    path: &Path,
    progress: bool,
) -> Result<()> {
    super::Model::Llama(*s).write(dtype, seed, path, progress)
}
