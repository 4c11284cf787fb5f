//! GGUF reader: hyperparameters from the header's metadata (with the keys and defaults
//! llama.cpp's loader uses for each architecture) and tensors from its tensor infos. Weight
//! bytes are never read.

use super::tensors::{classify, expected, sort_tensors, tensor_meta};
use super::{
    exact, no_full_before, shared_indexers, Architecture, Dtype, FloatRule, IntRule, Mixer,
    ModelMeta, TensorSite, CONTEXT, CONV_KERNEL, EPSILON, EXPERTS, FFN, HEADS, HEAD_DIM, LAYERS,
    ROPE_THETA, VOCAB, WIDTH,
};
use crate::plan::{
    ClampSummary, DsaSummary, Gating, KdaSummary, MhcSummary, MlaSummary, MoeSummary, YarnSummary,
};
use anyhow::{anyhow, bail, Result};
use memra_gguf::output::escaped;
use memra_gguf::{GgufFile, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Typed access to the architecture's keys of one GGUF header, with errors naming the key.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn has(&self, k: &str) -> bool {
        self.file.metadata.contains_key(&self.key(k))
    }
    fn opt_u32(&self, k: &str) -> Result<Option<u32>> {
        match self.has(k) {
            true => self.file.get_u32(&self.key(k)).map(Some),
            false => Ok(None),
        }
    }
    fn u32(&self, k: &str) -> Result<u32> {
        self.file.get_u32(&self.key(k))
    }
    /// `value` of the key `k` if `rule` allows it, else an error naming the key.
    fn check(&self, k: &str, value: u32, rule: &IntRule, path: &Path) -> Result<u32> {
        if !rule.ok(value) {
            bail!(
                "{}: {} is {value}; allowed: {}",
                path.display(),
                self.key(k),
                rule.allowed()
            );
        }
        Ok(value)
    }
    /// A u32 key `rule` allows.
    fn u32_in(&self, k: &str, rule: &IntRule, path: &Path) -> Result<u32> {
        self.check(k, self.u32(k)?, rule, path)
    }
    /// A u32 key `rule` allows; `None` when absent.
    fn opt_u32_in(&self, k: &str, rule: &IntRule, path: &Path) -> Result<Option<u32>> {
        self.opt_u32(k)?
            .map(|v| self.check(k, v, rule, path))
            .transpose()
    }
    fn opt_f32(&self, k: &str) -> Result<Option<f32>> {
        match self.has(k) {
            true => self.file.get_f32(&self.key(k)).map(Some),
            false => Ok(None),
        }
    }
    /// An f32 key `rule` allows, `default` when absent.
    fn f32_in(&self, k: &str, rule: &FloatRule, default: Option<f32>, path: &Path) -> Result<f32> {
        let value = match (self.opt_f32(k)?, default) {
            (Some(v), _) | (None, Some(v)) => v,
            (None, None) => self.file.get_f32(&self.key(k))?,
        };
        if !(rule.ok)(value) {
            bail!(
                "{}: {} is {value}; allowed: {}",
                path.display(),
                self.key(k),
                rule.allowed
            );
        }
        Ok(value)
    }
    fn opt_bool(&self, k: &str) -> Result<Option<bool>> {
        match self.has(k) {
            true => self.file.get_bool(&self.key(k)).map(Some),
            false => Ok(None),
        }
    }
    /// An f32 key that may also be an array with one value per block, all equal.
    fn opt_f32_uniform(&self, k: &str, path: &Path) -> Result<Option<f32>> {
        if !self.has(k) {
            return Ok(None);
        }
        let key = self.key(k);
        let Ok(values) = self.file.get_array(&key) else {
            return self.file.get_f32(&key).map(Some);
        };
        let values: Vec<Option<f64>> = values.iter().map(|v| v.as_float()).collect();
        match values.first() {
            Some(&Some(first)) if values.iter().all(|&v| v == Some(first)) => Ok(Some(first as f32)),
            _ => bail!(
                "{}: {key} must be one f32 or an array of one equal f32 per block; memra supports one limit for every layer",
                path.display()
            ),
        }
    }
}

/// Read a GGUF file's header into model metadata.
pub fn read_gguf(path: &Path) -> Result<ModelMeta> {
    gguf_meta(&GgufFile::open(path)?, path)
}

/// The model metadata of a GGUF file already open (`path` names it in errors).
pub fn gguf_meta(file: &GgufFile, path: &Path) -> Result<ModelMeta> {
    let arch_name = file.get_str("general.architecture")?;
    let architecture = Architecture::ALL
        .into_iter()
        .find(|a| a.name() == arch_name)
        .ok_or_else(|| {
            anyhow!(
                "{}: architecture `{}` is not supported; supported: {}",
                path.display(),
                escaped(arch_name),
                Architecture::supported_list()
            )
        })?;
    let keys = Keys {
        file,
        arch: arch_name,
    };
    let embedding = keys.u32_in("embedding_length", &WIDTH, path)?;
    let blocks = keys.u32_in("block_count", &LAYERS, path)?;
    // NextN (MTP) blocks follow the trunk; plain decoding never runs them
    let nextn = keys.opt_u32("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= blocks {
        bail!(
            "{}: {} ({nextn}) must be below {} ({blocks})",
            path.display(),
            keys.key("nextn_predict_layers"),
            keys.key("block_count")
        );
    }
    let layers = blocks - nextn;
    let ffn = keys.u32_in("feed_forward_length", &FFN, path)?;
    let context_length = keys.u32_in("context_length", &CONTEXT, path)?;
    let rms_eps = keys.f32_in("attention.layer_norm_rms_epsilon", &EPSILON, None, path)?;
    let heads = keys.u32_in("attention.head_count", &HEADS, path)?;
    let has_output = file.tensor("output.weight").is_some();
    let vocab = match keys.opt_u32_in("vocab_size", &VOCAB, path)? {
        Some(v) => v,
        None => vocab_of_embedding(file, path)?,
    };
    let glm5 = architecture == Architecture::Glm5Next;
    let kda = match architecture {
        Architecture::KimiLinear | Architecture::Glm5Next => {
            Some(read_kda(&keys, (layers, blocks), path)?)
        }
        _ => None,
    };
    let mla = match architecture {
        Architecture::Deepseek2 => Some(read_mla(&keys, lite(layers, vocab), path)?),
        Architecture::KimiLinear | Architecture::Glm5Next => Some(MlaSummary {
            rope: false,
            ..read_mla(&keys, false, path)?
        }),
        _ => None,
    };
    if let (true, Some(m)) = (glm5, &mla) {
        if m.qk_rope_head_dim != 0 {
            bail!(
                "{}: {} is {}; glm5-next's MLA is nope-only (0)",
                path.display(),
                keys.key("rope.dimension_count"),
                m.qk_rope_head_dim
            );
        }
    }
    let (dsa, mhc) = match glm5 {
        true => (
            Some(read_dsa(
                &keys,
                layers,
                kda.as_ref().expect("invariant: glm5-next has KDA facts"),
                path,
            )?),
            Some(read_mhc(&keys, path)?),
        ),
        false => (None, None),
    };
    let moe = read_moe(&keys, architecture, (layers, vocab, ffn), path)?;
    let head_dim = match &mla {
        Some(m) => m.qk_nope_head_dim + m.qk_rope_head_dim,
        None => {
            let head_dim = match keys.opt_u32_in("attention.key_length", &HEAD_DIM, path)? {
                Some(k) => k,
                None => match embedding / heads {
                    0 => bail!(
                        "{}: {} ({embedding}) is less than {} ({heads}), a head size of 0; allowed: at least one dimension per head (or {} of 1 to {})",
                        path.display(),
                        keys.key("embedding_length"),
                        keys.key("attention.head_count"),
                        keys.key("attention.key_length"),
                        HEAD_DIM.max
                    ),
                    d => d,
                },
            };
            // memra's GQA attention gives values the keys' head size
            if let Some(v) = keys.opt_u32("attention.value_length")? {
                if v != head_dim {
                    bail!(
                        "{}: {} is {v}; allowed: the key head size {head_dim} ({} or {} / {}), as memra's {} attention has one head size for keys and values",
                        path.display(),
                        keys.key("attention.value_length"),
                        keys.key("attention.key_length"),
                        keys.key("embedding_length"),
                        keys.key("attention.head_count"),
                        arch_name
                    );
                }
            }
            // llama.cpp rotates the first `rope.dimension_count` dims of a head; memra's GQA
            // rope rotates all of them
            match keys.opt_u32("rope.dimension_count")? {
                Some(rope) if rope != head_dim => bail!(
                    "{}: {} is {rope}; allowed: the head size {head_dim} ({} or {} / {}), as memra's rope rotates every dimension of a head (partial rope is not implemented)",
                    path.display(),
                    keys.key("rope.dimension_count"),
                    keys.key("attention.key_length"),
                    keys.key("embedding_length"),
                    keys.key("attention.head_count")
                ),
                _ => head_dim,
            }
        }
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
        kv_heads: match &kda {
            // the per-layer array marks KDA layers with 0; MLA's absorbed form has 1
            Some(_) => 1,
            None => kv_heads(&keys, heads, mla.is_some(), path)?,
        },
        head_dim,
        ffn,
        vocab,
        context_length,
        rope_theta: keys.f32_in("rope.freq_base", &ROPE_THETA, Some(10_000.0), path)?,
        rms_eps,
        tied_embeddings: !has_output,
        qk_norm: file.tensor("blk.0.attn_q_norm.weight").is_some(),
        qkv_bias: file.tensor("blk.0.attn_q.bias").is_some(),
        moe,
        mla,
        rope_yarn: match architecture {
            // kimi-linear's and glm5-next's MLA layers use no rope
            Architecture::KimiLinear | Architecture::Glm5Next => None,
            _ => read_yarn(&keys, architecture, context_length, path)?,
        },
        rope_llama3: None,
        kda,
        dsa,
        mhc,
        tensors: Vec::new(),
        fingerprint: crate::model::fnv1a(file.header_bytes(), 0),
    };
    meta.tensors = read_tensors(file, &meta, path)?;
    Ok(meta)
}

/// The vocabulary from `token_embd.weight`'s rows, for a file without `vocab_size`.
fn vocab_of_embedding(file: &GgufFile, path: &Path) -> Result<u32> {
    let dims = &file
        .tensor("token_embd.weight")
        .ok_or_else(|| anyhow!("{}: missing tensor `token_embd.weight`", path.display()))?
        .dims;
    let &[_, rows] = dims.as_slice() else {
        bail!(
            "{}: tensor `token_embd.weight` has dims {dims:?}; expected [embedding, vocab]",
            path.display()
        );
    };
    match u32::try_from(rows) {
        Ok(v) if VOCAB.ok(v) => Ok(v),
        _ => bail!(
            "{}: tensor `token_embd.weight` has {rows} rows (the vocabulary, as the file has no `{}.vocab_size`); allowed: {}",
            path.display(),
            file.get_str("general.architecture").unwrap_or_default(),
            VOCAB.allowed()
        ),
    }
}

/// The kv heads of a GQA model (`attention.head_count_kv`, the query heads when absent): a
/// divisor of the query heads, as each kv head serves a whole group; deepseek2's MLA reads
/// the key too (the converter writes its absorbed form's 1) but no layer uses it.
fn kv_heads(keys: &Keys, heads: u32, mla: bool, path: &Path) -> Result<u32> {
    let kv = keys.opt_u32("attention.head_count_kv")?.unwrap_or(heads);
    if !mla && (kv == 0 || !heads.is_multiple_of(kv)) {
        bail!(
            "{}: {} is {kv}; allowed: a divisor of {} ({heads})",
            path.display(),
            keys.key("attention.head_count_kv"),
            keys.key("attention.head_count")
        );
    }
    if mla {
        return keys.check(
            "attention.head_count_kv",
            kv,
            &IntRule { min: 0, ..HEADS },
            path,
        );
    }
    Ok(kv)
}

/// llama.cpp's "lite" deepseek2 models (DeepSeek-V2-Lite and kin), whose `q_lora_rank` it does
/// not read: 26 or 27 layers, or 48 with a vocabulary of 128256.
fn lite(layers: u32, vocab: u32) -> bool {
    matches!(layers, 26 | 27) || (layers == 48 && vocab == 128_256)
}

/// kimi-linear's and glm5-next's KDA facts. The converter marks each block's mixer in the
/// per-block `attention.head_count_kv` array (0: KDA, nonzero: MLA), as llama.cpp reads it;
/// `(layers, blocks)` are the trunk layers and all blocks (NextN blocks included).
fn read_kda(keys: &Keys, (layers, blocks): (u32, u32), path: &Path) -> Result<KdaSummary> {
    let key = keys.key("attention.head_count_kv");
    let per_layer = keys.file.get_array(&key).map_err(|_| {
        anyhow!(
            "{}: {key} must be an array of {layers} integers (0 for a KDA layer, the kv head count for an MLA layer)",
            path.display()
        )
    })?;
    if per_layer.len() != blocks as usize {
        bail!(
            "{}: {key} has {} entries; it must have one per block ({blocks})",
            path.display(),
            per_layer.len()
        );
    }
    let mut attention_layers = Vec::new();
    for (l, v) in per_layer.iter().enumerate().take(layers as usize) {
        match v.as_int() {
            Some(0) => {}
            Some(n) if n > 0 => attention_layers.push(l as u32),
            _ => bail!(
                "{}: {key}[{l}] must be a non-negative integer (0 for a KDA layer)",
                path.display()
            ),
        }
    }
    let head_dim = keys.u32_in("kda.head_dim", &HEAD_DIM, path)?;
    let conv_kernel = keys.u32_in("ssm.conv_kernel", &CONV_KERNEL, path)?;
    Ok(KdaSummary {
        head_dim,
        conv_kernel,
        attention_layers,
        gate_lower_bound: keys.opt_f32("kda.gate_lower_bound")?.map(exact),
        // glm5-next's graph L2-normalizes q and k with FLA's epsilon
        l2_eps: (keys.arch == "glm5-next").then(|| exact(1e-6)),
    })
}

/// glm5-next's DSA indexer facts. `attention.indexer.types` (absent: every layer full; one
/// bool: every layer alike; else one per trunk layer, as llama.cpp reads it) marks the MLA
/// layers without an indexer of their own (false): each reuses the selection of the closest
/// full MLA layer before it. KDA layers' entries are not read, as llama.cpp does not read them.
fn read_dsa(keys: &Keys, layers: u32, kda: &KdaSummary, path: &Path) -> Result<DsaSummary> {
    let kpool = keys.u32("attention.indexer.kpool")?;
    // the selection is at most the context's cells
    let top_k = keys.u32_in("attention.indexer.top_k", &CONTEXT, path)?;
    if kpool < 2 || top_k < kpool || !top_k.is_multiple_of(kpool) {
        bail!(
            "{}: {} ({kpool}) must be at least 2 and divide {} ({top_k})",
            path.display(),
            keys.key("attention.indexer.kpool"),
            keys.key("attention.indexer.top_k")
        );
    }
    let types = keys.key("attention.indexer.types");
    let flag = |l: usize, v: &Value| {
        match v {
        Value::Bool(b) => Ok(*b),
        v => match v.as_int() {
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            _ => bail!(
                "{}: {types}[{l}] is not a bool; allowed: true (a full indexer) or false (the selection of the closest full layer before)",
                path.display()
            ),
        },
    }
    };
    let full: Vec<bool> = match keys.file.metadata.get(&types) {
        None => vec![true; layers as usize],
        Some(Value::Array(a)) if a.len() == layers as usize => a
            .iter()
            .enumerate()
            .map(|(l, v)| flag(l, v))
            .collect::<Result<_>>()?,
        Some(Value::Array(a)) => bail!(
            "{}: {types} has {} entries; it must have one per trunk layer ({layers})",
            path.display(),
            a.len()
        ),
        Some(v) => vec![flag(0, v)?; layers as usize],
    };
    let shared_layers = shared_indexers(&kda.attention_layers, &full).map_err(|l| {
        anyhow!(
            "{}: {types}[{l}] is false, {}",
            path.display(),
            no_full_before(l, ("false", "true"))
        )
    })?;
    Ok(DsaSummary {
        heads: keys.u32_in("attention.indexer.head_count", &HEADS, path)?,
        head_dim: keys.u32_in("attention.indexer.key_length", &HEAD_DIM, path)?,
        top_k,
        kpool,
        select_tail: keys
            .opt_bool("attention.indexer.kpool_select_tail")?
            .unwrap_or(false),
        norm_eps: exact(keys.f32_in("attention.layer_norm_epsilon", &EPSILON, Some(1e-5), path)?),
        shared_layers,
    })
}

/// glm5-next's mHC facts; llama.cpp supports 4 streams only.
fn read_mhc(keys: &Keys, path: &Path) -> Result<MhcSummary> {
    let streams = keys.u32("hyper_connection.count")?;
    if streams != 4 {
        bail!(
            "{}: {} is {streams}; supported: 4",
            path.display(),
            keys.key("hyper_connection.count")
        );
    }
    Ok(MhcSummary {
        streams,
        sinkhorn_iters: keys.u32("hyper_connection.sinkhorn_iterations")?,
        eps: exact(keys.f32_in("hyper_connection.epsilon", &EPSILON, None, path)?),
    })
}

/// MLA's dimensions. Files of this llama.cpp version store the k/v up-projection split per
/// head (`attn_k_b`, `attn_v_b`, announced by the `*_length_mla` keys); the older unsplit
/// `attn_kv_b` is refused by name. A lite model has no q-LoRA whatever its key says.
fn read_mla(keys: &Keys, lite: bool, path: &Path) -> Result<MlaSummary> {
    let rope = keys.u32_in(
        "rope.dimension_count",
        &IntRule { min: 0, ..HEAD_DIM },
        path,
    )?;
    let Some(key_len) = keys.opt_u32_in("attention.key_length_mla", &HEAD_DIM, path)? else {
        let legacy = keys.file.tensor("blk.0.attn_kv_b.weight").is_some();
        bail!(
            "{}: {}; memra reads the per-head `attn_k_b`/`attn_v_b` form that llama.cpp's converter writes (with `{}`): convert the model again",
            path.display(),
            if legacy {
                "tensor `blk.0.attn_kv_b.weight` is the legacy unsplit k/v up-projection"
            } else {
                "the MLA head sizes are missing"
            },
            keys.key("attention.key_length_mla")
        );
    };
    if key_len <= rope {
        bail!(
            "{}: {} ({key_len}) must exceed {} ({rope})",
            path.display(),
            keys.key("attention.key_length_mla"),
            keys.key("rope.dimension_count")
        );
    }
    Ok(MlaSummary {
        q_lora_rank: match lite {
            true => 0,
            false => keys
                .opt_u32_in("attention.q_lora_rank", &IntRule { min: 0, ..WIDTH }, path)?
                .unwrap_or(0),
        },
        kv_lora_rank: keys.u32_in("attention.kv_lora_rank", &WIDTH, path)?,
        qk_nope_head_dim: key_len - rope,
        qk_rope_head_dim: rope,
        v_head_dim: keys.u32_in("attention.value_length_mla", &HEAD_DIM, path)?,
        rope: true,
    })
}

/// The experts and their routing, as llama.cpp's graph for the architecture uses them:
/// qwen3moe always normalizes softmax weights; deepseek2 reads gating, normalization and scale
/// from its keys (without a gating key: softmax as for DeepSeek-V2 files, sigmoid for GLM-4.7
/// Lite's 47 or 48 layers and 154880 tokens); kimi-linear reads gating and scale from its keys,
/// always normalizes and always has the selection bias. `dims` is (layers, vocab, ffn).
fn read_moe(
    keys: &Keys,
    arch: Architecture,
    dims: (u32, u32, u32),
    path: &Path,
) -> Result<Option<MoeSummary>> {
    let (layers, vocab, ffn) = dims;
    let experts = match keys.opt_u32("expert_count")? {
        Some(e) if e > 0 => keys.check("expert_count", e, &EXPERTS, path)?,
        _ => return Ok(None),
    };
    let top_k = keys.u32("expert_used_count")?;
    if top_k == 0 || top_k > experts {
        bail!(
            "{}: {} is {top_k}; allowed: 1 to {} ({experts})",
            path.display(),
            keys.key("expert_used_count"),
            keys.key("expert_count")
        );
    }
    let expert_ffn = match keys.opt_u32_in("expert_feed_forward_length", &FFN, path)? {
        Some(f) => f,
        None if ffn >= top_k => ffn / top_k,
        None => bail!(
            "{}: {} ({ffn}) / {} ({top_k}), the width of one expert as the file has no {}, is 0; allowed: {}",
            path.display(),
            keys.key("feed_forward_length"),
            keys.key("expert_used_count"),
            keys.key("expert_feed_forward_length"),
            FFN.allowed()
        ),
    };
    // the shared experts run as one FFN of their widths together
    let shared = keys.opt_u32("expert_shared_count")?.unwrap_or(0);
    let shared_expert_ffn = match shared.checked_mul(expert_ffn) {
        Some(w) if w <= FFN.max => w,
        _ => bail!(
            "{}: {} ({shared}) times the expert width {expert_ffn} is past {}; allowed: a shared width of 0 to {} ({})",
            path.display(),
            keys.key("expert_shared_count"),
            FFN.max,
            FFN.max,
            FFN.why
        ),
    };
    let dense_layers = keys.opt_u32("leading_dense_block_count")?.unwrap_or(0);
    let kimi = arch == Architecture::KimiLinear;
    let glm5 = arch == Architecture::Glm5Next;
    let deepseek = arch == Architecture::Deepseek2 || kimi || glm5;
    let glm_lite = !kimi && matches!(layers, 47 | 48) && vocab == 154_880;
    if kimi && !keys.has("expert_gating_func") {
        bail!(
            "{}: missing key `{}`; kimi-linear needs it (1: softmax, 2: sigmoid)",
            path.display(),
            keys.key("expert_gating_func")
        );
    }
    let gating = match (deepseek, keys.opt_u32("expert_gating_func")?) {
        (true, None | Some(0)) if glm_lite || glm5 => Gating::Sigmoid,
        (false, _) | (true, None | Some(0 | 1)) => Gating::Softmax,
        (true, Some(2)) => Gating::Sigmoid,
        (true, Some(other)) => bail!(
            "{}: {} is {other}; supported: 1 (softmax), 2 (sigmoid)",
            path.display(),
            keys.key("expert_gating_func")
        ),
    };
    let (groups, groups_used) = match keys.opt_u32("expert_group_count")? {
        Some(g) if g > 1 => {
            let used = keys.u32("expert_group_used_count")?;
            if !experts.is_multiple_of(g) || used == 0 || used >= g {
                bail!(
                    "{}: {} {g} must divide {} {experts}, and {} {used} must be in 1..{g}",
                    path.display(),
                    keys.key("expert_group_count"),
                    keys.key("expert_count"),
                    keys.key("expert_group_used_count")
                );
            }
            (g, used)
        }
        _ => (1, 1),
    };
    let scale = match deepseek {
        true => keys.opt_f32("expert_weights_scale")?.unwrap_or(0.0),
        false => 0.0,
    };
    let probs_bias = format!("blk.{dense_layers}.exp_probs_b.bias");
    let clamp = match glm5 {
        true => {
            let experts = keys.opt_f32_uniform("swiglu_clamp_exp", path)?;
            let shared = keys
                .opt_f32_uniform("swiglu_clamp_shexp", path)?
                .or(experts);
            // llama.cpp clamps only with a limit above 1e-6
            let limit = |l: Option<f32>| l.filter(|&l| l > 1e-6).map_or(0.0, exact);
            let (experts, shared) = (limit(experts), limit(shared));
            (experts > 0.0 || shared > 0.0).then_some(ClampSummary { experts, shared })
        }
        false => None,
    };
    Ok(Some(MoeSummary {
        experts,
        top_k,
        expert_ffn,
        shared_expert_ffn,
        dense_layers,
        gating,
        probs_bias: kimi || glm5 || (deepseek && keys.file.tensor(&probs_bias).is_some()),
        groups,
        groups_used,
        norm_weights: match deepseek && !kimi {
            true => keys.opt_bool("expert_weights_norm")?.unwrap_or(false),
            false => true,
        },
        // llama.cpp scales only by a factor other than 0 and 1
        weights_scale: if scale == 0.0 { 1.0 } else { exact(scale) },
        clamp,
    }))
}

/// YaRN rope scaling when `rope.scaling.type` is `yarn` (`none` or no key: none; any other
/// type is refused). deepseek2 stores `mscale_all_dim`
/// times 0.1 in `yarn_log_multiplier`; llama.cpp divides it back in f32, and so do we.
fn read_yarn(
    keys: &Keys,
    arch: Architecture,
    context: u32,
    path: &Path,
) -> Result<Option<YarnSummary>> {
    let kind = keys.key("rope.scaling.type");
    if !keys.file.metadata.contains_key(&kind) {
        return Ok(None);
    }
    match keys.file.get_str(&kind)? {
        "yarn" => {}
        "none" => return Ok(None),
        other => bail!(
            "{}: {kind} is `{}`; supported: yarn, none (memra implements no other rope scaling)",
            path.display(),
            escaped(other)
        ),
    }
    let factor = keys.opt_f32("rope.scaling.factor")?.unwrap_or(0.0);
    let log_mul = match arch {
        Architecture::Deepseek2 => keys
            .opt_f32("rope.scaling.yarn_log_multiplier")?
            .map_or(0.0, |m| m / 0.1),
        _ => 0.0,
    };
    Ok(Some(YarnSummary {
        factor: exact(if factor == 0.0 { 1.0 } else { factor }),
        original_context: keys
            .opt_u32("rope.scaling.original_context_length")?
            .unwrap_or(context),
        mscale_all_dim: exact(log_mul),
    }))
}

/// The file's tensors, checked against the architecture's expected names and shapes.
fn read_tensors(file: &GgufFile, meta: &ModelMeta, path: &Path) -> Result<Vec<super::TensorMeta>> {
    let expected: BTreeMap<String, Vec<u64>> = expected(meta).into_iter().collect();
    let mut tensors = Vec::new();
    for info in &file.tensors {
        // llama.cpp multiplies rope's frequencies by this table (Llama 3.1's rope scaling)
        if info.name == "rope_freqs.weight" {
            bail!(
                "{}: tensor `rope_freqs.weight` holds per-dimension rope frequency factors (Llama 3.1's rope scaling), which memra's rope does not implement",
                path.display()
            );
        }
        match classify(&info.name) {
            // Tensors no op reads are not loaded, nor are the
            // NextN blocks' (numbered after the trunk, as llama.cpp skips them for decoding).
            None => continue,
            Some((TensorSite::Layer(l), _))
                if l >= meta.layers && meta.architecture == Architecture::Glm5Next =>
            {
                continue
            }
            // a shared-indexer layer may carry indexer tensors (llama.cpp loads them as
            // optional); no op reads them
            Some((TensorSite::Layer(l), _))
                if meta.layer_kind(l).mixer == Mixer::DsaShared
                    && info.name.contains(".indexer") =>
            {
                continue
            }
            Some(_) => {}
        }
        let shape = crate::plan::logical_shape(&info.name, &info.dims);
        let want = expected.get(&info.name).ok_or_else(|| {
            anyhow!(
                "{}: tensor `{}` is not part of a {} model with these hyperparameters",
                path.display(),
                escaped(&info.name),
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
                escaped(&info.name),
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
