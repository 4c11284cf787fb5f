//! The execution plan: the contract between `memra-compile` and `memra-run`.
//!
//! A plan is TOML so that a reviewer can read its diff. It is deterministic: the same placement
//! and model always give the same bytes (sorted vectors, no node indices, no timestamps). The
//! executor depends on this module only; nothing here knows about petgraph or CUDA.
//!
//! Each rank's `program` is the ordered list of steps it enqueues for one step: a decode step
//! (one token) or a prefill step (a prompt chunk of up to `runtime.prefill_chunk` tokens of one
//! sequence). Both walk the same program: every op works on rows of tokens, so a prefill step
//! is the decode step with a `tokens` dimension on the buffers that carry activations
//! (`Buffer::tokens`, `Boundary::tokens`); the schedule, its events and its verification are
//! the same. Step `t` serves sequence `t % max_sequences` (round-robin, so several sequences
//! are in flight across pipeline stages). Steps that touch a boundary slot use
//! `Boundary::send_slot` or `recv_slot`; boundary events are per slot too.

use anyhow::{anyhow, Context};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Version of the plan format; the executor refuses any other.
pub const FORMAT_VERSION: u32 = 2;

/// Whether TOML `text` is a placement (a `[pipeline]` table, no `format_version`) rather
/// than a plan.
fn is_placement(text: &str) -> bool {
    text.parse::<toml::Table>()
        .is_ok_and(|t| t.contains_key("pipeline") && !t.contains_key("format_version"))
}

/// Slots of a hidden-state boundary (double buffering).
pub const HIDDEN_SLOTS: u32 = 2;

/// A whole execution plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub format_version: u32,
    /// Hash of the validated placement (table order does not change it).
    pub placement_hash: String,
    pub model: ModelSummary,
    pub runtime: RuntimeSettings,
    /// Speculative decoding: the draft source and the drafted tokens a verify step checks;
    /// absent: plain decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<Speculative>,
    pub devices: Vec<DeviceUse>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<TpGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub boundaries: Vec<Boundary>,
    pub ranks: Vec<Rank>,
}

/// Decode-time settings from the placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSettings {
    pub max_context: u32,
    pub max_sequences: u32,
    pub kv_dtype: String,
    /// Decode steps the host may enqueue ahead of the readback it has consumed.
    pub in_flight: u32,
    /// Most prompt tokens one prefill step takes (the rows of the `tokens` buffers).
    pub prefill_chunk: u32,
    pub capture: CaptureMode,
}

/// Speculative decoding from the placement's `[speculative]`: each step verifies up to
/// `tokens` drafted tokens in one step of `tokens + 1` rows of one sequence (the last
/// accepted token, then the drafts, at consecutive positions), each row with the bits of a
/// one-token decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Speculative {
    pub draft: Draft,
    /// Most drafted tokens per verify step (k).
    pub tokens: u32,
}

/// Where drafted tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Draft {
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the context's
    /// last few tokens.
    Lookup,
    /// The model's own NextN (MTP) block.
    Nextn,
}

impl Draft {
    /// Every draft source, in the order errors list them.
    pub const ALL: [Draft; 2] = [Draft::Lookup, Draft::Nextn];

    /// The name in placement and plan text.
    pub fn name(self) -> &'static str {
        match self {
            Draft::Lookup => "lookup",
            Draft::Nextn => "nextn",
        }
    }
}

/// Whether runs are captured as CUDA graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMode {
    Graphs,
    Eager,
}

/// Memory a device is asked to hold, per kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceUse {
    pub device: u32,
    /// The host the device is on, when the placement names one (absent: the local host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub memory_bytes: u64,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    /// Recurrent state (KDA convolution windows and delta-rule states); written only when
    /// the device holds some.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub state_bytes: u64,
    pub buffer_bytes: u64,
    /// The CUDA runtime's own memory on the device (context and kernels), when a rank uses it.
    pub runtime_bytes: u64,
    /// The transport's: one NCCL communicator per tensor-parallel rank on the device with
    /// `collective = "nccl"`.
    pub transport_bytes: u64,
    pub total_bytes: u64,
    /// What the device takes on top of `total_bytes` when each device runs in its own process
    /// (`memra-run launch`): one two-rank NCCL communicator per boundary end on it whose
    /// other end is on another device; written only when the device has such ends.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub launch_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// A tensor-parallel group and its canonical reduction tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpGroup {
    pub group: u32,
    pub stage: u32,
    pub ranks: Vec<u32>,
    /// How the group runs attention: heads split over the ranks (the default) or every rank
    /// running all heads (expert parallelism: only FFNs and experts are split).
    #[serde(default, skip_serializing_if = "AttentionSplit::is_heads")]
    pub attention: AttentionSplit,
    /// True when the degree nests in the reduction tree, so logits are bit-identical to 1 rank.
    pub exact: bool,
    /// The all-reduce's combine order, e.g. `(r0 r1)` or `((r0 r1) (r2 r3))`.
    pub tree: String,
    /// How partials travel between the members; written only when not `oneshot`.
    #[serde(default, skip_serializing_if = "Collective::is_oneshot")]
    pub collective: Collective,
}

/// The transport of a tensor-parallel group's collectives. Either way the partials are
/// combined in the group's tree on every member, so the bits do not depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// The capturable one-shot kernels: members push into each other's memory (peer memory
    /// across devices).
    #[default]
    Oneshot,
    /// NCCL all-gathers the partials (one communicator rank per device).
    Nccl,
}

impl Collective {
    /// The name in placement and plan text.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Oneshot => "oneshot",
            Collective::Nccl => "nccl",
        }
    }
    fn is_oneshot(&self) -> bool {
        *self == Collective::Oneshot
    }
}

/// How a tensor-parallel group runs attention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionSplit {
    /// Heads split over the ranks; the output projection is all-reduced.
    #[default]
    Heads,
    /// Every rank runs every head; nothing to reduce.
    Replicated,
}

impl AttentionSplit {
    /// True for the default (serde skips writing it).
    pub fn is_heads(&self) -> bool {
        *self == AttentionSplit::Heads
    }
}

/// What a boundary carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Carries {
    /// The residual stream between pipeline stages.
    Hidden,
    /// The sampled token, fed back from the last stage to the first.
    Token,
}

/// How a boundary moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    DeviceCopy,
    PeerCopy,
}

impl Carries {
    /// The name in plan text.
    pub fn name(self) -> &'static str {
        match self {
            Carries::Hidden => "hidden",
            Carries::Token => "token",
        }
    }
}

impl Transport {
    /// The name in plan text.
    pub fn name(self) -> &'static str {
        match self {
            Transport::DeviceCopy => "device_copy",
            Transport::PeerCopy => "peer_copy",
        }
    }
}

/// A point-to-point handoff between two ranks through double-buffered slots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Boundary {
    pub boundary: u32,
    pub carries: Carries,
    pub from_rank: u32,
    pub to_rank: u32,
    /// Bytes of one token row.
    pub bytes: u64,
    /// i32 values of a DSA selection per token row (the cell count, then the cells) that a
    /// hidden-state boundary carries besides the residual, when a shared-indexer layer after
    /// the cut reads a full layer before it (0, not written, otherwise). A slot of `rows`
    /// rows holds the residual rows first, then one selection block per row; `bytes`
    /// counts both.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub selection: u32,
    /// Token rows a slot holds: `runtime.prefill_chunk` for the hidden state, 1 for the
    /// sampled token (one per step, prefill or decode).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tokens: u32,
    pub slots: u32,
    /// Decode steps between a send and its receive: 0 for the hidden state; for the token,
    /// the number of sequences decoded round-robin (a sequence's next token is embedded
    /// when its turn comes again).
    pub lag: u32,
    pub transport: Transport,
}

impl Boundary {
    /// Name of the sender's slot buffer.
    pub fn tx(&self) -> String {
        format!("b{}.tx", self.boundary)
    }
    /// Name of the receiver's slot buffer.
    pub fn rx(&self) -> String {
        format!("b{}.rx", self.boundary)
    }
    /// Event recorded by the sender once `tx[slot]` holds the step's data.
    pub fn ready(&self) -> String {
        format!("b{}.ready", self.boundary)
    }
    /// Event recorded by the receiver once it has copied `tx[slot]` away.
    pub fn consumed(&self) -> String {
        format!("b{}.consumed", self.boundary)
    }
    /// Slot the sender writes at decode step `step`.
    pub fn send_slot(&self, step: u64) -> u32 {
        (step % u64::from(self.slots)) as u32
    }
    /// Whether the run ops `ops` of rank `rank` address this boundary's slots inside the run,
    /// where a graph bakes the addresses in: the hidden state it loads or stores, the token it
    /// samples into. The token a rank embeds is copied out of its slot before the run.
    pub fn addressed_by(&self, rank: u32, ops: &[Op]) -> bool {
        match self.carries {
            Carries::Hidden => {
                (self.to_rank == rank && ops.contains(&Op::LoadHidden))
                    || (self.from_rank == rank && ops.contains(&Op::StoreHidden))
            }
            Carries::Token => self.from_rank == rank && ops.contains(&Op::StoreToken),
        }
    }
    /// Slot the receiver takes at decode step `step`: the one sent `lag` steps earlier.
    pub fn recv_slot(&self, step: u64) -> u32 {
        let slots = u64::from(self.slots);
        ((step + slots - u64::from(self.lag) % slots) % slots) as u32
    }
}

/// The slot an access of `event` by `rank` at decode step `t` concerns: the receiver's slot on
/// the receiving side of a boundary (its `ready` waits, its `consumed` records), the sender's
/// slot otherwise; 0 for an event of no boundary. Verify replays with this rule and both
/// executors bind events with it, so what verify proves is what they run.
pub fn event_slot(boundaries: &[Boundary], event: &str, rank: u32, t: u64) -> u32 {
    boundaries
        .iter()
        .find(|b| event == b.ready() || event == b.consumed())
        .map_or(0, |b| {
            if b.to_rank == rank {
                b.recv_slot(t)
            } else {
                b.send_slot(t)
            }
        })
}

/// One rank: a device, its streams, its weights, its buffers and its program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rank {
    pub rank: u32,
    pub stage: u32,
    pub device: u32,
    pub tp_index: u32,
    pub tp_degree: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    /// Layers this rank runs, `first..end`.
    pub layers: LayerRange,
    pub embed: bool,
    pub head: bool,
    pub streams: Vec<String>,
    pub buffers: Vec<Buffer>,
    pub program: Vec<Step>,
    pub weights: Vec<WeightShard>,
}

/// A half-open range of layers, written `a..b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LayerRange {
    pub start: u32,
    pub end: u32,
}

impl LayerRange {
    /// Number of layers in the range.
    pub fn len(&self) -> u32 {
        self.end - self.start
    }
    /// True when the range holds no layer.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
    /// Whether `layer` is in the range.
    pub fn contains(&self, layer: u32) -> bool {
        (self.start..self.end).contains(&layer)
    }
}

/// What a buffer is for; decides who may touch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// Per-rank activations and intermediates; never touched by another rank.
    Scratch,
    /// The KV cache of this rank's layers.
    Kv,
    /// The recurrent state of this rank's KDA layers and heads, updated in place each token.
    State,
    /// Static inputs and outputs of runs (token, position, logits).
    Io,
    /// A boundary slot buffer: written by one rank, read by a copy on another.
    Slot,
}

/// A device buffer owned by a rank: `slots` slots of `tokens` rows of `bytes` each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Buffer {
    pub name: String,
    pub kind: BufferKind,
    /// Bytes of one token row (of the whole buffer when it has no token rows).
    pub bytes: u64,
    /// Token rows per slot: `runtime.prefill_chunk` for what a prefill step holds per token
    /// (activations, tokens, logits, hidden-state slots), 1 (not written) for the rest.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tokens: u32,
    pub slots: u32,
}

impl Buffer {
    /// Bytes of the whole buffer, every slot and token row.
    pub fn total_bytes(&self) -> u64 {
        self.bytes * u64::from(self.tokens) * u64::from(self.slots)
    }
}

fn one() -> u32 {
    1
}

fn is_one(x: &u32) -> bool {
    *x == 1
}

/// A slice of one model tensor held by a rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightShard {
    pub tensor: String,
    pub dtype: String,
    /// Logical shape `[rows, cols]` of the whole tensor (rows = outputs), or `[len]`.
    pub shape: Vec<u64>,
    pub split: Split,
    pub bytes: u64,
}

/// The logical shape of a GGUF tensor (outermost dim first, as plans write shapes) from its
/// GGUF dims (innermost first). llama.cpp stores KDA's convolution weights as
/// `[d_conv, 1, channels]` (or with a trailing 1) and `ssm_a` as `[1, heads]` (or
/// `[1, heads, 1, 1]`); their singleton axes are dropped, so a convolution is a
/// `[channels, d_conv]` matrix and `ssm_a` a vector of heads, whichever form the file has.
pub fn logical_shape(tensor: &str, gguf_dims: &[u64]) -> Vec<u64> {
    let squeezed = tensor.contains(".ssm_conv1d_") || tensor.ends_with(".ssm_a");
    gguf_dims
        .iter()
        .rev()
        .copied()
        .filter(|&d| !(squeezed && d == 1))
        .collect()
}

/// Cache rows of a chunk of MLA latent attention's canonical order (MLA_CHUNK in
/// kernels/mla.cu).
pub const MLA_CHUNK: usize = 128;

/// f32 values of the scratch MLA latent attention of `heads` heads with latents of `kvl`
/// over a cache of `capacity` rows needs for one query row: per head and chunk, its latent
/// sums, max and sum.
pub fn mla_parts_len(heads: usize, kvl: usize, capacity: usize) -> usize {
    heads * capacity.div_ceil(MLA_CHUNK) * (kvl + 2)
}

/// The query rows of one prefill launch of MLA latent attention, whose partials take
/// `per_row` f32 values a row, for a step of `rows` rows: as many as fit 64 MiB, at least one.
pub fn mla_attend_rows(per_row: usize, rows: usize) -> usize {
    const PARTS_BUDGET_BYTES: usize = 64 << 20;
    (PARTS_BUDGET_BYTES / 4 / per_row.max(1)).clamp(1, rows.max(1))
}

/// Number of chunks of the canonical reduction tree for a reduction of length `k` whose weights
/// come in blocks of `block` elements: the largest power of two up to 8 whose chunks are whole
/// blocks. A TP degree nests in the tree (bit-identical logits) when it divides this number.
pub fn reduction_chunks(k: u64, block: u64) -> u32 {
    let mut chunks = 8u32;
    while chunks > 1 && !k.is_multiple_of(u64::from(chunks) * block) {
        chunks /= 2;
    }
    chunks
}

impl Plan {
    /// Reads the plan at `path`. A placement given instead is named as one, with the command
    /// that compiles it.
    pub fn read(path: &Path) -> anyhow::Result<Plan> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read the plan", path.display()))?;
        Plan::from_toml(&text).map_err(|e| {
            let file = path.display();
            if !is_placement(&text) {
                return anyhow!("{file}: {e}");
            }
            let stem = path.file_stem().unwrap_or_default().to_string_lossy();
            let plan = path.with_file_name(format!("{stem}.plan.toml"));
            anyhow!(
                "{file}: this file is a placement, not an execution plan; compile it first with `memra-compile {file}`, then run the plan it writes ({})",
                plan.display()
            )
        })
    }

    /// Parse plan text, refusing other format versions.
    pub fn from_toml(text: &str) -> Result<Plan, String> {
        #[derive(Deserialize)]
        struct VersionOnly {
            format_version: Option<u32>,
        }
        let version: VersionOnly = toml::from_str(text).map_err(|e| e.message().to_string())?;
        let Some(format_version) = version.format_version else {
            return Err("this file is not an execution plan: it has no format_version (memra-compile writes plans from placements)".into());
        };
        if format_version != FORMAT_VERSION {
            return Err(format!(
                "plan format version {format_version} is not supported; this build reads version {FORMAT_VERSION}"
            ));
        }
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The plan as TOML text: sections as tables, and the long per-rank lists (buffers,
    /// program, weights) as arrays with one inline table per line, so a diff shows one line
    /// per changed entry.
    pub fn to_toml(&self) -> String {
        let table = toml::Table::try_from(self).expect("invariant: plan types serialize to toml");
        let mut out = String::new();
        text::write_table(&mut out, "", &table);
        out
    }

    /// Weight bytes one decode step reads over all ranks: every shard, except that a rank
    /// which only embeds reads one row of the embedding table, and that the routed experts'
    /// stacks (`*_exps`) are read for the `top_k` chosen experts only (over all ranks a token
    /// reads `top_k / experts` of every stack, whichever ranks hold the chosen ones).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let vocab = u64::from(self.model.vocab);
        let routed = self
            .model
            .moe
            .as_ref()
            .map(|m| (u64::from(m.top_k), u64::from(m.experts)));
        self.ranks
            .iter()
            .flat_map(|r| r.weights.iter().map(move |w| (r, w)))
            .map(|(r, w)| {
                let lookup_only =
                    w.tensor == "token_embd.weight" && !(r.head && self.model.tied_embeddings);
                match routed {
                    _ if lookup_only => w.bytes / vocab,
                    Some((k, n)) if w.tensor.ends_with("_exps.weight") => w.bytes * k / n,
                    _ => w.bytes,
                }
            })
            .sum()
    }

    /// The rank with this id.
    pub fn rank(&self, rank: u32) -> Option<&Rank> {
        self.ranks.iter().find(|r| r.rank == rank)
    }

    /// The boundary with this id.
    pub fn boundary(&self, id: u32) -> Option<&Boundary> {
        self.boundaries.iter().find(|b| b.boundary == id)
    }
}

mod model;
mod program;
mod text;

pub use model::{
    layer_kind, selection_crosses, selection_source, ClampSummary, ClampedFfn, DsaSummary, FfnKind,
    Gating, KdaSummary, LayerKind, Llama3RopeSummary, MhcSummary, Mixer, MlaSummary, ModelSummary,
    MoeSummary, ReductionChunks, YarnSummary,
};
pub use program::{IslandReason, Op, Segment, Split, Step};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_text_round_trips() {
        for text in [
            "embed",
            "layers 0..15: attn_pre attn_core attn_out all_reduce ffn all_reduce",
            "layers 3..4: moe_router",
            "gather_logits",
        ] {
            let op: Op = text.parse().unwrap();
            assert_eq!(op.to_string(), text);
        }
        assert!("layers 3..1: ffn".parse::<Op>().is_err());
        assert!("layers 0..2: ffm".parse::<Op>().is_err());
    }

    #[test]
    fn split_and_reason_round_trip() {
        for text in [
            "full",
            "rows 0..288",
            "cols 288..576",
            "experts 0..64",
            "heads 2..4",
        ] {
            assert_eq!(text.parse::<Split>().unwrap().to_string(), text);
        }
        let reason: IslandReason = "forced: nan hunt in layer 7".parse().unwrap();
        assert_eq!(reason, IslandReason::Forced("nan hunt in layer 7".into()));
    }

    #[test]
    fn a_token_reads_top_k_of_the_expert_stacks() {
        let plan = Plan::from_toml(include_str!("../../../plans/qwen3-30b-a3b-tp4.plan.toml"))
            .expect("the golden plan parses");
        let moe = plan.model.moe.as_ref().expect("qwen3moe has experts");
        let (mut stacks, mut rest) = (0u64, 0u64);
        for r in &plan.ranks {
            for w in &r.weights {
                if w.tensor.ends_with("_exps.weight") {
                    stacks += w.bytes;
                } else if w.tensor == "token_embd.weight" && !(r.head && plan.model.tied_embeddings)
                {
                    rest += w.bytes / u64::from(plan.model.vocab);
                } else {
                    rest += w.bytes;
                }
            }
        }
        let k = u64::from(moe.top_k);
        let n = u64::from(moe.experts);
        assert!(stacks > 0 && k < n);
        // per shard rounding: at most one byte per stack shard
        let got = plan.weight_bytes_per_token();
        let want = rest + stacks * k / n;
        assert!(got <= want && want - got < 1000, "{got} vs {want}");
    }

    #[test]
    fn reduction_chunks_follow_blocks() {
        assert_eq!(reduction_chunks(576, 32), 2);
        assert_eq!(reduction_chunks(1536, 32), 8);
        assert_eq!(reduction_chunks(256, 32), 8);
        assert_eq!(reduction_chunks(96, 32), 1);
        assert_eq!(reduction_chunks(4096, 256), 8);
    }
}
