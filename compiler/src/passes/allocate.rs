//! Pass 9, allocate: each rank's weight shards, its buffers (scratch, KV cache, static run
//! IO, boundary slots) and, per device, the bytes its ranks ask for.

use super::{RankInfo, Topology};
use crate::model::{ModelMeta, ShardRule, TensorMeta, TensorSite};
use crate::placement::Placement;
use crate::plan::{Buffer, BufferKind, DeviceUse, Split, WeightShard};

/// The weight shards a rank holds, in the model's tensor order.
pub fn weights(model: &ModelMeta, rank: &RankInfo) -> Vec<WeightShard> {
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
            out.push(shard(t, split_for(t, rule, rank)));
        }
    }
    out
}

fn split_for(t: &TensorMeta, rule: ShardRule, rank: &RankInfo) -> Split {
    let (i, n) = (u64::from(rank.tp_index), u64::from(rank.tp_degree));
    if n == 1 {
        return Split::Full;
    }
    let part = |len: u64| (len / n * i, len / n * (i + 1));
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
    }
}

fn shard(t: &TensorMeta, split: Split) -> WeightShard {
    let elems = match split {
        Split::Full => t.elems(),
        Split::Rows { start, end } | Split::Experts { start, end } => {
            t.elems() / t.shape[0] * (end - start)
        }
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
    let d = u64::from(model.embedding);
    let heads = u64::from(model.heads) / n;
    let ffn_width = match &model.moe {
        Some(m) => u64::from(
            model
                .ffn
                .max(m.expert_ffn * m.top_k)
                .max(m.shared_expert_ffn),
        ),
        None => u64::from(model.ffn),
    };
    let qkv = u64::from(model.heads + 2 * model.kv_heads) * u64::from(model.head_dim);
    let act_elems = 3 * d
        + qkv / n
        + u64::from(model.attn_out_width()) / n
        + 2 * ffn_width / n
        + heads * u64::from(placement.max_context);
    let buffer = |name: String, kind, bytes, slots| Buffer {
        name,
        kind,
        bytes,
        slots,
    };
    let mut out = vec![
        buffer(format!("r{r}.act"), BufferKind::Scratch, act_elems * 4, 1),
        buffer(format!("r{r}.pos"), BufferKind::Io, 4, 1),
    ];
    if !rank.layers.is_empty() {
        let kv_per_token = model.kv_bytes_per_token_layer(placement.kv_dtype);
        let kv_split = if model.mla.is_some() { 1 } else { n };
        let kv = u64::from(rank.layers.len())
            * u64::from(placement.max_context)
            * u64::from(placement.max_sequences)
            * kv_per_token
            / kv_split;
        out.push(buffer(format!("r{r}.kv"), BufferKind::Kv, kv, 1));
    }
    if rank.embed || rank.sampler {
        // One token per sequence in flight.
        out.push(buffer(
            format!("r{r}.token"),
            BufferKind::Io,
            4,
            placement.max_sequences,
        ));
    }
    if rank.head {
        let vocab = u64::from(model.vocab);
        let logits = if rank.sampler { vocab } else { vocab / n };
        out.push(buffer(
            format!("r{r}.logits"),
            BufferKind::Io,
            logits * 4,
            1,
        ));
    }
    for b in &topo.boundaries {
        if b.from_rank == r {
            out.push(buffer(b.tx(), BufferKind::Slot, b.bytes, b.slots));
        }
        if b.to_rank == r {
            out.push(buffer(b.rx(), BufferKind::Slot, b.bytes, b.slots));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Bytes asked of each declared device, sorted by device.
pub fn device_use(
    placement: &Placement,
    ranks: &[(RankInfo, Vec<WeightShard>, Vec<Buffer>)],
) -> Vec<DeviceUse> {
    placement
        .devices
        .iter()
        .map(|(&device, &memory_bytes)| {
            let mut u = DeviceUse {
                device,
                host: placement.hosts.get(&device).cloned(),
                memory_bytes,
                weight_bytes: 0,
                kv_bytes: 0,
                buffer_bytes: 0,
                total_bytes: 0,
            };
            for (_, weights, buffers) in ranks.iter().filter(|(i, ..)| i.device == device) {
                u.weight_bytes += weights.iter().map(|w| w.bytes).sum::<u64>();
                for b in buffers {
                    let bytes = b.bytes * u64::from(b.slots);
                    match b.kind {
                        BufferKind::Kv => u.kv_bytes += bytes,
                        _ => u.buffer_bytes += bytes,
                    }
                }
            }
            u.total_bytes = u.weight_bytes + u.kv_bytes + u.buffer_bytes;
            u
        })
        .collect()
}
