//! Synthetic `kimi-linear` shapes: KDA (Kimi delta attention) layers with MLA layers between
//! them (MLA without q-LoRA and without rope, its k/v up-projection split per head), one
//! leading dense FFN, then MoE layers with a shared expert and sigmoid routing with the
//! selection bias. Keys and tensors are the ones llama.cpp's converter writes for
//! Kimi-Linear: the per-layer `attention.head_count_kv` array marks KDA layers with 0,
//! convolutions are `[d_conv, 1, channels]` in F32, `ssm_a` holds `-exp(A_log)` as `[1, heads]`.

use super::deepseek2::{attention, Gating, Mla};
use super::emit::{common_head, head_of, keyed, Head, Spec};
use super::ffn::DeepseekMoe;
use super::plan::{f32_around, f32_uniform, norm, residual, Block, Planned};
use crate::{GgmlType, Value};

/// A Kimi-Linear shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KimiLinearShape {
    /// Name used on the command line.
    pub name: &'static str,
    /// Embedding width.
    pub dim: u64,
    /// Number of transformer blocks.
    pub layers: u32,
    /// Heads of every mixer (KDA and MLA).
    pub heads: u32,
    /// KDA head width (q, k and v).
    pub kda_head: u64,
    /// KDA convolution taps.
    pub conv: u64,
    /// Every `attention_every`-th layer (counting from 1) and the last are MLA.
    pub attention_every: u32,
    /// The MLA layers' widths (no q-lora; the "rope" part is not rotated in kimi-linear).
    pub mla: Mla,
    /// The dense and MoE FFN layers.
    pub moe: DeepseekMoe,
    /// `expert_weights_scale` (Kimi's routed_scaling_factor).
    pub weights_scale: f32,
    /// Vocabulary size.
    pub vocab: u64,
    /// `context_length`.
    pub context: u32,
}

/// The kimi-linear shapes. The tiny one alternates KDA and MLA (layers 1 and 3 are MLA), so
/// both pipeline stages of a cut at 2 hold both kinds; kimi-linear-48b has the real widths.
pub const KIMI_LINEAR_SHAPES: &[KimiLinearShape] = &[
    KimiLinearShape {
        name: "tiny-kimi-linear",
        dim: 256,
        layers: 4,
        heads: 4,
        kda_head: 32,
        conv: 4,
        attention_every: 2,
        mla: Mla {
            q_lora_rank: 0,
            ..Mla::TINY
        },
        moe: DeepseekMoe::TINY,
        weights_scale: 2.446,
        vocab: 256,
        context: 4096,
    },
    // Kimi-Linear-48B-A3B's widths (as scripts/depth_models.py writes them for llama.cpp): cut it
    // with --layers for timings at real width
    KimiLinearShape {
        name: "kimi-linear-48b",
        dim: 2304,
        layers: 27,
        heads: 32,
        kda_head: 128,
        conv: 4,
        attention_every: 4,
        mla: Mla::LATENT_512,
        moe: DeepseekMoe {
            ffn: 9216,
            dense_layers: 1,
            experts: 256,
            experts_used: 8,
            expert_ffn: 1024,
            shared_experts: 1,
        },
        weights_scale: 2.446,
        vocab: 163840,
        context: 1048576,
    },
];

/// RMS-norm epsilon of Kimi-Linear checkpoints.
const RMS_EPS: f32 = 1e-5;

impl KimiLinearShape {
    /// Whether layer `l` is an MLA (full attention) layer.
    pub fn is_attention(&self, l: u32) -> bool {
        (l + 1).is_multiple_of(self.attention_every) || l + 1 == self.layers
    }

    /// This shape cut to its first `layers` blocks.
    pub fn with_layers(mut self, layers: u32) -> KimiLinearShape {
        self.layers = layers;
        self.moe.dense_layers = self.moe.dense_layers.min(layers);
        self
    }
}

/// A KDA layer's mixer tensors of block `b` (its attention norm first), of width `dim`,
/// `heads` heads of `hd` and convolutions of `conv` taps: `ssm_a` of shape `a_dims` (`[1,
/// heads]` in kimi-linear, `[heads]` in glm5-next), the decay and output gates' low-rank
/// matrices and beta made by `low_rank` (name, dims), the output projection divided by `res`.
pub(crate) fn kda(
    b: &Block,
    (dim, heads, hd, conv): (u64, u64, u64, u64),
    a_dims: &[u64],
    res: f32,
    low_rank: impl Fn(&str, &[u64]) -> Planned,
) -> Vec<Planned> {
    let (h, w) = (heads, heads * hd);
    let mut p = vec![b.norm("attn_norm", dim)];
    for x in ["q", "k", "v"] {
        p.push(b.matrix(&format!("attn_{x}"), &[dim, w], 1.0));
    }
    // ggml's ssm_conv reads f32 weights only; taps of std 1/sqrt(taps)
    let taps = 3f32.sqrt() / (conv as f32).sqrt();
    for x in ["q", "k", "v"] {
        let name = b.name(&format!("ssm_conv1d_{x}.weight"));
        p.push(f32_uniform(name, &[conv, 1, w], taps));
    }
    p.push(low_rank("ssm_f_a", &[dim, hd]));
    p.push(low_rank("ssm_f_b", &[hd, w]));
    p.push(low_rank("ssm_beta", &[dim, h]));
    // -exp(A_log) per head in [-1, -0.2): decays of e^-0.1 to e^-1 per token keep the
    // state carrying several tokens
    p.push(f32_around(b.name("ssm_a"), a_dims, -0.6, 0.4));
    p.push(f32_uniform(b.name("ssm_dt.bias"), &[w], 0.5));
    p.push(low_rank("ssm_g_a", &[dim, hd]));
    p.push(low_rank("ssm_g_b", &[hd, w]));
    p.push(norm(b.name("ssm_norm.weight"), hd));
    p.push(b.matrix("attn_output", &[w, dim], res));
    p
}

/// The tensors of `s` with matrices in `dtype`, in file order.
fn plan(s: &KimiLinearShape, dtype: GgmlType) -> Vec<Planned> {
    let res = residual(s.layers);
    let ffn = s.moe.ffn(s.dim, true, res);
    ffn.model(s.layers, s.vocab, dtype, |b, l| match s.is_attention(l) {
        true => attention(b, (s.dim, s.heads), &s.mla, res),
        false => {
            let h = u64::from(s.heads);
            let widths = (s.dim, h, s.kda_head, s.conv);
            kda(b, widths, &[1, h], res, |name, dims| {
                b.matrix(name, dims, 1.0)
            })
        }
    })
}

/// The kimi-linear metadata keys of `s`, in the converter's order: MLA runs absorbed (MQA over
/// the latent, one kv head), KDA layers have 0 kv heads.
fn metadata(s: &KimiLinearShape) -> Vec<(String, Value)> {
    let kv_heads = (0..s.layers)
        .map(|l| Value::U32(u32::from(s.is_attention(l))))
        .collect();
    let mut kv = common_head(
        head_of!("kimi-linear", s, s.moe.ffn),
        [
            ("attention.head_count_kv", Value::Array(kv_heads)),
            ("attention.layer_norm_rms_epsilon", Value::F32(RMS_EPS)),
        ],
    );
    kv.extend(s.moe.count_keys());
    kv.extend([
        ("expert_gating_func", Value::U32(Gating::Sigmoid.id())),
        ("vocab_size", Value::U32(s.vocab as u32)),
        ("ssm.conv_kernel", Value::U32(s.conv as u32)),
        ("kda.head_dim", Value::U32(s.kda_head as u32)),
        (
            "attention.kv_lora_rank",
            Value::U32(s.mla.kv_lora_rank as u32),
        ),
        ("rope.dimension_count", Value::U32(s.mla.qk_rope as u32)),
    ]);
    kv.extend(s.mla.length_keys());
    kv.extend(s.moe.width_keys());
    kv.extend([
        ("leading_dense_block_count", Value::U32(s.moe.dense_layers)),
        ("expert_weights_scale", Value::F32(s.weights_scale)),
    ]);
    keyed("kimi-linear", kv)
}

/// The planned model of `s` with matrices in `dtype`.
pub(crate) fn spec(s: &KimiLinearShape, dtype: GgmlType) -> Spec {
    Spec {
        metadata: metadata(s),
        vocab: s.vocab,
        tensors: plan(s, dtype),
    }
}
