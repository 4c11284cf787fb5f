//! The model facts of a plan (`ModelSummary`) and the layer schema they imply: per layer a
//! mixer (GQA, MLA, MLA over the DSA indexer's selection, or KDA linear attention) and an FFN
//! (dense, or routed experts with or without shared experts), and model-wide the residual
//! topology (one stream, or mHC's streams), with the routing, MLA, DSA, KDA, mHC and YaRN
//! facts an executor needs to run them.

use serde::{Deserialize, Serialize};

/// Model facts the executor needs, and the fingerprint that ties the plan to one model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSummary {
    pub name: String,
    pub architecture: String,
    /// The model file as the placement named it (relative to the placement file).
    pub source: String,
    /// FNV-1a 64 over the metadata and tensor infos (never the weight bytes).
    pub fingerprint: String,
    pub layers: u32,
    pub embedding: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub ffn: u32,
    pub vocab: u32,
    pub context_length: u32,
    pub rope_theta: f64,
    pub rms_eps: f64,
    pub tied_embeddings: bool,
    pub qk_norm: bool,
    pub qkv_bias: bool,
    /// Chunks of the canonical reduction tree for each row-parallel reduction dimension.
    pub reduction_chunks: ReductionChunks,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_yarn: Option<YarnSummary>,
    /// Llama 3.1's rope scaling, which no executor implements: a plan that carries it is
    /// planned (memory, schedule) but refused by the executors, never run with plain rope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_llama3: Option<Llama3RopeSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kda: Option<KdaSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsa: Option<DsaSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mhc: Option<MhcSummary>,
}

/// Chunk counts of the canonical reduction order (see `reduction_chunks`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReductionChunks {
    pub attn_out: u32,
    pub ffn_down: u32,
}

/// Mixture-of-experts facts: the experts and how the router picks and weighs them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeSummary {
    pub experts: u32,
    pub top_k: u32,
    pub expert_ffn: u32,
    /// Width of the always-on shared experts, fused into one FFN (0: none).
    pub shared_expert_ffn: u32,
    /// Leading layers that keep a dense FFN.
    pub dense_layers: u32,
    /// How router logits become expert probabilities.
    pub gating: Gating,
    /// Whether the selection (not the weights) adds the per-expert bias `exp_probs_b`.
    pub probs_bias: bool,
    /// Expert groups; above 1, only the experts of the best `groups_used` groups (scored by
    /// the sum of their two best probabilities) are candidates for the top-k.
    pub groups: u32,
    pub groups_used: u32,
    /// Whether the selected weights are divided by their sum.
    pub norm_weights: bool,
    /// Factor on the selected weights (1: none).
    pub weights_scale: f64,
    /// SwiGLU clamp limits (glm5-next): `silu(min(gate, l)) * clamp(up, -l, l)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clamp: Option<ClampSummary>,
}

/// SwiGLU clamp limits, as llama.cpp applies them to glm5-next's FFNs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClampSummary {
    /// The routed experts' limit.
    pub experts: f64,
    /// The shared experts' and the leading dense FFNs' limit.
    pub shared: f64,
}

/// Which FFN a SwiGLU clamp limit is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClampedFfn {
    /// The routed experts.
    Experts,
    /// The shared experts and the leading dense FFNs.
    Shared,
}

impl MoeSummary {
    /// The SwiGLU clamp limit `which` applies, if any (llama.cpp clamps only with a positive
    /// limit); both backends read it here.
    pub fn swiglu_limit(&self, which: ClampedFfn) -> Option<f32> {
        let c = self.clamp.as_ref()?;
        let l = match which {
            ClampedFfn::Experts => c.experts,
            ClampedFfn::Shared => c.shared,
        };
        (l > 0.0).then_some(l as f32)
    }
}

/// The token mixer of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// Grouped-query attention over a K/V cache.
    Gqa,
    /// Multi-head latent attention over a compressed latent cache.
    Mla,
    /// Kimi delta attention: a short causal convolution and a gated delta-rule recurrent
    /// state per head, no cache that grows with the context.
    Kda,
    /// MLA without rope whose softmax runs over the cells the DSA indexer selects (glm5-next).
    Dsa,
    /// A DSA layer without an indexer of its own (glm5-next's `indexer.types` false): its
    /// softmax runs over the selection of the closest full DSA layer before it.
    DsaShared,
}

impl Mixer {
    /// Every mixer, for error messages.
    pub const ALL: [Mixer; 5] = [
        Mixer::Gqa,
        Mixer::Mla,
        Mixer::Kda,
        Mixer::Dsa,
        Mixer::DsaShared,
    ];

    /// The name placements use (`[[capture.eager]] kinds`).
    pub fn name(self) -> &'static str {
        match self {
            Mixer::Gqa => "gqa",
            Mixer::Mla => "mla",
            Mixer::Kda => "kda",
            Mixer::Dsa => "dsa",
            Mixer::DsaShared => "dsa_shared",
        }
    }

    /// Whether the layer attends over a DSA selection (its own or a shared one).
    pub fn is_sparse(self) -> bool {
        matches!(self, Mixer::Dsa | Mixer::DsaShared)
    }
}

/// The feed-forward block of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    /// One gated FFN.
    Dense,
    /// Routed experts, with or without always-on shared experts.
    Moe { shared: bool },
}

/// One entry of the layer schema: what a layer is made of. The compiler turns it into
/// segments and expected tensors; an executor into the layer's weights and state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKind {
    pub mixer: Mixer,
    pub ffn: FfnKind,
}

/// The schema rule: with KDA facts, KDA in every layer but the listed attention layers;
/// attention layers are MLA when the model has MLA facts, MLA over the indexer's selection
/// (DSA) when it has DSA facts too (over the selection of the closest full DSA layer before it
/// when the DSA facts list it as shared), GQA otherwise; routed experts from layer
/// `dense_layers` on when it has MoE facts, shared experts with them when their width is set.
pub fn layer_kind(
    (mla, dsa): (bool, Option<&DsaSummary>),
    kda: Option<&KdaSummary>,
    moe: Option<&MoeSummary>,
    layer: u32,
) -> LayerKind {
    let mixer = match (kda, dsa) {
        (Some(k), _) if !k.attention_layers.contains(&layer) => Mixer::Kda,
        (_, Some(d)) if mla && d.shared_layers.contains(&layer) => Mixer::DsaShared,
        (_, Some(_)) if mla => Mixer::Dsa,
        _ if mla => Mixer::Mla,
        _ => Mixer::Gqa,
    };
    let ffn = match moe {
        Some(m) if layer >= m.dense_layers => FfnKind::Moe {
            shared: m.shared_expert_ffn > 0,
        },
        _ => FfnKind::Dense,
    };
    LayerKind { mixer, ffn }
}

/// The layer whose DSA selection layer `layer` attends over, by the schema's `mixer` of each
/// layer: itself when it is a full DSA layer, the closest full DSA layer before it when it is
/// a shared one (KDA layers between them do not matter), none otherwise.
pub fn selection_source(mixer: impl Fn(u32) -> Mixer, layer: u32) -> Option<u32> {
    match mixer(layer) {
        Mixer::Dsa => Some(layer),
        Mixer::DsaShared => (0..layer).rev().find(|&l| mixer(l) == Mixer::Dsa),
        _ => None,
    }
}

/// Whether a pipeline cut before layer `cut` (of `layers`) must carry a DSA selection: a
/// shared layer at or after the cut reads a full layer before it.
pub fn selection_crosses(mixer: impl Fn(u32) -> Mixer, layers: u32, cut: u32) -> bool {
    (cut..layers).any(|l| {
        mixer(l) == Mixer::DsaShared && selection_source(&mixer, l).is_some_and(|s| s < cut)
    })
}

impl ModelSummary {
    /// The layer schema's entry for `layer`.
    pub fn layer_kind(&self, layer: u32) -> LayerKind {
        layer_kind(
            (self.mla.is_some(), self.dsa.as_ref()),
            self.kda.as_ref(),
            self.moe.as_ref(),
            layer,
        )
    }

    /// The layer whose DSA selection layer `layer` attends over (see `selection_source`).
    pub fn selection_source(&self, layer: u32) -> Option<u32> {
        selection_source(|l| self.layer_kind(l).mixer, layer)
    }

    /// Whether a pipeline cut before layer `cut` carries a DSA selection (see
    /// `selection_crosses`).
    pub fn selection_crosses(&self, cut: u32) -> bool {
        selection_crosses(|l| self.layer_kind(l).mixer, self.layers, cut)
    }
}

/// The router's probability function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gating {
    /// Softmax over all experts (Qwen3-MoE, DeepSeek-V2).
    Softmax,
    /// Sigmoid of each logit (DeepSeek-V3).
    Sigmoid,
}

/// Multi-head latent attention facts. Keys are the compressed latent (`kv_lora_rank`) plus
/// one rope key shared by all heads; the k and v up-projections are stored per head
/// (`attn_k_b`, `attn_v_b`) and absorbed into the query and the attention output at decode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlaSummary {
    /// Rank of the query's low-rank path; 0 projects the query directly (`attn_q`).
    pub q_lora_rank: u32,
    pub kv_lora_rank: u32,
    pub qk_nope_head_dim: u32,
    /// The rotated part of each query and key head (its last dims), and the rope dims.
    pub qk_rope_head_dim: u32,
    pub v_head_dim: u32,
    /// Whether the rope parts are rotated (kimi-linear's MLA layers use no rope: the "rope"
    /// key is stored as computed).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub rope: bool,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Kimi delta attention facts (kimi-linear). Every KDA layer has `heads` (the model's head
/// count) heads of `head_dim` for q, k and v; each of q, k and v passes a depthwise causal
/// convolution of `conv_kernel` taps, whose last `conv_kernel - 1` inputs per channel are the
/// layer's window state, and each head carries a `head_dim x head_dim` recurrent state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KdaSummary {
    pub head_dim: u32,
    pub conv_kernel: u32,
    /// The layers that are full attention (MLA) instead of KDA, ascending.
    pub attention_layers: Vec<u32>,
    /// glm5-next's bounded decay `g = lb * sigmoid(-a * x)` instead of `a * softplus(x)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_lower_bound: Option<f64>,
    /// Epsilon of the q/k L2 norms when it is not the RMS epsilon (glm5-next: 1e-6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_eps: Option<f64>,
}

impl KdaSummary {
    /// f32 values of one layer's state for `heads` heads: the q, k and v convolution windows
    /// and the recurrent state.
    pub fn state_elems(&self, heads: u32) -> u64 {
        let (h, d) = (u64::from(heads), u64::from(self.head_dim));
        3 * (u64::from(self.conv_kernel) - 1) * h * d + h * d * d
    }
}

/// The DSA indexer with k-pool compression (glm5-next): per token a key and a pool gate;
/// every `kpool` consecutive tokens pool into one key (a softmax over the members per
/// channel); the token's query scores the complete pools (`sum_h w_h relu(q_h . pool)`) and
/// MLA attends to the members of the `top_k / kpool` best, plus, with `select_tail`, the
/// tokens of the incomplete pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsaSummary {
    pub heads: u32,
    pub head_dim: u32,
    pub top_k: u32,
    pub kpool: u32,
    pub select_tail: bool,
    /// Epsilon of the indexer key's layer norm.
    pub norm_eps: f64,
    /// DSA layers without an indexer of their own, ascending: each reuses the selection of
    /// the closest full DSA layer before it, and holds no indexer cache.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_layers: Vec<u32>,
}

impl DsaSummary {
    /// f32 values the indexer caches per token: its key, its pool gate and the pooled key
    /// (kept in the pool's last member's row).
    pub fn cache_row(&self) -> u64 {
        3 * u64::from(self.head_dim)
    }

    /// The i32 values one selection takes in a boundary's token row: the cell count, then at
    /// most `top_k` pool members plus (with the tail) `kpool - 1` tail cells, never more than
    /// the context's `max_context` cells.
    pub fn selection_values(&self, max_context: u32) -> u32 {
        let tail = if self.select_tail { self.kpool - 1 } else { 0 };
        1 + (self.top_k + tail).min(max_context)
    }
}

/// Manifold-constrained hyper-connections (glm5-next): the residual is `streams` rows of the
/// embedding width; before each sublayer a learned, input-dependent map collapses them into
/// its input, after it the output is spread back with a Sinkhorn-normalized mixing matrix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MhcSummary {
    pub streams: u32,
    pub sinkhorn_iters: u32,
    pub eps: f64,
}

/// Llama 3.1's rope scaling (config.json `rope_scaling` of type `llama3`): frequencies
/// below `low_freq_factor` wavelengths of the original context are divided by `factor`,
/// those above `high_freq_factor` kept, those between blended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Llama3RopeSummary {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    /// Context length the model was trained at before the extension.
    pub original_context: u32,
}

/// YaRN rope scaling, as llama.cpp applies it (`rope.scaling.*` keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct YarnSummary {
    /// Context extension factor (the inverse of rope's frequency scale).
    pub factor: f64,
    /// Context length the model was trained at before the extension.
    pub original_context: u32,
    /// DeepSeek's `mscale_all_dim` (0: the key is absent).
    pub mscale_all_dim: f64,
}
