//! The model a plan describes, read from the plan alone: its `[model]` facts and the tensors
//! its ranks' weight shards cut (whole shape and dtype). Synthetic weights are drawn from the
//! shards, so this is the model they run; the facts must give exactly those tensors, as a
//! GGUF's header must give its tensor infos.

use std::collections::BTreeMap;

use super::tensors::{expected, sort_tensors, tensor_meta};
use super::{Architecture, Dtype, ModelMeta, TensorMeta, TensorSite};
use crate::plan::Plan;
use memra_gguf::output::escaped;

/// The model of `plan`'s facts and weight shards; every disagreement between the two, or
/// between ranks holding one tensor, is one error naming the tensor. The facts that give the
/// tensors' shapes: embedding, heads, kv_heads, head_dim, ffn, vocab, tied_embeddings,
/// qk_norm, qkv_bias and the moe, mla, kda, dsa and mhc tables.
pub fn model_of_plan(plan: &Plan) -> Result<ModelMeta, Vec<String>> {
    let m = &plan.model;
    let mut errors = Vec::new();
    let architecture = Architecture::ALL
        .into_iter()
        .find(|a| a.name() == m.architecture);
    if architecture.is_none() {
        errors.push(format!(
            "model.architecture `{}` is not supported; supported: {}",
            escaped(&m.architecture),
            Architecture::supported_list()
        ));
    }
    let fingerprint = u64::from_str_radix(&m.fingerprint, 16).ok();
    if fingerprint.is_none() || m.fingerprint.len() != 16 {
        errors.push(format!(
            "model.fingerprint `{}` is not 16 hex digits",
            escaped(&m.fingerprint)
        ));
    }
    // Every tensor some rank holds, with the shape and dtype of the whole tensor.
    let mut held: BTreeMap<&str, (u32, &str, &[u64])> = BTreeMap::new();
    for r in &plan.ranks {
        for w in &r.weights {
            match held.get(w.tensor.as_str()) {
                Some(&(first, dtype, shape)) if (dtype, shape) != (&w.dtype, &w.shape[..]) => {
                    errors.push(format!(
                        "rank {} weights: `{}` is {} {:?}, but rank {first} holds it as {} {shape:?}; the ranks of one tensor agree on its shape and dtype",
                        r.rank, escaped(&w.tensor), escaped(&w.dtype), w.shape, escaped(dtype)
                    ));
                }
                Some(_) => {}
                None => {
                    held.insert(&w.tensor, (r.rank, &w.dtype, &w.shape));
                }
            }
        }
    }
    let mut tensors: Vec<TensorMeta> = Vec::new();
    for (&name, &(rank, dtype, shape)) in &held {
        let Some(dt) = Dtype::from_name(dtype) else {
            errors.push(format!(
                "rank {rank} weights: `{}` has dtype `{}`; supported: {}",
                escaped(name),
                escaped(dtype),
                Dtype::supported_list()
            ));
            continue;
        };
        match tensor_meta(name, dt, shape.to_vec()) {
            Some(t) => tensors.push(t),
            None => errors.push(format!(
                "rank {rank} weights: `{}` is not a tensor of any supported architecture",
                escaped(name)
            )),
        }
    }
    // The layers the shards hold, before expanding the facts' tensor list (a hand-edited
    // `layers` of billions would otherwise list billions of tensors).
    let held_layers = tensors
        .iter()
        .filter_map(|t| match t.site {
            TensorSite::Layer(l) => Some(l + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    if held_layers != m.layers {
        errors.push(format!(
            "model.layers is {}, but the ranks' weights hold layers 0..{held_layers}",
            m.layers
        ));
    }
    let (Some(architecture), Some(fingerprint), true) =
        (architecture, fingerprint, errors.is_empty())
    else {
        return Err(errors);
    };
    sort_tensors(&mut tensors);
    let meta = ModelMeta {
        name: m.name.clone(),
        architecture,
        layers: m.layers,
        embedding: m.embedding,
        heads: m.heads,
        kv_heads: m.kv_heads,
        head_dim: m.head_dim,
        ffn: m.ffn,
        vocab: m.vocab,
        context_length: m.context_length,
        rope_theta: m.rope_theta as f32,
        rms_eps: m.rms_eps as f32,
        tied_embeddings: m.tied_embeddings,
        qk_norm: m.qk_norm,
        qkv_bias: m.qkv_bias,
        moe: m.moe.clone(),
        mla: m.mla.clone(),
        rope_yarn: m.rope_yarn.clone(),
        rope_llama3: m.rope_llama3.clone(),
        kda: m.kda.clone(),
        dsa: m.dsa.clone(),
        mhc: m.mhc.clone(),
        tensors,
        fingerprint,
    };
    let want: BTreeMap<String, Vec<u64>> = expected(&meta).into_iter().collect();
    // one line per tensor of every layer (`blk.*.attn_q.weight`), not one per layer
    let mut differ: Vec<(String, usize)> = Vec::new();
    let mut note = |line: String| match differ.iter_mut().find(|(l, _)| *l == line) {
        Some((_, n)) => *n += 1,
        None => differ.push((line, 1)),
    };
    for t in &meta.tensors {
        let name = any_layer(&t.name);
        match want.get(&t.name) {
            None => note(format!(
                "weights: `{name}` is not part of a {} model with these [model] facts",
                architecture.name()
            )),
            Some(shape) if *shape != t.shape => note(format!(
                "weights: `{name}` has shape {:?}; the [model] facts give {shape:?}",
                t.shape
            )),
            Some(_) => {}
        }
    }
    let have: std::collections::BTreeSet<&str> =
        meta.tensors.iter().map(|t| t.name.as_str()).collect();
    for name in want.keys() {
        if !have.contains(name.as_str()) {
            note(format!(
                "weights: no rank holds `{}`, which the [model] facts give",
                any_layer(name)
            ));
        }
    }
    for (line, n) in differ {
        errors.push(match n {
            1 => line,
            _ => format!("{line} ({n} layers)"),
        });
    }
    match errors.is_empty() {
        true => Ok(meta),
        false => Err(errors),
    }
}

/// A layer tensor's name with its layer as `*` (`blk.*.attn_q.weight`).
fn any_layer(name: &str) -> String {
    match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        Some((_, rest)) => format!("blk.*.{rest}"),
        None => name.to_string(),
    }
}
