//! Hugging Face `config.json` reader: hyperparameters of a model whose weights the compiler
//! never sees, with tensors synthesized in the placement's chosen dtype.

use super::tensors::synthesize;
use super::{
    exact, fnv1a, no_full_before, shared_indexers, Architecture, Dtype, FloatRule, IntRule,
    ModelMeta, CONTEXT, CONV_KERNEL, EPSILON, EXPERTS, FFN, HEADS, HEAD_DIM, LAYERS, ROPE_THETA,
    VOCAB, WIDTH,
};
use crate::plan::{
    ClampSummary, DsaSummary, Gating, KdaSummary, Llama3RopeSummary, MhcSummary, MlaSummary,
    MoeSummary, YarnSummary,
};
use anyhow::{anyhow, Context, Result};
use memra_gguf::output::escaped;
use serde_json::{Map, Value};
use std::path::Path;

/// HF `model_type` spellings and the architecture each maps to.
const MODEL_TYPES: [(&str, Architecture); 9] = [
    ("llama", Architecture::Llama),
    ("qwen2", Architecture::Qwen2),
    ("qwen3", Architecture::Qwen3),
    ("qwen3_moe", Architecture::Qwen3Moe),
    ("mixtral", Architecture::Mixtral),
    ("deepseek_v2", Architecture::Deepseek2),
    ("deepseek_v3", Architecture::Deepseek2),
    ("kimi_linear", Architecture::KimiLinear),
    ("glm5_next", Architecture::Glm5Next),
];

/// Read a config.json; weights are assumed to be stored in `dtype`.
pub fn read_config(path: &Path, dtype: Dtype) -> Result<ModelMeta> {
    let text = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let json: Value = serde_json::from_slice(&text).map_err(|e| {
        let what = e.to_string();
        let what = what
            .split(" at line ")
            .next()
            .unwrap_or_default()
            .to_lowercase();
        anyhow!(
            "{}:{}:{}: invalid json: {what}",
            path.display(),
            e.line(),
            e.column()
        )
    })?;
    let obj = json
        .as_object()
        .ok_or_else(|| anyhow!("{}: expected a json object at the top", path.display()))?;
    let top = Keys {
        obj,
        path,
        prefix: String::new(),
    };
    let model_type = top.str("model_type")?;
    let architecture = MODEL_TYPES
        .iter()
        .find(|(name, _)| *name == model_type)
        .map(|(_, arch)| *arch)
        .ok_or_else(|| {
            let names: Vec<&str> = MODEL_TYPES.iter().map(|(n, _)| *n).collect();
            anyhow!(
                "{}: model_type `{}` is not supported; supported: {}",
                path.display(),
                escaped(model_type),
                names.join(", ")
            )
        })?;
    // GLM-5.3-Flash's multimodal config keeps the language model's keys in `text_config`
    let language = match architecture {
        Architecture::Glm5Next => top.opt_object("text_config")?,
        _ => None,
    };
    let keys = match language {
        Some(text) => text,
        None => Keys {
            obj,
            path,
            prefix: String::new(),
        },
    };
    let embedding = keys.u32_in("hidden_size", &WIDTH)?;
    let heads = keys.u32_in("num_attention_heads", &HEADS)?;
    let kv_heads = keys.opt_u32("num_key_value_heads")?.unwrap_or(heads);
    let mla = match architecture {
        Architecture::Deepseek2 => Some(read_mla(&keys, true)?),
        // kimi-linear's MLA layers use no rope, whatever qk_rope_head_dim says
        Architecture::KimiLinear => Some(read_mla(&keys, false)?),
        Architecture::Glm5Next => Some(read_glm5_mla(&keys)?),
        _ => None,
    };
    let layers = keys.u32_in("num_hidden_layers", &LAYERS)?;
    let kda = match architecture {
        Architecture::KimiLinear => Some(read_kda(&keys, layers, heads)?),
        Architecture::Glm5Next => Some(read_glm5_kda(&keys, layers, heads)?),
        _ => None,
    };
    let (dsa, mhc) = match architecture {
        Architecture::Glm5Next => (
            Some(read_dsa(
                &keys,
                layers,
                kda.as_ref().expect("invariant: glm5-next has KDA facts"),
            )?),
            Some(read_mhc(&keys)?),
        ),
        _ => (None, None),
    };
    let head_dim = match &mla {
        Some(mla) => mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        None => {
            // absent: hidden_size / num_attention_heads, bounded alike
            let head_dim = keys.opt_u32("head_dim")?.unwrap_or(embedding / heads);
            keys.check("head_dim", head_dim, &HEAD_DIM)?
        }
    };
    if mla.is_none() && kda.is_none() && (kv_heads == 0 || !heads.is_multiple_of(kv_heads)) {
        return Err(keys.wrong(
            "num_key_value_heads",
            &format!("a divisor of num_attention_heads ({heads}), got {kv_heads}"),
        ));
    }
    if mla.is_some() {
        // MLA's kv heads are its query heads; the key is read but no layer uses it
        keys.check(
            "num_key_value_heads",
            kv_heads,
            &IntRule { min: 0, ..HEADS },
        )?;
    }
    let moe = read_moe(&keys, architecture)?;
    // kimi-linear's and glm5-next's MLA layers use no rope
    let (rope_yarn, rope_llama3) = match kda {
        Some(_) => (None, None),
        None => read_rope_scaling(&keys)?,
    };
    let context_length = match (architecture, keys.opt_u32("max_position_embeddings")?) {
        (_, Some(n)) => keys.check("max_position_embeddings", n, &CONTEXT)?,
        (Architecture::KimiLinear, None) => keys.u32_in("model_max_length", &CONTEXT)?,
        (_, None) => keys.u32("max_position_embeddings")?,
    };
    check_unimplemented(&keys, architecture, mla.is_some(), context_length)?;
    let ffn = keys.u32_in("intermediate_size", &FFN)?;
    let vocab = keys.u32_in("vocab_size", &VOCAB)?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut meta = ModelMeta {
        name,
        architecture,
        layers,
        embedding,
        heads,
        // kimi-linear's MLA runs absorbed, as MQA over the latent
        kv_heads: if kda.is_some() { 1 } else { kv_heads },
        head_dim,
        ffn,
        vocab,
        context_length,
        rope_theta: keys
            .opt_f32_in("rope_theta", &ROPE_THETA)?
            .unwrap_or(10_000.0),
        rms_eps: keys
            .opt_f32_in("rms_norm_eps", &EPSILON)?
            .ok_or_else(|| keys.missing("rms_norm_eps"))?,
        tied_embeddings: keys.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Qwen3Moe),
        qkv_bias: architecture == Architecture::Qwen2,
        moe,
        mla,
        rope_yarn,
        rope_llama3,
        kda,
        dsa,
        mhc,
        tensors: Vec::new(),
        fingerprint: fnv1a(&text, 0),
    };
    meta.tensors = synthesize(&meta, dtype);
    Ok(meta)
}

/// The experts and their routing in Hugging Face's spelling: Mixtral and Qwen3-MoE normalize
/// softmax weights; DeepSeek reads `scoring_func`, `topk_method` (`noaux_tc` adds the
/// selection bias), `norm_topk_prob`, `routed_scaling_factor`, `n_group` and `topk_group`.
fn read_moe(keys: &Keys, architecture: Architecture) -> Result<Option<MoeSummary>> {
    let plain = |experts, top_k, expert_ffn| MoeSummary {
        experts,
        top_k,
        expert_ffn,
        shared_expert_ffn: 0,
        dense_layers: 0,
        gating: Gating::Softmax,
        probs_bias: false,
        groups: 1,
        groups_used: 1,
        norm_weights: true,
        weights_scale: 1.0,
        clamp: None,
    };
    let moe = match architecture {
        Architecture::Mixtral => plain(
            keys.u32_in("num_local_experts", &EXPERTS)?,
            keys.u32("num_experts_per_tok")?,
            keys.u32_in("intermediate_size", &FFN)?,
        ),
        Architecture::Qwen3Moe => MoeSummary {
            norm_weights: keys.opt_bool("norm_topk_prob")?.unwrap_or(true),
            ..plain(
                keys.u32_in("num_experts", &EXPERTS)?,
                keys.u32("num_experts_per_tok")?,
                keys.u32_in("moe_intermediate_size", &FFN)?,
            )
        },
        Architecture::Deepseek2 => {
            let expert_ffn = keys.u32_in("moe_intermediate_size", &FFN)?;
            let gating = match keys.opt_str("scoring_func")? {
                None | Some("softmax") => Gating::Softmax,
                Some("sigmoid") => Gating::Sigmoid,
                Some(_) => return Err(keys.wrong("scoring_func", "\"softmax\" or \"sigmoid\"")),
            };
            let groups = keys.opt_u32("n_group")?.unwrap_or(1).max(1);
            MoeSummary {
                shared_expert_ffn: shared_ffn(keys, "n_shared_experts", expert_ffn)?,
                dense_layers: keys.opt_u32("first_k_dense_replace")?.unwrap_or(0),
                gating,
                probs_bias: keys.opt_str("topk_method")? == Some("noaux_tc"),
                groups,
                groups_used: match groups {
                    1 => 1,
                    _ => keys.u32("topk_group")?,
                },
                norm_weights: keys.opt_bool("norm_topk_prob")?.unwrap_or(false),
                weights_scale: exact(keys.opt_f32("routed_scaling_factor")?.unwrap_or(1.0)),
                ..plain(
                    keys.u32_in("n_routed_experts", &EXPERTS)?,
                    keys.u32("num_experts_per_tok")?,
                    expert_ffn,
                )
            }
        }
        // Kimi: sigmoid or softmax routing with the selection bias, always renormalized
        Architecture::KimiLinear => {
            let expert_ffn = keys.u32_in("moe_intermediate_size", &FFN)?;
            let gating = match keys.opt_str("moe_router_activation_func")? {
                None | Some("sigmoid") => Gating::Sigmoid,
                Some("softmax") => Gating::Softmax,
                Some(_) => {
                    return Err(
                        keys.wrong("moe_router_activation_func", "\"sigmoid\" or \"softmax\"")
                    )
                }
            };
            let top_k = match keys.opt_u32("num_experts_per_token")? {
                Some(k) => k,
                None => keys.u32("num_experts_per_tok")?,
            };
            MoeSummary {
                shared_expert_ffn: shared_ffn(keys, "num_shared_experts", expert_ffn)?,
                dense_layers: keys.opt_u32("first_k_dense_replace")?.unwrap_or(0),
                gating,
                probs_bias: true,
                weights_scale: exact(keys.opt_f32("routed_scaling_factor")?.unwrap_or(1.0)),
                ..plain(keys.u32_in("num_experts", &EXPERTS)?, top_k, expert_ffn)
            }
        }
        // GLM5-Next: DeepSeek's names, sigmoid routing with the selection bias, clamped SwiGLU
        Architecture::Glm5Next => {
            let expert_ffn = keys.u32_in("moe_intermediate_size", &FFN)?;
            let limit = keys.opt_f32("swiglu_limit")?.map(exact);
            MoeSummary {
                shared_expert_ffn: shared_ffn(keys, "n_shared_experts", expert_ffn)?,
                dense_layers: keys.opt_u32("first_k_dense_replace")?.unwrap_or(0),
                gating: Gating::Sigmoid,
                probs_bias: true,
                norm_weights: keys.opt_bool("norm_topk_prob")?.unwrap_or(false),
                weights_scale: exact(keys.opt_f32("routed_scaling_factor")?.unwrap_or(1.0)),
                clamp: limit.map(|l| ClampSummary {
                    experts: l,
                    shared: l,
                }),
                ..plain(
                    keys.u32_in("n_routed_experts", &EXPERTS)?,
                    keys.u32("num_experts_per_tok")?,
                    expert_ffn,
                )
            }
        }
        _ => return Ok(None),
    };
    // as from a GGUF: a top-k past the experts compiled a plan no router can run
    if moe.top_k == 0 || moe.top_k > moe.experts {
        let key = match keys.obj.contains_key("num_experts_per_token") {
            true => "num_experts_per_token",
            false => "num_experts_per_tok",
        };
        return Err(keys.wrong(
            key,
            &format!("1 to the expert count ({}), got {}", moe.experts, moe.top_k),
        ));
    }
    Ok(Some(moe))
}

/// The width of the shared experts together (`count_key` of them, each `expert_ffn` wide),
/// bounded as one FFN.
fn shared_ffn(keys: &Keys, count_key: &str, expert_ffn: u32) -> Result<u32> {
    let count = keys.opt_u32(count_key)?.unwrap_or(0);
    match count.checked_mul(expert_ffn) {
        Some(w) if w <= FFN.max => Ok(w),
        _ => Err(keys.wrong(
            count_key,
            &format!(
                "a count whose width together (times moe_intermediate_size {expert_ffn}) is 0 to {} ({}), got {count}",
                FFN.max, FFN.why
            ),
        )),
    }
}

/// DeepSeek's and Kimi's MLA (`rope`: whether its layers rotate `qk_rope_head_dim` dims).
fn read_mla(keys: &Keys, rope: bool) -> Result<MlaSummary> {
    Ok(MlaSummary {
        q_lora_rank: keys
            .opt_u32_in("q_lora_rank", &IntRule { min: 0, ..WIDTH })?
            .unwrap_or(0),
        kv_lora_rank: keys.u32_in("kv_lora_rank", &WIDTH)?,
        qk_nope_head_dim: keys.u32_in("qk_nope_head_dim", &HEAD_DIM)?,
        qk_rope_head_dim: keys.u32_in("qk_rope_head_dim", &IntRule { min: 0, ..HEAD_DIM })?,
        v_head_dim: keys.u32_in("v_head_dim", &HEAD_DIM)?,
        rope,
    })
}

/// GLM5-Next's MLA: q-LoRA, no rope (`mla_use_nope`, `qk_rope_head_dim` 0).
fn read_glm5_mla(keys: &Keys) -> Result<MlaSummary> {
    if keys.opt_u32("qk_rope_head_dim")? != Some(0) {
        return Err(keys.wrong("qk_rope_head_dim", "0 (glm5-next's MLA is nope-only)"));
    }
    Ok(MlaSummary {
        q_lora_rank: keys.u32_in("q_lora_rank", &IntRule { min: 0, ..WIDTH })?,
        kv_lora_rank: keys.u32_in("kv_lora_rank", &WIDTH)?,
        qk_nope_head_dim: keys.u32_in("qk_nope_head_dim", &HEAD_DIM)?,
        qk_rope_head_dim: 0,
        v_head_dim: keys.u32_in("v_head_dim", &HEAD_DIM)?,
        rope: false,
    })
}

/// GLM5-Next's KDA facts: `layer_types` marks the `linear_attention` layers; the others are
/// attention layers. `linear_attn_config` gives the head width, the taps and the optional
/// decay bound; q and k are L2-normed with FLA's epsilon (1e-6), as llama.cpp's graph does.
fn read_glm5_kda(keys: &Keys, layers: u32, heads: u32) -> Result<KdaSummary> {
    let allowed = format!("an array of {layers} layer types (\"linear_attention\" or another)");
    let types = keys
        .opt("layer_types", &allowed, Value::as_array)?
        .ok_or_else(|| keys.missing("layer_types"))?;
    if types.len() != layers as usize {
        return Err(keys.wrong("layer_types", &allowed));
    }
    let mut attention_layers = Vec::new();
    for (l, t) in types.iter().enumerate() {
        match t.as_str() {
            Some("linear_attention") => {}
            Some(_) => attention_layers.push(l as u32),
            None => return Err(keys.wrong("layer_types", &allowed)),
        }
    }
    let lin = linear_attn_config(keys, heads, "glm5-next")?;
    Ok(KdaSummary {
        gate_lower_bound: lin
            .opt("gate_lower_bound", "a number", |v| {
                v.as_f64().filter(|x| x.is_finite())
            })?
            .map(|b| exact(b as f32)),
        l2_eps: Some(exact(1e-6)),
        ..kda_summary(&lin, attention_layers)?
    })
}

/// GLM5-Next's DSA indexer (`index_*`). `indexer_types` (absent: every layer "full") has one
/// entry per layer, "full" or "shared" (the converter writes `t == "full"` into the GGUF's
/// `attention.indexer.types`); as from a GGUF, only the MLA layers' entries are read.
fn read_dsa(keys: &Keys, layers: u32, kda: &KdaSummary) -> Result<DsaSummary> {
    // the selection is at most the context's cells
    let (kpool, top_k) = (
        keys.u32("index_kpool")?,
        keys.u32_in("index_topk", &CONTEXT)?,
    );
    if kpool < 2 || top_k < kpool || !top_k.is_multiple_of(kpool) {
        return Err(keys.wrong(
            "index_kpool",
            &format!("at least 2 and a divisor of index_topk ({top_k})"),
        ));
    }
    let allowed =
        format!("an array of {layers} entries (one per layer), each \"full\" or \"shared\"");
    let full: Vec<bool> = match keys.opt("indexer_types", &allowed, Value::as_array)? {
        None => vec![true; layers as usize],
        Some(types) => {
            let flags: Option<Vec<bool>> = types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full") => Some(true),
                    Some("shared") => Some(false),
                    _ => None,
                })
                .collect();
            match flags {
                Some(f) if f.len() == layers as usize => f,
                _ => return Err(keys.wrong("indexer_types", &allowed)),
            }
        }
    };
    let shared_layers = shared_indexers(&kda.attention_layers, &full).map_err(|l| {
        anyhow!(
            "{}: key `{}indexer_types`: entry {l} is \"shared\", {}",
            keys.path.display(),
            keys.prefix,
            no_full_before(l, ("\"shared\"", "\"full\""))
        )
    })?;
    Ok(DsaSummary {
        heads: keys.u32_in("index_n_heads", &HEADS)?,
        head_dim: keys.u32_in("index_head_dim", &HEAD_DIM)?,
        top_k,
        kpool,
        select_tail: keys
            .opt_bool("index_kpool_always_select_tail")?
            .unwrap_or(true),
        // the converter writes this layer-norm epsilon for every glm5-next file
        norm_eps: exact(1e-6),
        shared_layers,
    })
}

/// GLM5-Next's mHC (`hc_mult` must be 4, as llama.cpp requires).
fn read_mhc(keys: &Keys) -> Result<MhcSummary> {
    let streams = keys.u32("hc_mult")?;
    if streams != 4 {
        return Err(keys.wrong("hc_mult", "4"));
    }
    Ok(MhcSummary {
        streams,
        sinkhorn_iters: keys.u32("hc_sinkhorn_iters")?,
        eps: exact(
            keys.opt_f32_in("hc_eps", &EPSILON)?
                .ok_or_else(|| keys.missing("hc_eps"))?,
        ),
    })
}

/// Kimi's `linear_attn_config`: the KDA head size and convolution taps, and the full-attention
/// (MLA) layers, which the config numbers from 1.
fn read_kda(keys: &Keys, layers: u32, heads: u32) -> Result<KdaSummary> {
    let lin = linear_attn_config(keys, heads, "kimi-linear")?;
    let list = lin
        .obj
        .get("full_attn_layers")
        .ok_or_else(|| lin.missing("full_attn_layers"))?;
    let allowed = format!("an array of layer numbers in 1..={layers}");
    let mut attention_layers = Vec::new();
    for v in list
        .as_array()
        .ok_or_else(|| lin.wrong("full_attn_layers", &allowed))?
    {
        match v.as_u64() {
            Some(n) if (1..=u64::from(layers)).contains(&n) => attention_layers.push(n as u32 - 1),
            _ => return Err(lin.wrong("full_attn_layers", &allowed)),
        }
    }
    attention_layers.sort_unstable();
    attention_layers.dedup();
    kda_summary(&lin, attention_layers)
}

/// The `linear_attn_config` object, whose `num_heads` (if given) must be the model's head
/// count: llama.cpp gives KDA layers the model's heads when it reads `arch`.
fn linear_attn_config<'a>(keys: &'a Keys, heads: u32, arch: &str) -> Result<Keys<'a>> {
    let lin = keys
        .opt_object("linear_attn_config")?
        .ok_or_else(|| keys.missing("linear_attn_config"))?;
    if lin.opt_u32("num_heads")?.is_some_and(|n| n != heads) {
        return Err(lin.wrong(
            "num_heads",
            &format!("num_attention_heads ({heads}), as llama.cpp reads {arch}"),
        ));
    }
    Ok(lin)
}

/// The KDA facts both `linear_attn_config` readers share (kimi-linear's whole summary):
/// `head_dim` and `short_conv_kernel_size`, with the layers that are attention instead.
fn kda_summary(lin: &Keys, attention_layers: Vec<u32>) -> Result<KdaSummary> {
    let conv_kernel = lin.u32_in("short_conv_kernel_size", &CONV_KERNEL)?;
    Ok(KdaSummary {
        head_dim: lin.u32_in("head_dim", &HEAD_DIM)?,
        conv_kernel,
        attention_layers,
        gate_lower_bound: None,
        l2_eps: None,
    })
}

/// Rope scaling from `rope_scaling` (its `type` or `rope_type`): `yarn`, which the executors
/// run; `llama3` (Llama 3.1), which they refuse, so its plans are planned but never run with
/// plain rope; `default` or none. Any other type is refused.
fn read_rope_scaling(keys: &Keys) -> Result<(Option<YarnSummary>, Option<Llama3RopeSummary>)> {
    let Some(scaling) = keys.opt_object("rope_scaling")? else {
        return Ok((None, None));
    };
    let (key, kind) = match scaling.opt_str("type")? {
        Some(kind) => ("type", Some(kind)),
        None => ("rope_type", scaling.opt_str("rope_type")?),
    };
    match kind {
        None | Some("default") => Ok((None, None)),
        Some("yarn") => Ok((
            Some(YarnSummary {
                factor: exact(scaling.f32("factor")?),
                original_context: scaling.u32("original_max_position_embeddings")?,
                mscale_all_dim: exact(scaling.opt_f32("mscale_all_dim")?.unwrap_or(0.0)),
            }),
            None,
        )),
        Some("llama3") => Ok((
            None,
            Some(Llama3RopeSummary {
                factor: exact(scaling.f32("factor")?),
                low_freq_factor: exact(scaling.f32("low_freq_factor")?),
                high_freq_factor: exact(scaling.f32("high_freq_factor")?),
                original_context: scaling.u32("original_max_position_embeddings")?,
            }),
        )),
        Some(_) => Err(scaling.wrong(
            key,
            "\"yarn\", \"llama3\" or \"default\" (memra implements no other rope scaling)",
        )),
    }
}

/// Keys of features the architectures' graphs do not implement, refused rather than
/// silently run without: another activation than SiLU, biases on the projections, partial
/// rope, and a sliding window that slides inside the context.
fn check_unimplemented(
    keys: &Keys,
    architecture: Architecture,
    mla: bool,
    context_length: u32,
) -> Result<()> {
    if keys.opt_str("hidden_act")?.is_some_and(|act| act != "silu") {
        return Err(keys.wrong("hidden_act", "\"silu\" (memra's FFNs are SwiGLU)"));
    }
    for (key, what) in [
        ("attention_bias", "attention projections"),
        ("mlp_bias", "FFN projections"),
    ] {
        if keys.opt_bool(key)? == Some(true) {
            let allowed = format!("false (memra's {what} have no bias)");
            return Err(keys.wrong(key, &allowed));
        }
    }
    // MLA's rope dims are its own keys (qk_rope_head_dim)
    let factor = "partial_rotary_factor";
    if !mla
        && keys
            .opt(factor, "a number", Value::as_f64)?
            .is_some_and(|f| f != 1.0)
    {
        return Err(keys.wrong(
            factor,
            "1 (memra's rope rotates every dimension of a head; partial rope is not implemented)",
        ));
    }
    // Qwen's configs switch the window with `use_sliding_window`; Mixtral's with a number
    let window = keys.opt_u32("sliding_window")?;
    let slides = match keys.opt_bool("use_sliding_window")? {
        Some(enabled) => enabled,
        None => architecture == Architecture::Mixtral && window.is_some(),
    };
    if slides && window.is_none_or(|w| w < context_length) {
        return Err(match keys.opt_bool("use_sliding_window")? {
            Some(true) => keys.wrong(
                "use_sliding_window",
                "false (sliding-window attention is not implemented)",
            ),
            _ => keys.wrong(
                "sliding_window",
                &format!("null or at least the context length {context_length} (sliding-window attention is not implemented)"),
            ),
        });
    }
    Ok(())
}

/// Typed access to the keys of a config.json, with errors that name the file and key.
struct Keys<'a> {
    obj: &'a Map<String, Value>,
    path: &'a Path,
    /// `outer.` for the keys of a nested object.
    prefix: String,
}

impl Keys<'_> {
    fn missing(&self, key: &str) -> anyhow::Error {
        anyhow!(
            "{}: missing key `{}{key}`",
            self.path.display(),
            self.prefix
        )
    }

    fn wrong(&self, key: &str, allowed: &str) -> anyhow::Error {
        anyhow!(
            "{}: key `{}{key}` must be {allowed}",
            self.path.display(),
            self.prefix
        )
    }

    fn str(&self, key: &str) -> Result<&str> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    /// `key`'s value as `read` takes it; `None` when absent or null, an error naming
    /// `expected` when `read` refuses it.
    fn opt<'s, T>(
        &'s self,
        key: &str,
        expected: &str,
        read: impl FnOnce(&'s Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => read(v).map(Some).ok_or_else(|| self.wrong(key, expected)),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.opt(key, "a string", Value::as_str)
    }

    fn opt_object(&self, key: &str) -> Result<Option<Keys<'_>>> {
        self.opt(key, "an object", |v| {
            v.as_object().map(|obj| Keys {
                obj,
                path: self.path,
                prefix: format!("{}{key}.", self.prefix),
            })
        })
    }

    fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.opt(key, "an integer in 0..=4294967295", |v| {
            v.as_u64().and_then(|n| u32::try_from(n).ok())
        })
    }

    fn u32(&self, key: &str) -> Result<u32> {
        self.opt_u32(key)?.ok_or_else(|| self.missing(key))
    }

    /// `value` of `key` if `rule` allows it, else an error naming the key.
    fn check(&self, key: &str, value: u32, rule: &IntRule) -> Result<u32> {
        match rule.ok(value) {
            true => Ok(value),
            false => Err(self.wrong(key, &format!("{}, got {value}", rule.allowed()))),
        }
    }

    /// An integer `rule` allows; `None` when absent.
    fn opt_u32_in(&self, key: &str, rule: &IntRule) -> Result<Option<u32>> {
        self.opt_u32(key)?
            .map(|v| self.check(key, v, rule))
            .transpose()
    }

    fn u32_in(&self, key: &str, rule: &IntRule) -> Result<u32> {
        self.check(key, self.u32(key)?, rule)
    }

    fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.opt(key, "a positive number", |v| {
            v.as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(|x| x as f32)
        })
    }

    fn f32(&self, key: &str) -> Result<f32> {
        self.opt_f32(key)?.ok_or_else(|| self.missing(key))
    }

    /// A number `rule` allows, as the f32 the model computes with; `None` when absent.
    fn opt_f32_in(&self, key: &str, rule: &FloatRule) -> Result<Option<f32>> {
        self.opt(key, rule.allowed, |v| {
            v.as_f64().map(|x| x as f32).filter(|&x| (rule.ok)(x))
        })
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt(key, "true or false", Value::as_bool)
    }
}
