//! GGUF reader: hyperparameters from the header's metadata and tensors from its tensor infos.
//! Weight bytes are never read.

use super::tensors::{classify, expected, sort_tensors, tensor_meta};
use super::{Architecture, Dtype, ModelMeta};
use crate::plan::{MlaSummary, MoeSummary};
use anyhow::{anyhow, bail, Result};
use memra_gguf::GgufFile;
use std::collections::BTreeMap;
use std::path::Path;

/// Read a GGUF file's header into model metadata.
pub fn read_gguf(path: &Path) -> Result<ModelMeta> {
    let file = GgufFile::open(path)?;
    let arch_name = file.get_str("general.architecture")?;
    let architecture = Architecture::ALL
        .into_iter()
        .find(|a| a.name() == arch_name)
        .ok_or_else(|| {
            anyhow!(
                "{}: architecture `{arch_name}` is not supported; supported: {}",
                path.display(),
                Architecture::supported_list()
            )
        })?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let opt_u32 = |k: &str| -> Result<Option<u32>> {
        let full = key(k);
        match file.metadata.contains_key(&full) {
            true => file.get_u32(&full).map(Some),
            false => Ok(None),
        }
    };
    let req_u32 = |k: &str| file.get_u32(&key(k));
    let embedding = req_u32("embedding_length")?;
    let layers = req_u32("block_count")?;
    let ffn = req_u32("feed_forward_length")?;
    let context_length = req_u32("context_length")?;
    let rms_eps = file.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
    let heads = req_u32("attention.head_count")?;
    if heads == 0 {
        bail!(
            "{}: {} must be at least 1",
            path.display(),
            key("attention.head_count")
        );
    }
    let mla = match architecture {
        Architecture::Deepseek2 => {
            let rope = req_u32("rope.dimension_count")?;
            let key_len = req_u32("attention.key_length")?;
            Some(MlaSummary {
                q_lora_rank: opt_u32("attention.q_lora_rank")?.unwrap_or(0),
                kv_lora_rank: req_u32("attention.kv_lora_rank")?,
                qk_nope_head_dim: key_len.saturating_sub(rope),
                qk_rope_head_dim: rope,
                v_head_dim: req_u32("attention.value_length")?,
            })
        }
        _ => None,
    };
    let moe = match opt_u32("expert_count")? {
        Some(experts) if experts > 0 => Some(MoeSummary {
            experts,
            top_k: req_u32("expert_used_count")?,
            expert_ffn: opt_u32("expert_feed_forward_length")?.unwrap_or(ffn),
            shared_expert_ffn: opt_u32("expert_shared_count")?.unwrap_or(0)
                * opt_u32("expert_feed_forward_length")?.unwrap_or(0),
            dense_layers: opt_u32("leading_dense_block_count")?.unwrap_or(0),
        }),
        _ => None,
    };
    let has_output = file.tensor("output.weight").is_some();
    let vocab = match opt_u32("vocab_size")? {
        Some(v) => v,
        None => file
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| anyhow!("{}: missing tensor `token_embd.weight`", path.display()))?,
    };
    let rope_theta = match file.metadata.contains_key(&key("rope.freq_base")) {
        true => file.get_f32(&key("rope.freq_base"))?,
        false => 10_000.0,
    };
    let mut meta = ModelMeta {
        name: file
            .get_str("general.name")
            .map(str::to_string)
            .unwrap_or_else(|_| arch_name.to_string()),
        architecture,
        layers,
        embedding,
        heads,
        kv_heads: opt_u32("attention.head_count_kv")?.unwrap_or(heads),
        head_dim: match &mla {
            Some(m) => m.qk_nope_head_dim + m.qk_rope_head_dim,
            None => opt_u32("attention.key_length")?.unwrap_or(embedding / heads),
        },
        ffn,
        vocab,
        context_length,
        rope_theta,
        rms_eps,
        tied_embeddings: !has_output,
        qk_norm: file.tensor("blk.0.attn_q_norm.weight").is_some(),
        qkv_bias: file.tensor("blk.0.attn_q.bias").is_some(),
        moe,
        mla,
        tensors: Vec::new(),
        fingerprint: crate::model::fnv1a(file.header_bytes(), 0),
    };
    meta.tensors = read_tensors(&file, &meta, path)?;
    Ok(meta)
}

/// The file's tensors, checked against the architecture's expected names and shapes.
fn read_tensors(file: &GgufFile, meta: &ModelMeta, path: &Path) -> Result<Vec<super::TensorMeta>> {
    let expected: BTreeMap<String, Vec<u64>> = expected(meta).into_iter().collect();
    let mut tensors = Vec::new();
    for info in &file.tensors {
        if classify(&info.name).is_none() {
            // Tensors no op reads (rope frequency tables, say) are not loaded.
            continue;
        }
        let shape: Vec<u64> = info.dims.iter().rev().copied().collect();
        let want = expected.get(&info.name).ok_or_else(|| {
            anyhow!(
                "{}: tensor `{}` is not part of a {} model with these hyperparameters",
                path.display(),
                info.name,
                meta.architecture.name()
            )
        })?;
        if &shape != want {
            bail!(
                "{}: tensor `{}` has shape {shape:?}, expected {want:?}",
                path.display(),
                info.name
            );
        }
        let dtype = Dtype::from_name(info.dtype.name()).ok_or_else(|| {
            anyhow!(
                "{}: tensor `{}` has dtype {}, which is not supported; supported: {}",
                path.display(),
                info.name,
                info.dtype.name(),
                Dtype::supported_list()
            )
        })?;
        tensors.push(tensor_meta(&info.name, dtype, shape).expect("invariant: classified above"));
    }
    for name in expected.keys() {
        if !tensors.iter().any(|t| &t.name == name) {
            bail!("{}: missing tensor `{name}`", path.display());
        }
    }
    sort_tensors(&mut tensors);
    Ok(tensors)
}
