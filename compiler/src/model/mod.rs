//! Model metadata: what the compiler knows of a model without touching its weights.
//!
//! Three readers fill `ModelMeta`: a GGUF header (tensor infos included), a Hugging Face
//! `config.json` (tensors synthesized from the architecture's layout in a chosen dtype), and
//! a plan's own facts and weight shards (what synthetic weights run).

mod config;
mod from_plan;
mod gguf;
mod tensors;

pub use config::read_config;
pub use from_plan::model_of_plan;
pub use gguf::{gguf_meta, read_gguf};

use crate::plan::{
    layer_kind, DsaSummary, KdaSummary, Llama3RopeSummary, MhcSummary, MlaSummary, MoeSummary,
    YarnSummary,
};
pub use crate::plan::{FfnKind, LayerKind, Mixer};

/// Architectures the compiler can plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Mixtral,
    Deepseek2,
    KimiLinear,
    Glm5Next,
}

impl Architecture {
    /// Every supported architecture, for error messages.
    pub const ALL: [Architecture; 8] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Qwen3Moe,
        Architecture::Mixtral,
        Architecture::Deepseek2,
        Architecture::KimiLinear,
        Architecture::Glm5Next,
    ];

    /// The GGUF `general.architecture` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Mixtral => "mixtral",
            Architecture::Deepseek2 => "deepseek2",
            Architecture::KimiLinear => "kimi-linear",
            Architecture::Glm5Next => "glm5-next",
        }
    }

    /// The comma-separated list of supported names.
    pub fn supported_list() -> String {
        Self::ALL.map(Architecture::name).join(", ")
    }
}

/// Element types of weights and caches, with their block geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q4K,
    Q6K,
}

impl Dtype {
    /// Every dtype, for error messages.
    pub const ALL: [Dtype; 8] = [
        Dtype::F32,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::Q8_0,
        Dtype::Q4_0,
        Dtype::Q4_1,
        Dtype::Q4K,
        Dtype::Q6K,
    ];

    /// The lowercase ggml spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::Q8_0 => "q8_0",
            Dtype::Q4_0 => "q4_0",
            Dtype::Q4_1 => "q4_1",
            Dtype::Q4K => "q4_k",
            Dtype::Q6K => "q6_k",
        }
    }

    /// Parse the lowercase ggml spelling.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Elements per block.
    pub fn block_elems(self) -> u64 {
        match self {
            Dtype::F32 | Dtype::F16 | Dtype::Bf16 => 1,
            Dtype::Q8_0 | Dtype::Q4_0 | Dtype::Q4_1 => 32,
            Dtype::Q4K | Dtype::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::Q8_0 => 34,
            Dtype::Q4_0 => 18,
            Dtype::Q4_1 => 20,
            Dtype::Q4K => 144,
            Dtype::Q6K => 210,
        }
    }

    /// Bytes of `elems` elements; `elems` must be a whole number of blocks.
    pub fn bytes_for(self, elems: u64) -> u64 {
        elems / self.block_elems() * self.block_bytes()
    }

    /// The comma-separated list of names.
    pub fn supported_list() -> String {
        Self::ALL.map(Dtype::name).join(", ")
    }
}

/// How a tensor is cut under tensor parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardRule {
    /// Every rank holds all of it (norms, router, the embedding lookup).
    Replicated,
    /// Output rows are split (column-parallel).
    Rows,
    /// Input columns are split (row-parallel; its product needs an all-reduce).
    Cols,
    /// Stacked experts are split by expert.
    Experts,
    /// A per-head stack of matrices is split by head (MLA's k/v up-projections).
    Heads,
}

/// Where a tensor lives in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TensorSite {
    Embed,
    Layer(u32),
    Head,
}

/// One weight tensor, as the compiler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorMeta {
    pub name: String,
    pub dtype: Dtype,
    /// `[rows, cols]` with rows = outputs (or `[experts, rows, cols]`, or `[len]`).
    pub shape: Vec<u64>,
    pub site: TensorSite,
    pub rule: ShardRule,
}

impl TensorMeta {
    /// Elements of the whole tensor.
    pub fn elems(&self) -> u64 {
        self.shape.iter().product()
    }
    /// Bytes of the whole tensor.
    pub fn bytes(&self) -> u64 {
        self.dtype.bytes_for(self.elems())
    }
}

/// Everything the compiler reads from a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMeta {
    pub name: String,
    pub architecture: Architecture,
    pub layers: u32,
    pub embedding: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub ffn: u32,
    pub vocab: u32,
    pub context_length: u32,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub tied_embeddings: bool,
    pub qk_norm: bool,
    pub qkv_bias: bool,
    pub moe: Option<MoeSummary>,
    pub mla: Option<MlaSummary>,
    pub rope_yarn: Option<YarnSummary>,
    /// Llama 3.1's rope scaling, carried into the plan for the executors to refuse.
    pub rope_llama3: Option<Llama3RopeSummary>,
    pub kda: Option<KdaSummary>,
    pub dsa: Option<DsaSummary>,
    pub mhc: Option<MhcSummary>,
    /// Sorted by site, then name.
    pub tensors: Vec<TensorMeta>,
    pub fingerprint: u64,
}

impl ModelMeta {
    /// Whether `layer` has routed experts.
    pub fn is_moe_layer(&self, layer: u32) -> bool {
        self.moe.as_ref().is_some_and(|m| layer >= m.dense_layers)
    }

    /// The layer schema's entry for `layer`.
    pub fn layer_kind(&self, layer: u32) -> LayerKind {
        layer_kind(
            (self.mla.is_some(), self.dsa.as_ref()),
            self.kda.as_ref(),
            self.moe.as_ref(),
            layer,
        )
    }

    /// Whether a pipeline cut before layer `cut` carries a DSA selection
    /// (`plan::selection_crosses`).
    pub fn selection_crosses(&self, cut: u32) -> bool {
        crate::plan::selection_crosses(|l| self.layer_kind(l).mixer, self.layers, cut)
    }

    /// Width of the attention output (heads times the value head size) of an attention
    /// (GQA or MLA) layer.
    pub fn attn_out_width(&self) -> u32 {
        match &self.mla {
            Some(mla) => self.heads * mla.v_head_dim,
            None => self.heads * self.head_dim,
        }
    }

    /// Width of a KDA layer's q, k, v and output (0 without KDA).
    pub fn kda_width(&self) -> u32 {
        self.kda.as_ref().map_or(0, |k| self.heads * k.head_dim)
    }

    /// How many of `layers` are KDA layers; the others hold a KV or latent cache.
    pub fn kda_layers_in(&self, layers: std::ops::Range<u32>) -> u32 {
        layers
            .filter(|&l| self.layer_kind(l).mixer == Mixer::Kda)
            .count() as u32
    }

    /// Bytes of K and V for one token of one layer at full width, in `kv` dtype.
    pub fn kv_bytes_per_token_layer(&self, kv: Dtype) -> u64 {
        let elems = match &self.mla {
            // MLA caches the compressed latent plus the shared rope key.
            Some(mla) => u64::from(mla.kv_lora_rank + mla.qk_rope_head_dim),
            None => 2 * u64::from(self.kv_heads * self.head_dim),
        };
        elems * kv.block_bytes() / kv.block_elems()
    }

    /// Bytes the DSA indexer caches for one token over `layers`: an f32 row for each layer
    /// with a full indexer (shared-indexer layers cache nothing of their own).
    pub fn indexer_bytes_per_token(&self, layers: std::ops::Range<u32>) -> u64 {
        self.dsa.as_ref().map_or(0, |d| {
            let full = layers
                .filter(|&l| self.layer_kind(l).mixer == Mixer::Dsa)
                .count() as u64;
            full * 4 * d.cache_row()
        })
    }

    /// Values of one token row of the residual: the embedding width times mHC's streams.
    pub fn residual_width(&self) -> u64 {
        let streams = self.mhc.as_ref().map_or(1, |m| m.streams);
        u64::from(self.embedding) * u64::from(streams)
    }
}

/// The shared-indexer DSA layers of a glm5-next model: the attention (MLA) layers whose
/// entry of `full` (one per trunk layer) is false; the other layers' entries are not read. A
/// shared layer with no full one before it has no selection to reuse: `Err(layer)`.
pub(crate) fn shared_indexers(attention_layers: &[u32], full: &[bool]) -> Result<Vec<u32>, u32> {
    let mut seen_full = false;
    let mut shared = Vec::new();
    for &l in attention_layers {
        match full.get(l as usize).copied().unwrap_or(true) {
            true => seen_full = true,
            false if seen_full => shared.push(l),
            false => return Err(l),
        }
    }
    Ok(shared)
}

/// Why a shared-indexer layer `l` is refused when no full one comes before it, with the
/// reader's spellings of a shared and a full entry.
pub(crate) fn no_full_before(l: u32, (shared, full): (&str, &str)) -> String {
    format!("but no MLA layer before layer {l} has a full indexer whose selection it could reuse; allowed: {shared} only after a layer with a full indexer ({full})")
}

/// The most layers (GGUF blocks, NextN ones included) a model may have: eight times the
/// deepest real models (Llama 3.1 405B has 126); a count past it only sizes the per-layer
/// tables out of memory.
pub const MAX_LAYERS: u32 = 1024;

/// An integer hyperparameter both readers bound alike: the range and why.
#[derive(Clone, Copy)]
pub(crate) struct IntRule {
    pub min: u32,
    pub max: u32,
    pub why: &'static str,
}

impl IntRule {
    pub fn ok(&self, v: u32) -> bool {
        (self.min..=self.max).contains(&v)
    }
    /// What is allowed, for an error message: `1 to 1024 (why)`.
    pub fn allowed(&self) -> String {
        format!("{} to {} ({})", self.min, self.max, self.why)
    }
}

// The bounds on a model's widths and counts. Each is generous (several times the largest real
// model's value), and together they keep every product the compiler forms from them inside
// u64 (and those it forms in u32, such as heads * head_dim, inside u32):
// - the largest tensor is an expert stack, EXPERTS * FFN * WIDTH = 2^12 * 2^18 * 2^16 = 2^46
//   elements, 2^48 bytes in f32; three per layer over MAX_LAYERS (2^10) layers is under 2^60
//   bytes; every other tensor is at most 2^40 elements (HEADS * HEAD_DIM * WIDTH, HEADS *
//   WIDTH * HEAD_DIM for MLA's per-head stacks, VOCAB * WIDTH = 2^36), so all weights stay
//   under 2^61 bytes
// - in u32: HEADS * HEAD_DIM = 2^24, a shared experts' width is bounded as one FFN width
// - a token row of activations (a few WIDTHs, HEADS * HEAD_DIM, HEADS * WIDTH for MLA's
//   latent queries, EXPERTS + top-k * WIDTH) is under 2^32 elements; times the placement's
//   prefill chunk (2^15) and 4 bytes, under 2^49
// The KV cache also grows with the placement's context and sequences; the placement's
// validation bounds that product (`placement::validate`).
const WIDTHS: &str = "memra's bound on model widths, which keeps its byte counts in 64 bits";

/// A width or count from 1 to `max`, bounded for the reason above.
const fn width_rule(max: u32) -> IntRule {
    IntRule {
        min: 1,
        max,
        why: WIDTHS,
    }
}

/// The layers (`block_count`, `num_hidden_layers`).
pub(crate) const LAYERS: IntRule = IntRule {
    min: 1,
    max: MAX_LAYERS,
    why: "memra plans at most 1024 layers",
};
/// The embedding (hidden) width and MLA's LoRA ranks: 4 times Llama 3.1 405B's 16384.
pub(crate) const WIDTH: IntRule = width_rule(1 << 16);
/// An FFN's hidden width (dense, one expert's, the shared experts' together): 4 times
/// PaLM's 73728 rounded up.
pub(crate) const FFN: IntRule = width_rule(1 << 18);
/// The vocabulary: 4 times Gemma 3's 262144.
pub(crate) const VOCAB: IntRule = width_rule(1 << 20);
/// Attention heads (query, key/value, the DSA indexer's): 32 times DeepSeek's 128.
pub(crate) const HEADS: IntRule = width_rule(1 << 12);
/// One head's width (key, value, MLA's no-rope and rope parts, KDA's, the indexer's): 16
/// times the widest real head (256).
pub(crate) const HEAD_DIM: IntRule = width_rule(1 << 12);
/// Routed experts: 8 times Qwen3-Next's 512.
pub(crate) const EXPERTS: IntRule = width_rule(1 << 12);
/// The training context: 6 times Llama 4 Scout's 10M tokens (placements take at most 2^24).
pub(crate) const CONTEXT: IntRule = IntRule {
    min: 1,
    max: 1 << 26,
    why: "memra's bound on a model's context",
};
/// KDA's short convolution taps: 16 times the real 4.
pub(crate) const CONV_KERNEL: IntRule = IntRule {
    min: 2,
    max: 64,
    why: "memra's bound on KDA's convolution taps",
};

/// A float hyperparameter both readers check alike: what it may be, and the test.
pub(crate) struct FloatRule {
    pub allowed: &'static str,
    pub ok: fn(f32) -> bool,
}

/// An epsilon (the RMS norm's, the DSA indexer's layer norm's, mHC's Sinkhorn's): real models
/// use 1e-6 to 1e-5; 0, a negative, NaN or a huge one (1e30) gives zero, NaN or vanishing
/// activations.
pub(crate) const EPSILON: FloatRule = FloatRule {
    allowed: "a positive number below 1",
    ok: |x| x > 0.0 && x < 1.0,
};

/// The rope base: 0, a negative or NaN gives NaN angles.
pub(crate) const ROPE_THETA: FloatRule = FloatRule {
    allowed: "a positive finite number",
    ok: |x| x.is_finite() && x > 0.0,
};

/// The shortest decimal that reads back as the same f32, as the plan's f64.
pub fn exact(x: f32) -> f64 {
    x.to_string()
        .parse()
        .expect("invariant: a float prints as a float")
}

/// FNV-1a 64: a stable hash for fingerprints (no randomized hasher may reach plan text).
pub fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    let mut hash = if seed == 0 {
        0xcbf2_9ce4_8422_2325
    } else {
        seed
    };
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
