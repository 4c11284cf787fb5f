//! Synthetic `deepseek2` shapes: multi-head latent attention (with or without the q low-rank
//! path, with the k/v up-projection stored split as `attn_k_b`/`attn_v_b` for absorbed
//! decode, YaRN rope metadata), leading dense layers, then MoE layers with shared experts and
//! DeepSeek-V2 (softmax) or DeepSeek-V3 (sigmoid, selection bias, expert groups) routing. Keys
//! and tensors are the ones llama.cpp's converter writes for DeepSeek checkpoints.

use anyhow::{bail, Result};

use super::emit::{common_head, head_of, keyed, Head, Spec};
use super::ffn::DeepseekMoe;
use super::plan::{residual, Block, Planned};
use crate::{GgmlType, Value};

/// How router logits become expert probabilities (`expert_gating_func`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gating {
    /// Softmax over all experts (DeepSeek-V2); id 1.
    Softmax,
    /// Sigmoid of each logit (DeepSeek-V3); id 2.
    Sigmoid,
}

impl Gating {
    /// The value llama.cpp stores in `expert_gating_func`.
    pub fn id(self) -> u32 {
        match self {
            Gating::Softmax => 1,
            Gating::Sigmoid => 2,
        }
    }
}

/// YaRN context extension as DeepSeek checkpoints configure it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// `rope.scaling.factor`.
    pub factor: f32,
    /// `rope.scaling.original_context_length`.
    pub original_context: u32,
    /// The checkpoint's `mscale_all_dim`; stored as `rope.scaling.yarn_log_multiplier`, 0.1
    /// times it rounded once to f32 as the converter computes it.
    pub mscale_all_dim: f64,
}

/// How a DeepSeek router picks and weighs experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    /// Expert groups (1: no group selection).
    pub groups: u32,
    /// Groups kept before the top-k.
    pub groups_used: u32,
    /// Router probability function.
    pub gating: Gating,
    /// Whether MoE layers carry the `exp_probs_b` selection bias.
    pub probs_bias: bool,
    /// Whether the selected weights are normalized to sum 1 (`expert_weights_norm`).
    pub norm_weights: bool,
    /// `expert_weights_scale` (DeepSeek's routed_scaling_factor).
    pub weights_scale: f32,
}

impl Routing {
    /// DeepSeek-V2: softmax over all experts, no groups, no bias, weights as selected.
    pub const V2: Routing = Routing {
        groups: 1,
        groups_used: 1,
        gating: Gating::Softmax,
        probs_bias: false,
        norm_weights: false,
        weights_scale: 1.0,
    };

    /// DeepSeek-V3: sigmoid with a selection bias, the best `groups_used` of `groups` expert
    /// groups, normalized weights scaled by 2.5.
    pub const fn v3(groups: u32, groups_used: u32) -> Routing {
        Routing {
            groups,
            groups_used,
            gating: Gating::Sigmoid,
            probs_bias: true,
            norm_weights: true,
            weights_scale: 2.5,
        }
    }
}

/// A DeepSeek-V2/V3 shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deepseek2Shape {
    /// Name used on the command line.
    pub name: &'static str,
    /// Embedding width.
    pub dim: u64,
    /// Number of transformer blocks.
    pub layers: u32,
    /// Attention heads.
    pub heads: u32,
    /// The attention's widths.
    pub mla: Mla,
    /// The dense and MoE FFN layers.
    pub moe: DeepseekMoe,
    /// How tokens pick their experts.
    pub routing: Routing,
    /// Vocabulary size.
    pub vocab: u64,
    /// `context_length`.
    pub context: u32,
    /// `rope.freq_base`.
    pub rope_base: f32,
    /// YaRN scaling.
    pub yarn: Yarn,
}

/// The tiny DeepSeek-V3 layout: q-lora, grouped sigmoid routing, one leading dense layer.
const TINY: Deepseek2Shape = Deepseek2Shape {
    name: "tiny-deepseek2",
    dim: 256,
    layers: 3,
    heads: 4,
    mla: Mla::TINY,
    moe: DeepseekMoe {
        experts: 16,
        experts_used: 4,
        ..DeepseekMoe::TINY
    },
    routing: Routing::v3(4, 2),
    vocab: 256,
    context: 16384,
    rope_base: 10000.0,
    yarn: Yarn {
        factor: 4.0,
        original_context: 4096,
        mscale_all_dim: 1.0,
    },
};

/// The deepseek2 shapes. The tiny ones keep every row that k-quants could take a multiple of
/// 256; their per-head widths (64) fall back to Q8_0 under a k-quant, as llama.cpp's quantizer
/// does.
pub const DEEPSEEK2_SHAPES: &[Deepseek2Shape] = &[
    TINY,
    // V2-Lite's layout at the tiny size: no q-lora, fewer experts, two shared, V2 routing.
    Deepseek2Shape {
        name: "tiny-deepseek2-lite",
        mla: Mla {
            q_lora_rank: 0,
            ..Mla::TINY
        },
        moe: DeepseekMoe {
            shared_experts: 2,
            ..DeepseekMoe::TINY
        },
        routing: Routing::V2,
        yarn: Yarn {
            mscale_all_dim: 0.707,
            ..TINY.yarn
        },
        ..TINY
    },
    Deepseek2Shape {
        name: "deepseek-v2-lite",
        dim: 2048,
        layers: 27,
        heads: 16,
        mla: Mla::LATENT_512,
        moe: DeepseekMoe {
            ffn: 10944,
            dense_layers: 1,
            experts: 64,
            experts_used: 6,
            expert_ffn: 1408,
            shared_experts: 2,
        },
        routing: Routing::V2,
        vocab: 102_400,
        context: 163_840,
        rope_base: 10000.0,
        yarn: Yarn {
            factor: 40.0,
            original_context: 4096,
            mscale_all_dim: 0.707,
        },
    },
    Deepseek2Shape {
        name: "deepseek-v3",
        dim: 7168,
        layers: 61,
        heads: 128,
        mla: Mla {
            q_lora_rank: 1536,
            ..Mla::LATENT_512
        },
        moe: DeepseekMoe {
            ffn: 18432,
            dense_layers: 3,
            experts: 256,
            experts_used: 8,
            expert_ffn: 2048,
            shared_experts: 1,
        },
        routing: Routing::v3(8, 4),
        vocab: 129_280,
        context: 163_840,
        rope_base: 10000.0,
        yarn: Yarn {
            factor: 40.0,
            original_context: 4096,
            mscale_all_dim: 1.0,
        },
    },
];

/// RMS-norm epsilon of DeepSeek checkpoints.
const RMS_EPS: f32 = 1e-6;

impl Deepseek2Shape {
    /// This shape cut to its first `layers` blocks (leading dense layers included as far as
    /// they reach). llama.cpp takes a deepseek2 file of 26 or
    /// 27 blocks for a model without q-lora whatever its keys say, so a q-lora shape refuses
    /// those depths.
    pub fn with_layers(mut self, layers: u32) -> Result<Deepseek2Shape> {
        if self.mla.q_lora_rank > 0 && (layers == 26 || layers == 27) {
            bail!(
                "layers: shape `{}` has q-lora, and llama.cpp loads a deepseek2 model of 26 or \
                 27 layers as one without q-lora; use another depth",
                self.name
            );
        }
        self.layers = layers;
        self.moe.dense_layers = self.moe.dense_layers.min(layers);
        Ok(self)
    }
}

/// The widths of an MLA layer, shared by the architectures that have MLA layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mla {
    /// Rank of the q low-rank path; 0 projects q directly with `attn_q` (V2-Lite).
    pub q_lora_rank: u64,
    /// Width of the compressed kv latent.
    pub kv_lora_rank: u64,
    /// Per-head q/k width without rope.
    pub qk_nope: u64,
    /// Per-head q/k width with rope (shared by all heads on the k side).
    pub qk_rope: u64,
    /// Per-head v width.
    pub v_head: u64,
}

impl Mla {
    /// The tiny shapes' widths: q-lora and latent of 256, q/k heads of 64 + 32 rope, v heads
    /// of 64.
    pub const TINY: Mla = Mla {
        q_lora_rank: 256,
        kv_lora_rank: 256,
        qk_nope: 64,
        qk_rope: 32,
        v_head: 64,
    };
    /// The released models' widths (DeepSeek-V2-Lite, V3, Kimi-Linear): a latent of 512, q/k
    /// heads of 128 + 64 rope, v heads of 128, q projected directly (no q-lora).
    pub const LATENT_512: Mla = Mla {
        q_lora_rank: 0,
        kv_lora_rank: 512,
        qk_nope: 128,
        qk_rope: 64,
        v_head: 128,
    };

    /// The keys `attention.key_length` and `value_length` of the absorbed form (MQA over the
    /// latent), then `key_length_mla` and `value_length_mla`, the real per-head widths.
    pub(crate) fn length_keys(&self) -> [(&'static str, Value); 4] {
        let kv = self.kv_lora_rank;
        [
            (
                "attention.key_length",
                Value::U32((kv + self.qk_rope) as u32),
            ),
            ("attention.value_length", Value::U32(kv as u32)),
            (
                "attention.key_length_mla",
                Value::U32((self.qk_nope + self.qk_rope) as u32),
            ),
            ("attention.value_length_mla", Value::U32(self.v_head as u32)),
        ]
    }
}

/// The MLA tensors of block `b` (its attention norm first) in a model of width `dim` with
/// `heads` heads of widths `s`.
pub(crate) fn attention(b: &Block, (dim, heads): (u64, u32), s: &Mla, res: f32) -> Vec<Planned> {
    let h = u64::from(heads);
    let q = h * (s.qk_nope + s.qk_rope);
    let kv = s.kv_lora_rank;
    let mut p = vec![b.norm("attn_norm", dim)];
    if s.q_lora_rank > 0 {
        let r = s.q_lora_rank;
        p.push(b.matrix("attn_q_a", &[dim, r], 1.0));
        p.push(b.norm("attn_q_a_norm", r));
        p.push(b.matrix("attn_q_b", &[r, q], 1.0));
    } else {
        p.push(b.matrix("attn_q", &[dim, q], 1.0));
    }
    p.push(b.matrix("attn_kv_a_mqa", &[dim, kv + s.qk_rope], 1.0));
    p.push(b.norm("attn_kv_a_norm", kv));
    // per head: k_b maps a q_nope row into the latent, v_b maps the latent to a v row
    p.push(b.matrix("attn_k_b", &[s.qk_nope, kv, h], 1.0));
    p.push(b.matrix("attn_v_b", &[kv, s.v_head, h], 1.0));
    p.push(b.matrix("attn_output", &[h * s.v_head, dim], res));
    p
}

/// The tensors of `s` with matrices in `dtype`, in file order.
fn plan(s: &Deepseek2Shape, dtype: GgmlType) -> Vec<Planned> {
    let res = residual(s.layers);
    let ffn = s.moe.ffn(s.dim, s.routing.probs_bias, res);
    ffn.model(s.layers, s.vocab, dtype, |b, _| {
        attention(b, (s.dim, s.heads), &s.mla, res)
    })
}

/// The deepseek2 metadata keys of `s`, in the converter's order. `attention.key_length` and
/// `value_length` describe the absorbed (MQA over the latent) form; the `_mla` keys give the
/// real per-head widths. A shape without q-lora writes `q_lora_rank` 0, which llama.cpp reads
/// as "no q-lora" at any depth (the converter omits the key and llama.cpp then relies on the
/// layer count).
fn metadata(s: &Deepseek2Shape) -> Vec<(String, Value)> {
    let mut kv = common_head(
        head_of!("deepseek2", s, s.moe.ffn),
        [
            ("attention.head_count_kv", Value::U32(1)),
            ("rope.freq_base", Value::F32(s.rope_base)),
            ("attention.layer_norm_rms_epsilon", Value::F32(RMS_EPS)),
        ],
    );
    kv.extend(s.moe.count_keys());
    kv.extend([
        ("expert_group_count", Value::U32(s.routing.groups)),
        ("expert_group_used_count", Value::U32(s.routing.groups_used)),
        ("expert_gating_func", Value::U32(s.routing.gating.id())),
        ("rope.scaling.type", Value::Str("yarn".into())),
        ("rope.scaling.factor", Value::F32(s.yarn.factor)),
        (
            "rope.scaling.original_context_length",
            Value::U32(s.yarn.original_context),
        ),
        ("leading_dense_block_count", Value::U32(s.moe.dense_layers)),
        ("vocab_size", Value::U32(s.vocab as u32)),
        (
            "attention.q_lora_rank",
            Value::U32(s.mla.q_lora_rank as u32),
        ),
        (
            "attention.kv_lora_rank",
            Value::U32(s.mla.kv_lora_rank as u32),
        ),
    ]);
    kv.extend(s.mla.length_keys());
    kv.extend(s.moe.width_keys());
    kv.push(("expert_weights_scale", Value::F32(s.routing.weights_scale)));
    if s.routing.norm_weights {
        kv.push(("expert_weights_norm", Value::Bool(true)));
    }
    kv.push(("rope.dimension_count", Value::U32(s.mla.qk_rope as u32)));
    kv.push((
        "rope.scaling.yarn_log_multiplier",
        Value::F32((0.1 * s.yarn.mscale_all_dim) as f32),
    ));
    keyed("deepseek2", kv)
}

/// The planned model of `s` with matrices in `dtype`.
pub(crate) fn spec(s: &Deepseek2Shape, dtype: GgmlType) -> Spec {
    Spec {
        metadata: metadata(s),
        vocab: s.vocab,
        tensors: plan(s, dtype),
    }
}
