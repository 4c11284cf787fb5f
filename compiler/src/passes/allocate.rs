//! Pass 9, allocate: each rank's weight shards, its buffers (scratch, KV cache of its attention
//! layers, recurrent state of its KDA layers, static run IO, boundary slots) and, per device,
//! the bytes its ranks ask for. Buffers that hold something per token get a row per token of
//! a prefill chunk, so memory fit is checked at the largest step.

use super::{RankInfo, Topology};
use crate::model::{Mixer, ModelMeta, ShardRule, TensorMeta, TensorSite};
use crate::placement::Placement;
use crate::plan::{
    mla_attend_rows, mla_parts_len, AttentionSplit, Boundary, Buffer, BufferKind, Collective,
    DeviceUse, Split, WeightShard,
};

/// The weight shards a rank holds, in the model's tensor order.
pub fn weights(model: &ModelMeta, rank: &RankInfo, attention: AttentionSplit) -> Vec<WeightShard> {
    let mut out = Vec::new();
    for t in &model.tensors {
        let held_for_embed = t.site == TensorSite::Embed && rank.embed;
        let held_for_head = match t.site {
            TensorSite::Head => rank.head,
            // A tied model's head is the embedding table, cut by vocab rows.
            TensorSite::Embed => rank.head && model.tied_embeddings,
            TensorSite::Layer(l) => rank.layers.contains(l),
        };
        if held_for_embed {
            out.push(shard(t, Split::Full));
        } else if held_for_head {
            let rule = if t.site == TensorSite::Embed {
                ShardRule::Rows
            } else {
                t.rule
            };
            out.push(shard(t, split_for(model, t, rule, rank, attention)));
        }
    }
    out
}

fn split_for(
    model: &ModelMeta,
    t: &TensorMeta,
    rule: ShardRule,
    rank: &RankInfo,
    attention: AttentionSplit,
) -> Split {
    let (i, n) = (u64::from(rank.tp_index), u64::from(rank.tp_degree));
    // the mixer's tensors: attention's, and KDA's (`ssm_*`)
    let is_attention = t.name.contains(".attn_") || t.name.contains(".ssm_");
    if n == 1 || (is_attention && attention == AttentionSplit::Replicated) {
        return Split::Full;
    }
    let part = |len: u64| (len / n * i, len / n * (i + 1));
    let kv = u64::from(model.kv_heads);
    let gqa = match t.site {
        TensorSite::Layer(l) => model.layer_kind(l).mixer == Mixer::Gqa,
        _ => false,
    };
    let is_kv = gqa && (t.name.contains(".attn_k.") || t.name.contains(".attn_v."));
    if is_kv && n > kv {
        // more ranks than kv heads: the ranks whose query heads share a kv head each hold it
        let hd = u64::from(model.head_dim);
        let head = i * kv / n;
        return Split::Rows {
            start: head * hd,
            end: (head + 1) * hd,
        };
    }
    match rule {
        ShardRule::Replicated => Split::Full,
        ShardRule::Rows => {
            let (start, end) = part(t.shape[0]);
            Split::Rows { start, end }
        }
        ShardRule::Cols => {
            let (start, end) = part(t.shape[t.shape.len() - 1]);
            Split::Cols { start, end }
        }
        ShardRule::Experts => {
            let (start, end) = part(t.shape[0]);
            Split::Experts { start, end }
        }
        ShardRule::Heads => {
            let (start, end) = part(t.shape[0]);
            Split::Heads { start, end }
        }
    }
}

fn shard(t: &TensorMeta, split: Split) -> WeightShard {
    let elems = match split {
        Split::Full => t.elems(),
        Split::Rows { start, end }
        | Split::Experts { start, end }
        | Split::Heads { start, end } => t.elems() / t.shape[0] * (end - start),
        Split::Cols { start, end } => t.elems() / t.shape[t.shape.len() - 1] * (end - start),
    };
    WeightShard {
        tensor: t.name.clone(),
        dtype: t.dtype.name().to_string(),
        shape: t.shape.clone(),
        split,
        bytes: t.dtype.bytes_for(elems),
    }
}

/// The buffers a rank owns, sorted by name.
pub fn buffers(
    model: &ModelMeta,
    placement: &Placement,
    topo: &Topology,
    rank: &RankInfo,
) -> Vec<Buffer> {
    let n = u64::from(rank.tp_degree);
    let r = rank.rank;
    let act_elems = activation_elems(model, placement, rank);
    // what a step holds per token has a row per token of a prefill chunk
    let chunk = placement.prefill_chunk;
    let buffer = |name: String, kind, bytes, tokens, slots| Buffer {
        name,
        kind,
        bytes,
        tokens,
        slots,
    };
    let mut out = vec![
        buffer(
            format!("r{r}.act"),
            BufferKind::Scratch,
            act_elems * 4,
            chunk,
            1,
        ),
        // a chunk's rows sit at consecutive positions from this one
        buffer(format!("r{r}.pos"), BufferKind::Io, 4, 1, 1),
    ];
    if !rank.layers.is_empty() {
        let scores = score_elems(model, placement, rank) * 4;
        out.push(buffer(
            format!("r{r}.scores"),
            BufferKind::Scratch,
            scores,
            1,
            1,
        ));
    }
    if !rank.layers.is_empty() {
        let kv_per_token = model.kv_bytes_per_token_layer(placement.kv_dtype);
        // the MLA latent is every head's; split kv heads are divided, copied ones are not
        let kv_heads = u64::from(model.kv_heads);
        let kv_split = match (&model.mla, placement.attention) {
            (Some(_), _) | (None, AttentionSplit::Replicated) => 1,
            (None, AttentionSplit::Heads) => n.min(kv_heads),
        };
        let range = rank.layers.start..rank.layers.end;
        let kda_layers = model.kda_layers_in(range.clone());
        let attention_layers = rank.layers.len() - kda_layers;
        if attention_layers > 0 {
            // the indexer rows are whole on every rank, for the full DSA layers only
            let tokens = u64::from(placement.max_context) * u64::from(placement.max_sequences);
            let kv = u64::from(attention_layers) * tokens * kv_per_token / kv_split
                + tokens * model.indexer_bytes_per_token(range.clone());
            out.push(buffer(format!("r{r}.kv"), BufferKind::Kv, kv, 1, 1));
        }
        if let (Some(k), true) = (&model.kda, kda_layers > 0) {
            // one f32 state per KDA layer, head and sequence, updated in place in stream
            // order: its address never alternates, so runs touching it keep one phase
            let heads = match placement.attention {
                AttentionSplit::Heads => model.heads / rank.tp_degree,
                AttentionSplit::Replicated => model.heads,
            };
            let state = u64::from(kda_layers)
                * u64::from(placement.max_sequences)
                * k.state_elems(heads)
                * 4;
            out.push(buffer(
                format!("r{r}.state"),
                BufferKind::State,
                state,
                1,
                1,
            ));
            // a verify step keeps the state after each of its rows but the last, so that the
            // sequence can return to the last accepted one
            if let Some(sp) = &placement.speculative {
                out.push(buffer(
                    format!("r{r}.verify_state"),
                    BufferKind::State,
                    state * u64::from(sp.tokens),
                    1,
                    1,
                ));
            }
        }
    }
    if rank.embed || rank.sampler {
        // One token per sequence in flight; a prefill step's prompt chunk.
        out.push(buffer(
            format!("r{r}.token"),
            BufferKind::Io,
            4,
            chunk,
            placement.max_sequences,
        ));
    }
    if rank.head {
        let vocab = u64::from(model.vocab);
        // a group's sampler holds its own vocab rows and the gathered vocabulary
        let logits = match (rank.sampler, n > 1) {
            (true, true) => vocab + vocab / n,
            (true, false) => vocab,
            (false, _) => vocab / n,
        };
        // a prefill step may read back every row's logits (perplexity scores them)
        out.push(buffer(
            format!("r{r}.logits"),
            BufferKind::Io,
            logits * 4,
            chunk,
            1,
        ));
    }
    for b in &topo.boundaries {
        if b.from_rank == r {
            out.push(buffer(b.tx(), BufferKind::Slot, b.bytes, b.tokens, b.slots));
        }
        if b.to_rank == r {
            out.push(buffer(b.rx(), BufferKind::Slot, b.bytes, b.tokens, b.slots));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// f32 activations of one token row on one rank: the residual stream and norms, the mixer's
/// inputs and outputs, the FFN's hidden widths, for MoE the router logits, one row per
/// selected expert plus the shared experts' row (the all-reduce payload) and the selected
/// experts' hidden rows, mHC's other
/// streams and mixing weights, and the DSA indexer's scores and selection.
fn activation_elems(model: &ModelMeta, placement: &Placement, rank: &RankInfo) -> u64 {
    let n = u64::from(rank.tp_degree);
    let d = u64::from(model.embedding);
    let all_heads = u64::from(model.heads);
    let heads = match placement.attention {
        AttentionSplit::Heads => all_heads / n,
        AttentionSplit::Replicated => all_heads,
    };
    let attn_out = u64::from(model.attn_out_width()) * heads / all_heads;
    let mixer = match &model.mla {
        Some(m) => {
            let row = u64::from(m.kv_lora_rank + m.qk_rope_head_dim);
            let q = heads * u64::from(m.qk_nope_head_dim + m.qk_rope_head_dim);
            u64::from(m.q_lora_rank) + q + (heads + 1) * row + heads * u64::from(m.kv_lora_rank)
        }
        None => {
            let kv = (u64::from(model.kv_heads) * heads / all_heads).max(1);
            (heads + 2 * kv) * u64::from(model.head_dim)
        }
    };
    // a KDA layer's q/k/v (through the convolutions), gates, beta and output over its heads
    let kda = u64::from(model.kda_width()) * heads / all_heads;
    let mixer = mixer.max(6 * kda + 2 * heads);
    let attn_out = attn_out.max(kda);
    let (ffn, moe) = match &model.moe {
        Some(m) => {
            let dense = if m.dense_layers > 0 { model.ffn } else { 0 };
            let widest = u64::from(dense.max(m.shared_expert_ffn)) / n;
            let ffn = widest.max(u64::from(m.expert_ffn));
            // the router's logits, a row per selected expert and the shared experts' row, and
            // each selected expert's gate and up rows (a prefill step runs them at once)
            let k = u64::from(m.top_k);
            let selected = 2 * k * u64::from(m.expert_ffn);
            (ffn, u64::from(m.experts) + (k + 1) * d + selected)
        }
        None => (u64::from(model.ffn) / n, 0),
    };
    // a prefill product's inputs narrowed to f16 (half a value each) and a row-parallel
    // product's partials per canonical reduction chunk (at most 8, `reduction_chunks`)
    let products = (d.max(mixer).max(attn_out).max(ffn)).div_ceil(2) + 8 * d;
    // mHC: the other streams, the 24 mixes and the pre, post and combination weights
    let mhc = model.mhc.as_ref().map_or(0, |m| {
        let s = u64::from(m.streams);
        (s - 1) * d + 2 * (2 + s) * s
    });
    // DSA: the indexer's queries, weights, key, gate and pooled key, every pool's score
    // and the selected cells
    let dsa = model.dsa.as_ref().map_or(0, |x| {
        let (ih, id) = (u64::from(x.heads), u64::from(x.head_dim));
        let pools = u64::from(placement.max_context) / u64::from(x.kpool);
        ih * id + ih + 3 * id + pools + u64::from(x.top_k + x.kpool)
    });
    3 * d + mixer + attn_out + 2 * ffn + moe + mhc + dsa + products
}

/// f32 attention scores of one query row over the whole context, per head: attention takes a
/// chunk's queries a few at a time, so this does not grow with the chunk. MLA adds its latent
/// attention's chunk partials: a decode step's row, and the rows of one prefill launch.
fn score_elems(model: &ModelMeta, placement: &Placement, rank: &RankInfo) -> u64 {
    let all_heads = u64::from(model.heads);
    let heads = match placement.attention {
        AttentionSplit::Heads => all_heads / u64::from(rank.tp_degree),
        AttentionSplit::Replicated => all_heads,
    };
    let context = u64::from(placement.max_context);
    let parts = model.mla.as_ref().map_or(0, |m| {
        let width = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let per_row = mla_parts_len(
            width(heads),
            width(u64::from(m.kv_lora_rank)),
            width(context),
        );
        let rows = mla_attend_rows(per_row, width(u64::from(placement.prefill_chunk)));
        (per_row as u64) * (1 + rows as u64)
    });
    heads * context + parts
}

/// What the CUDA runtime takes on each device it opens before any plan buffer: the context
/// with memra's kernels, measured as the device's memory in use less the engine's allocations
/// on an H200 (CUDA 13.0, driver 580; 530.8 MiB with every plan measured, `bench/memory.md`).
pub const CUDA_RUNTIME_BYTES: u64 = 531 << 20;
/// What one NCCL communicator (a tensor-parallel group's, `collective = "nccl"`) takes on
/// each member's device: NCCL's buffers and its proxy's mappings, measured on two H200 joined
/// by NVLink (the image's nvidia-nccl-cu13, 862 MiB; `bench/memory.md`). A boundary's
/// two-rank communicator under `launch` is counted the same until it is measured.
pub const NCCL_COMMUNICATOR_BYTES: u64 = 862 << 20;

/// Boundary ends on `device` whose other end is on another device (`device_of` gives a
/// rank's device): with one process per device (`memra-run launch`) each boundary between
/// two processes is a two-rank NCCL communicator, one member on either device.
pub fn crossing_ends(
    device: u32,
    boundaries: &[Boundary],
    device_of: impl Fn(u32) -> Option<u32>,
) -> u64 {
    boundaries
        .iter()
        .map(|b| (device_of(b.from_rank), device_of(b.to_rank)))
        .filter(|(from, to)| from != to)
        .map(|(from, to)| u64::from(from == Some(device)) + u64::from(to == Some(device)))
        .sum()
}

/// Bytes asked of each declared device, sorted by device.
pub fn device_use(
    placement: &Placement,
    ranks: &[(RankInfo, Vec<WeightShard>, Vec<Buffer>)],
    boundaries: &[Boundary],
) -> Vec<DeviceUse> {
    let device_of = |rank: u32| {
        ranks
            .iter()
            .find(|(i, ..)| i.rank == rank)
            .map(|(i, ..)| i.device)
    };
    placement
        .devices
        .iter()
        .map(|(&device, &memory_bytes)| {
            let used = ranks.iter().any(|(i, ..)| i.device == device);
            let mut u = DeviceUse {
                device,
                host: placement.hosts.get(&device).cloned(),
                memory_bytes,
                weight_bytes: 0,
                kv_bytes: 0,
                state_bytes: 0,
                buffer_bytes: 0,
                runtime_bytes: if used { CUDA_RUNTIME_BYTES } else { 0 },
                transport_bytes: 0,
                total_bytes: 0,
                launch_bytes: crossing_ends(device, boundaries, device_of)
                    * NCCL_COMMUNICATOR_BYTES,
            };
            for (info, weights, buffers) in ranks.iter().filter(|(i, ..)| i.device == device) {
                if info.tp_degree > 1 && placement.collective == Collective::Nccl {
                    u.transport_bytes += NCCL_COMMUNICATOR_BYTES;
                }
                u.weight_bytes += weights.iter().map(|w| w.bytes).sum::<u64>();
                for b in buffers {
                    let bytes = b.total_bytes();
                    match b.kind {
                        BufferKind::Kv => u.kv_bytes += bytes,
                        BufferKind::State => u.state_bytes += bytes,
                        _ => u.buffer_bytes += bytes,
                    }
                }
            }
            u.total_bytes = u.weight_bytes
                + u.kv_bytes
                + u.state_bytes
                + u.buffer_bytes
                + u.runtime_bytes
                + u.transport_bytes;
            u
        })
        .collect()
}
