//! A rank's program in the plan: its steps (waits, records, copies, runs, islands, the
//! readback), the ops a run or island holds, the layer segments, and which part of a tensor a
//! weight shard holds.

use serde::{Deserialize, Serialize};

use super::LayerRange;

/// Which part of a tensor a shard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Full,
    /// Output rows `start..end` (column-parallel: q, k, v, gate, up, vocab-parallel head).
    Rows {
        start: u64,
        end: u64,
    },
    /// Input columns `start..end` (row-parallel: attention output, FFN down).
    Cols {
        start: u64,
        end: u64,
    },
    /// Experts `start..end` of a stacked expert tensor.
    Experts {
        start: u64,
        end: u64,
    },
    /// Heads `start..end` of a per-head stack of matrices (MLA's `attn_k_b`, `attn_v_b`).
    Heads {
        start: u64,
        end: u64,
    },
}

/// Why a stretch of a rank's program is not captured into a graph.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum IslandReason {
    /// The placement's capture mode is `eager`.
    CaptureDisabled,
    /// The placement forces these layers eager; the text is the placement's reason.
    Forced(String),
}

/// One step of a rank's per-token program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// A maximal stretch of capturable ops, replayed as a CUDA graph.
    Run {
        id: String,
        stream: String,
        /// Steps after which the run's baked addresses repeat: the least common multiple of
        /// the slot counts of the boundaries it addresses inside the run
        /// (`Boundary::addressed_by`: the hidden state in and out, the token it samples); 1
        /// when it touches none. The token a run embeds is staged before the run, so its
        /// slots do not count.
        phases: u32,
        ops: Vec<Op>,
    },
    /// Ops that run eagerly, and why.
    Island {
        id: String,
        stream: String,
        reason: IslandReason,
        ops: Vec<Op>,
    },
    /// Record an event (slot-indexed when it names a boundary event).
    Record { stream: String, event: String },
    /// Make the stream wait for the latest record of an event.
    Wait { stream: String, event: String },
    /// Copy a boundary's `tx[slot]` into `rx[slot]` on the receiver's stream.
    Copy { stream: String, boundary: u32 },
    /// Copy logits and the sampled token to the host ring (slot `step % in_flight`).
    Readback { stream: String },
}

impl Step {
    /// The stream the step is enqueued on.
    pub fn stream(&self) -> &str {
        match self {
            Step::Run { stream, .. }
            | Step::Island { stream, .. }
            | Step::Record { stream, .. }
            | Step::Wait { stream, .. }
            | Step::Copy { stream, .. }
            | Step::Readback { stream } => stream,
        }
    }
    /// The ops of a run or island; empty for the other steps.
    pub fn ops(&self) -> &[Op] {
        match self {
            Step::Run { ops, .. } | Step::Island { ops, .. } => ops,
            _ => &[],
        }
    }
}

/// A per-layer piece of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Segment {
    /// RMS norm, QKV projection (+bias, q/k norm), RoPE.
    AttnPre,
    /// KV-cache write and attention over the cache.
    AttnCore,
    /// Output projection (a partial sum under TP).
    AttnOut,
    /// Sum of the group's partials in the canonical tree.
    AllReduce,
    /// RMS norm, gate/up, activation, down projection.
    Ffn,
    /// RMS norm, expert router, device-side top-k and weights.
    MoeRouter,
    /// The routed experts this rank holds, each weighted, one row per selected expert.
    MoeExperts,
    /// The always-on shared experts (a dense FFN, split like one).
    MoeShared,
    /// MLA: RMS norm, query (low-rank or direct), latent and rope key, rope, and the query's
    /// no-rope part absorbed into the latent space (`attn_k_b`).
    MlaPre,
    /// MLA: latent-cache write, attention over the latent cache, and the per-head value
    /// up-projection (`attn_v_b`).
    MlaCore,
    /// KDA: RMS norm, q/k/v projections through the short causal convolutions (reading and
    /// updating their window state), q/k L2 norms, the per-channel decay gate and the
    /// per-head mixing rate beta.
    KdaPre,
    /// KDA: the gated delta rule over each head's recurrent state (updated in place), then the
    /// per-head RMS norm times the sigmoid output gate.
    KdaCore,
    /// mHC before the mixer: the streams' mixing weights (pre, post, Sinkhorn-normalized
    /// combination) and the mixer's input, the pre-weighted sum of the streams.
    HcAttnPre,
    /// mHC before the FFN, with the FFN's mixing weights.
    HcFfnPre,
    /// DSA: the indexer's key, gate and pooled keys into its cache, the pools' scores and the
    /// cells the MLA softmax of this token runs over.
    DsaSelect,
}

/// One entry of a run or island: model-level ops, or a layer range with its segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read the token (from `token` or the token boundary's slot) and look up its embedding.
    Embed,
    /// For each layer of `layers`, the segments in order.
    Layers {
        layers: LayerRange,
        segments: Vec<Segment>,
    },
    /// Residual add, final norm, this rank's vocab rows of the head.
    Head,
    /// Gather the vocab-parallel logits on the group's first rank.
    GatherLogits,
    /// Pick the next token on the device.
    Sample,
    /// Read the hidden state from the incoming boundary slot `rx[slot]`.
    LoadHidden,
    /// Write the hidden state into the outgoing boundary slot `tx[slot]`.
    StoreHidden,
    /// Write the sampled token into the outgoing token slot `tx[slot]`.
    StoreToken,
}

impl Segment {
    /// The segment's name in plan text.
    pub fn name(self) -> &'static str {
        match self {
            Segment::AttnPre => "attn_pre",
            Segment::AttnCore => "attn_core",
            Segment::AttnOut => "attn_out",
            Segment::AllReduce => "all_reduce",
            Segment::Ffn => "ffn",
            Segment::MoeRouter => "moe_router",
            Segment::MoeExperts => "moe_experts",
            Segment::MoeShared => "moe_shared",
            Segment::MlaPre => "mla_pre",
            Segment::MlaCore => "mla_core",
            Segment::KdaPre => "kda_pre",
            Segment::KdaCore => "kda_core",
            Segment::HcAttnPre => "hc_attn_pre",
            Segment::HcFfnPre => "hc_ffn_pre",
            Segment::DsaSelect => "dsa_select",
        }
    }
    pub(super) const ALL: [Segment; 15] = [
        Segment::AttnPre,
        Segment::AttnCore,
        Segment::AttnOut,
        Segment::AllReduce,
        Segment::Ffn,
        Segment::MoeRouter,
        Segment::MoeExperts,
        Segment::MoeShared,
        Segment::MlaPre,
        Segment::MlaCore,
        Segment::KdaPre,
        Segment::KdaCore,
        Segment::HcAttnPre,
        Segment::HcFfnPre,
        Segment::DsaSelect,
    ];
}
