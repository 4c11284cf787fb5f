//! Pass 10, emit: assemble the plan. Everything in it is sorted or in schedule order, so the
//! same placement and model always give the same bytes.

use super::allocate::{buffers, device_use, weights};
use super::Topology;
use crate::graph::StreamKind;
use crate::model::{exact, fnv1a, ModelMeta};
use crate::placement::Placement;
use crate::plan::{
    reduction_chunks, AttentionSplit, ModelSummary, Plan, Rank, ReductionChunks, RuntimeSettings,
    Step, TpGroup, FORMAT_VERSION,
};

/// Build the plan from the passes' results.
pub fn emit(
    model: &ModelMeta,
    placement: &Placement,
    topo: &Topology,
    programs: Vec<Vec<Step>>,
) -> Plan {
    let chunks = model_chunks(model);
    let allocated: Vec<_> = topo
        .ranks
        .iter()
        .map(|r| {
            (
                r.clone(),
                weights(model, r, placement.attention),
                buffers(model, placement, topo, r),
            )
        })
        .collect();
    let devices = device_use(placement, &allocated, &topo.boundaries);
    let mut groups = Vec::new();
    for s in 0..placement.stages.len() {
        let ranks: Vec<u32> = topo
            .ranks
            .iter()
            .filter(|r| r.stage == s as u32)
            .map(|r| r.rank)
            .collect();
        let degree = ranks.len() as u32;
        if degree > 1 {
            let split_heads = placement.attention == AttentionSplit::Heads;
            groups.push(TpGroup {
                group: groups.len() as u32,
                stage: s as u32,
                attention: placement.attention,
                exact: degree.is_power_of_two()
                    && (!split_heads || chunks.attn_out.is_multiple_of(degree))
                    && chunks.ffn_down.is_multiple_of(degree),
                tree: tree(&ranks),
                ranks,
                collective: placement.collective,
            });
        }
    }
    let ranks = allocated
        .into_iter()
        .zip(programs)
        .map(|((info, weights, buffers), program)| {
            let mut streams = vec![StreamKind::Compute.name().to_string()];
            if info.sampler {
                streams.push(StreamKind::Readback.name().to_string());
            }
            Rank {
                rank: info.rank,
                stage: info.stage,
                device: info.device,
                tp_index: info.tp_index,
                tp_degree: info.tp_degree,
                group: groups
                    .iter()
                    .find(|g| g.ranks.contains(&info.rank))
                    .map(|g| g.group),
                layers: info.layers,
                embed: info.embed,
                head: info.head,
                streams,
                buffers,
                program,
                weights,
            }
        })
        .collect();
    Plan {
        format_version: FORMAT_VERSION,
        placement_hash: format!("{:016x}", fnv1a(placement.canonical().as_bytes(), 0)),
        model: model_summary(model, &placement.model_source),
        runtime: RuntimeSettings {
            max_context: placement.max_context,
            max_sequences: placement.max_sequences,
            kv_dtype: placement.kv_dtype.name().to_string(),
            in_flight: placement.in_flight,
            prefill_chunk: placement.prefill_chunk,
            capture: placement.capture,
        },
        speculative: placement.speculative,
        devices,
        groups,
        boundaries: topo.boundaries.clone(),
        ranks,
    }
}

/// Reduction-tree chunks of the model's row-parallel products: the attention output, and
/// one count for every FFN down projection a group splits (dense FFNs and shared experts;
/// routed experts are whole on one rank; a model with nothing else counts theirs). Counts are
/// powers of two, so the smallest fits all.
fn model_chunks(model: &ModelMeta) -> ReductionChunks {
    let chunks_of = |suffix: &str| {
        model
            .tensors
            .iter()
            .filter(|t| t.name.ends_with(suffix))
            .map(|t| reduction_chunks(t.shape[t.shape.len() - 1], t.dtype.block_elems()))
            .min()
    };
    ReductionChunks {
        attn_out: chunks_of("attn_output.weight").unwrap_or(1),
        ffn_down: [
            chunks_of("ffn_down.weight"),
            chunks_of("ffn_down_shexp.weight"),
        ]
        .into_iter()
        .flatten()
        .min()
        .or_else(|| chunks_of("ffn_down_exps.weight"))
        .unwrap_or(1),
    }
}

/// The combine order of a group: balanced pairs, `((r0 r1) (r2 r3))`.
fn tree(ranks: &[u32]) -> String {
    match ranks {
        [one] => format!("r{one}"),
        _ => {
            let (a, b) = ranks.split_at(ranks.len().div_ceil(2));
            format!("({} {})", tree(a), tree(b))
        }
    }
}

/// The plan's `[model]` section for `model`, read from `source` (the executor checks a plan's
/// section against the model file it loads with this).
pub fn model_summary(model: &ModelMeta, source: &str) -> ModelSummary {
    ModelSummary {
        name: model.name.clone(),
        architecture: model.architecture.name().to_string(),
        source: source.to_string(),
        fingerprint: format!("{:016x}", model.fingerprint),
        layers: model.layers,
        embedding: model.embedding,
        heads: model.heads,
        kv_heads: model.kv_heads,
        head_dim: model.head_dim,
        ffn: model.ffn,
        vocab: model.vocab,
        context_length: model.context_length,
        rope_theta: exact(model.rope_theta),
        rms_eps: exact(model.rms_eps),
        tied_embeddings: model.tied_embeddings,
        qk_norm: model.qk_norm,
        qkv_bias: model.qkv_bias,
        reduction_chunks: model_chunks(model),
        moe: model.moe.clone(),
        mla: model.mla.clone(),
        rope_yarn: model.rope_yarn.clone(),
        rope_llama3: model.rope_llama3.clone(),
        kda: model.kda.clone(),
        dsa: model.dsa.clone(),
        mhc: model.mhc.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_are_balanced() {
        assert_eq!(tree(&[0, 1]), "(r0 r1)");
        assert_eq!(tree(&[4, 5, 6, 7]), "((r4 r5) (r6 r7))");
        assert_eq!(tree(&[0, 1, 2]), "((r0 r1) r2)");
    }
}
