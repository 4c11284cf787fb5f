//! Synthetic `glm5-next` shapes (GLM-5.3-Flash's layout, `docs/arch-glm5-next.md`): KDA layers
//! between nope-MLA layers with q-LoRA and the k-pool DSA indexer, every layer inside four
//! mHC residual streams, one leading dense FFN, then MoE layers with a shared expert, sigmoid
//! routing with the selection bias and clamped SwiGLU. Keys and tensors are the ones
//! llama.cpp's converter writes; the tensors llama.cpp's quantizer leaves unquantized for
//! glm5-next (indexer, KDA low-rank gates, MLA latent projections) stay F32 in a quantized
//! file (a file quantized from an F32 conversion), and the mHC, compressor, `ssm_a`, `ssm_dt`
//! and `exp_probs_b` tensors are F32.

use super::deepseek2::Gating;
use super::emit::{common_head, head_of, keyed, Head, Spec};
use super::ffn::DeepseekMoe;
use super::kimi_linear::kda;
use super::plan::{f32_around, f32_uniform, matrix, norm, residual, Block, Planned};
use crate::{GgmlType, Value};

/// A GLM5-Next shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Glm5NextShape {
    /// Name used on the command line.
    pub name: &'static str,
    /// Embedding width.
    pub dim: u64,
    /// Number of trunk blocks.
    pub layers: u32,
    /// Heads of every mixer (KDA and MLA).
    pub heads: u32,
    /// KDA head width (q, k and v).
    pub kda_head: u64,
    /// KDA convolution taps.
    pub conv: u64,
    /// KDA decay lower bound (the bounded decay form), or none.
    pub gate_lower_bound: Option<f32>,
    /// Every `attention_every`-th layer (counting from 1) is MLA.
    pub attention_every: u32,
    /// One more MLA layer off that pattern (GLM-5.3-Flash's last layer), or none.
    pub extra_attention: Option<u32>,
    /// Whether the MLA layers alternate a full DSA indexer and a shared one (the second,
    /// fourth, ... MLA layer reuses the selection of the one before and has no indexer
    /// tensors), written as `attention.indexer.types` (KDA layers false, as llama.cpp does
    /// not read them); otherwise every layer has its indexer and the key is not written.
    pub shared_indexers: bool,
    /// MLA query low-rank width.
    pub q_lora_rank: u64,
    /// MLA latent width.
    pub kv_lora_rank: u64,
    /// MLA per-head q/k width (no rope part).
    pub qk_nope: u64,
    /// MLA per-head v width.
    pub v_head: u64,
    /// DSA indexer heads.
    pub indexer_heads: u32,
    /// DSA indexer head width.
    pub indexer_head: u64,
    /// Cells the indexer selects (a multiple of `kpool`).
    pub indexer_top_k: u32,
    /// Tokens per pooled indexer key.
    pub kpool: u32,
    /// mHC Sinkhorn iterations.
    pub sinkhorn_iters: u32,
    /// mHC epsilon.
    pub hc_eps: f32,
    /// The dense and MoE FFN layers.
    pub moe: DeepseekMoe,
    /// `expert_weights_scale` (routed_scaling_factor).
    pub weights_scale: f32,
    /// SwiGLU clamp limit of every FFN (`swiglu_limit`).
    pub swiglu_limit: f32,
    /// Vocabulary size.
    pub vocab: u64,
    /// `context_length`.
    pub context: u32,
    /// RMS-norm epsilon.
    pub norm_eps: f32,
}

/// The indexer key's layer-norm epsilon, which llama.cpp's converter writes whatever the
/// config says.
const INDEXER_NORM_EPS: f32 = 1e-6;

/// mHC residual streams (llama.cpp supports 4 only).
pub const HC_MULT: u64 = 4;

/// GLM-5.3-Flash at real width (`plans/models/glm-5.3-flash.json`, the numbers chosen there):
/// KDA layers with every fourth layer and the last one MLA; `--layers N` cuts it to the depth
/// of `plans/models/glm-5.3-flash-lN.json` for llama.cpp and memra to read the same file.
const GLM_5_3_FLASH: Glm5NextShape = Glm5NextShape {
    name: "glm-5.3-flash",
    dim: 6144,
    layers: 45,
    heads: 32,
    kda_head: 128,
    conv: 4,
    gate_lower_bound: Some(-5.0),
    attention_every: 4,
    extra_attention: Some(44),
    shared_indexers: true,
    q_lora_rank: 1536,
    kv_lora_rank: 512,
    qk_nope: 192,
    v_head: 128,
    indexer_heads: 32,
    indexer_head: 128,
    indexer_top_k: 2048,
    kpool: 4,
    sinkhorn_iters: 20,
    hc_eps: 1e-6,
    moe: DeepseekMoe {
        ffn: 12288,
        dense_layers: 1,
        experts: 256,
        experts_used: 8,
        expert_ffn: 1536,
        shared_experts: 1,
    },
    weights_scale: 2.5,
    swiglu_limit: 10.0,
    vocab: 151_552,
    context: 131_072,
    norm_eps: 1e-5,
};

/// The tiny glm5-next shape: KDA and MLA alternate (layers 1 and 3 are MLA), so both pipeline
/// stages of a cut at 2 hold both kinds; its indexer keeps 2 pools of 4 (plus the incomplete
/// pool), so attention turns sparse from position 12 on; its clamp of 2 clips a few percent of
/// the SwiGLU inputs.
const TINY: Glm5NextShape = Glm5NextShape {
    name: "tiny-glm5-next",
    dim: 256,
    layers: 4,
    heads: 4,
    kda_head: 32,
    conv: 4,
    gate_lower_bound: Some(-1.0),
    attention_every: 2,
    extra_attention: None,
    shared_indexers: false,
    q_lora_rank: 128,
    kv_lora_rank: 128,
    qk_nope: 64,
    v_head: 64,
    indexer_heads: 2,
    indexer_head: 32,
    indexer_top_k: 8,
    kpool: 4,
    sinkhorn_iters: 20,
    hc_eps: 1e-6,
    moe: DeepseekMoe::TINY,
    weights_scale: 2.5,
    swiglu_limit: 2.0,
    vocab: 256,
    context: 4096,
    norm_eps: 1e-6,
};

/// The glm5-next shapes. tiny-glm5-next-shared is the tiny one at 8 layers whose MLA layers
/// alternate full and shared indexers (KDA, full, KDA, shared, KDA, full, KDA, shared): a cut
/// at 2 or 3 parts a shared layer from the full one it reads.
pub const GLM5_NEXT_SHAPES: &[Glm5NextShape] = &[
    TINY,
    Glm5NextShape {
        name: "tiny-glm5-next-shared",
        layers: 8,
        shared_indexers: true,
        ..TINY
    },
    GLM_5_3_FLASH,
];

impl Glm5NextShape {
    /// Whether layer `l` is an MLA (sparse attention) layer.
    pub fn is_attention(&self, l: u32) -> bool {
        (l + 1).is_multiple_of(self.attention_every) || self.extra_attention == Some(l)
    }

    /// Whether layer `l` has a DSA indexer of its own (`attention.indexer.types[l]`): every
    /// MLA layer unless the MLA layers alternate full and shared (see `shared_indexers`),
    /// never a KDA layer.
    pub fn has_indexer(&self, l: u32) -> bool {
        let nth = (0..l).filter(|&k| self.is_attention(k)).count();
        self.is_attention(l) && (!self.shared_indexers || nth % 2 == 0)
    }

    /// This shape cut to its first `layers` blocks.
    pub fn with_layers(mut self, layers: u32) -> Glm5NextShape {
        self.layers = layers;
        self.moe.dense_layers = self.moe.dense_layers.min(layers);
        self
    }
}

/// The type of the tensors llama.cpp's quantizer leaves alone for glm5-next: F32 under a
/// block-quantized model dtype (quantized from an F32 file, so no product of the model mixes
/// f16-rounded activations, which ggml makes and memra does not, into 8-bit ones), the model
/// dtype otherwise.
fn exact(dtype: GgmlType) -> GgmlType {
    match dtype.block_size() > 1 {
        true => GgmlType::F32,
        false => dtype,
    }
}

/// The mHC mixing parameters of one sublayer (`hc_attn` or `hc_ffn`).
fn hc(s: &Glm5NextShape, b: &Block, which: &str) -> Vec<Planned> {
    let mix = (2 + HC_MULT) * HC_MULT;
    vec![
        matrix(
            b.name(&format!("hc_{which}_fn.weight")),
            &[HC_MULT * s.dim, mix],
            1.0,
            GgmlType::F32,
        ),
        f32_uniform(b.name(&format!("hc_{which}_base.weight")), &[mix], 1.0),
        f32_around(b.name(&format!("hc_{which}_scale.weight")), &[3], 1.0, 0.5),
    ]
}

/// A nope-MLA layer's mixer and indexer tensors of block `b` (its attention norm first).
fn mla(s: &Glm5NextShape, l: u32, b: &Block, dtype: GgmlType, res: f32) -> Vec<Planned> {
    let h = u64::from(s.heads);
    let (r, kv, id) = (s.q_lora_rank, s.kv_lora_rank, s.indexer_head);
    let ih = u64::from(s.indexer_heads);
    let keep = |name: &str, dims: &[u64]| {
        matrix(b.name(&format!("{name}.weight")), dims, 1.0, exact(dtype))
    };
    let mut p = vec![
        b.norm("attn_norm", s.dim),
        b.norm("attn_q_a_norm", r),
        b.norm("attn_kv_a_norm", kv),
        b.matrix("attn_q_a", &[s.dim, r], 1.0),
        b.matrix("attn_q_b", &[r, h * s.qk_nope], 1.0),
        keep("attn_kv_a_mqa", &[s.dim, kv]),
        // per head: k_b maps a q row into the latent, v_b maps the latent to a v row
        keep("attn_k_b", &[s.qk_nope, kv, h]),
        keep("attn_v_b", &[kv, s.v_head, h]),
        b.matrix("attn_output", &[h * s.v_head, s.dim], res),
    ];
    if !s.has_indexer(l) {
        return p;
    }
    p.extend([
        norm(b.name("indexer.k_norm.weight"), id),
        f32_uniform(b.name("indexer.k_norm.bias"), &[id], 0.1),
        keep("indexer.proj", &[s.dim, ih]),
        keep("indexer.attn_k", &[s.dim, id]),
        keep("indexer.attn_q_b", &[r, ih * id]),
        matrix(
            b.name("indexer_compressor_gate.weight"),
            &[s.dim, id],
            1.0,
            GgmlType::F32,
        ),
        f32_uniform(
            b.name("indexer_compressor_ape.weight"),
            &[id, u64::from(s.kpool)],
            1.0,
        ),
    ]);
    p
}

/// The tensors of `s` with matrices in `dtype`, in file order.
fn plan(s: &Glm5NextShape, dtype: GgmlType) -> Vec<Planned> {
    let res = residual(s.layers);
    let ffn = s.moe.ffn(s.dim, true, res);
    ffn.model(s.layers, s.vocab, dtype, |b, l| {
        let mut p = hc(s, b, "attn");
        p.extend(hc(s, b, "ffn"));
        match s.is_attention(l) {
            true => p.extend(mla(s, l, b, dtype, res)),
            false => {
                let h = u64::from(s.heads);
                let keep = |name: &str, dims: &[u64]| {
                    matrix(b.name(&format!("{name}.weight")), dims, 1.0, exact(dtype))
                };
                // ssm_a is a 1-d tensor in glm5-next
                p.extend(kda(b, (s.dim, h, s.kda_head, s.conv), &[h], res, keep))
            }
        }
        p
    })
}

/// The glm5-next metadata keys of `s`, in the converter's order: MLA runs absorbed (MQA over
/// the latent, one kv head), KDA layers have 0 kv heads.
fn metadata(s: &Glm5NextShape) -> Vec<(String, Value)> {
    let kv_heads = (0..s.layers)
        .map(|l| Value::U32(u32::from(s.is_attention(l))))
        .collect();
    let limits = || Value::Array((0..s.layers).map(|_| Value::F32(s.swiglu_limit)).collect());
    let mut kv = common_head(
        head_of!("glm5-next", s, s.moe.ffn),
        [
            ("attention.head_count_kv", Value::Array(kv_heads)),
            ("attention.layer_norm_rms_epsilon", Value::F32(s.norm_eps)),
        ],
    );
    kv.extend(s.moe.count_keys());
    kv.extend([
        ("vocab_size", Value::U32(s.vocab as u32)),
        ("attention.layer_norm_epsilon", Value::F32(INDEXER_NORM_EPS)),
        ("ssm.conv_kernel", Value::U32(s.conv as u32)),
        ("kda.head_dim", Value::U32(s.kda_head as u32)),
    ]);
    if let Some(lb) = s.gate_lower_bound {
        kv.push(("kda.gate_lower_bound", Value::F32(lb)));
    }
    kv.extend([
        ("attention.q_lora_rank", Value::U32(s.q_lora_rank as u32)),
        ("attention.kv_lora_rank", Value::U32(s.kv_lora_rank as u32)),
        ("rope.dimension_count", Value::U32(0)),
        ("attention.key_length", Value::U32(s.kv_lora_rank as u32)),
        ("attention.value_length", Value::U32(s.kv_lora_rank as u32)),
        ("attention.key_length_mla", Value::U32(s.qk_nope as u32)),
        ("attention.value_length_mla", Value::U32(s.v_head as u32)),
        ("attention.indexer.head_count", Value::U32(s.indexer_heads)),
        (
            "attention.indexer.key_length",
            Value::U32(s.indexer_head as u32),
        ),
        ("attention.indexer.top_k", Value::U32(s.indexer_top_k)),
        ("attention.indexer.kpool", Value::U32(s.kpool)),
        ("attention.indexer.kpool_select_tail", Value::Bool(true)),
    ]);
    if s.shared_indexers {
        let types = (0..s.layers).map(|l| Value::Bool(s.has_indexer(l)));
        kv.push(("attention.indexer.types", Value::Array(types.collect())));
    }
    kv.extend([
        ("hyper_connection.count", Value::U32(HC_MULT as u32)),
        (
            "hyper_connection.sinkhorn_iterations",
            Value::U32(s.sinkhorn_iters),
        ),
        ("hyper_connection.epsilon", Value::F32(s.hc_eps)),
        ("leading_dense_block_count", Value::U32(s.moe.dense_layers)),
    ]);
    kv.extend(s.moe.width_keys());
    kv.extend([
        ("expert_weights_scale", Value::F32(s.weights_scale)),
        ("expert_weights_norm", Value::Bool(true)),
        ("expert_gating_func", Value::U32(Gating::Sigmoid.id())),
        ("swiglu_clamp_exp", limits()),
        ("swiglu_clamp_shexp", limits()),
    ]);
    keyed("glm5-next", kv)
}

/// The planned model of `s` with matrices in `dtype`.
pub(crate) fn spec(s: &Glm5NextShape, dtype: GgmlType) -> Spec {
    Spec {
        metadata: metadata(s),
        vocab: s.vocab,
        tensors: plan(s, dtype),
    }
}
