//! The tensor layout of each architecture, in llama.cpp's GGUF names: which tensors a layer
//! has, their shapes, and how tensor parallelism cuts them. GGUF tensor infos are checked
//! against it; config.json models are synthesized from it.

use super::{Dtype, FfnKind, Mixer, ModelMeta, ShardRule, TensorMeta, TensorSite};

/// The role of a tensor, decided by its name; gives its shard rule.
fn rule_for(suffix: &str) -> Option<ShardRule> {
    let rule = match suffix {
        "attn_norm" | "ffn_norm" | "attn_q_norm" | "attn_k_norm" | "attn_q_a_norm"
        | "attn_kv_a_norm" | "attn_q_a" | "attn_kv_a_mqa" | "ffn_gate_inp" | "exp_probs_b"
        | "ssm_f_a" | "ssm_g_a" | "ssm_norm" => ShardRule::Replicated,
        // mHC mixing and the DSA indexer: every rank computes them whole
        "hc_attn_fn"
        | "hc_attn_base"
        | "hc_attn_scale"
        | "hc_ffn_fn"
        | "hc_ffn_base"
        | "hc_ffn_scale"
        | "indexer.k_norm"
        | "indexer.proj"
        | "indexer.attn_k"
        | "indexer.attn_q_b"
        | "indexer_compressor_gate"
        | "indexer_compressor_ape" => ShardRule::Replicated,
        "attn_q" | "attn_k" | "attn_v" | "attn_q_b" | "ffn_gate" | "ffn_up" | "ffn_gate_shexp"
        | "ffn_up_shexp" => ShardRule::Rows,
        // KDA: every per-channel or per-head tensor is cut with its heads
        "ssm_conv1d_q" | "ssm_conv1d_k" | "ssm_conv1d_v" | "ssm_f_b" | "ssm_g_b" | "ssm_beta"
        | "ssm_a" | "ssm_dt" => ShardRule::Rows,
        "attn_output" | "ffn_down" | "ffn_down_shexp" => ShardRule::Cols,
        "ffn_gate_exps" | "ffn_up_exps" | "ffn_down_exps" => ShardRule::Experts,
        "attn_k_b" | "attn_v_b" => ShardRule::Heads,
        _ => return None,
    };
    Some(rule)
}

/// Site and shard rule of a GGUF tensor name; `None` for a name no architecture uses.
pub fn classify(name: &str) -> Option<(TensorSite, ShardRule)> {
    match name {
        "token_embd.weight" => return Some((TensorSite::Embed, ShardRule::Replicated)),
        "output_norm.weight" => return Some((TensorSite::Head, ShardRule::Replicated)),
        "output.weight" => return Some((TensorSite::Head, ShardRule::Rows)),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let suffix = rest
        .strip_suffix(".weight")
        .or_else(|| rest.strip_suffix(".bias"))
        .unwrap_or(rest);
    Some((TensorSite::Layer(layer), rule_for(suffix)?))
}

/// Shapes `[rows, cols]` (rows = outputs) of every tensor the architecture expects.
pub fn expected(meta: &ModelMeta) -> Vec<(String, Vec<u64>)> {
    let d = u64::from(meta.embedding);
    let vocab = u64::from(meta.vocab);
    let hd = u64::from(meta.head_dim);
    let (h, kv) = (u64::from(meta.heads), u64::from(meta.kv_heads));
    let mut out = vec![
        ("token_embd.weight".to_string(), vec![vocab, d]),
        ("output_norm.weight".to_string(), vec![d]),
    ];
    if !meta.tied_embeddings {
        out.push(("output.weight".to_string(), vec![vocab, d]));
    }
    for layer in 0..meta.layers {
        let mut t = |suffix: &str, shape: Vec<u64>| {
            out.push((format!("blk.{layer}.{suffix}"), shape));
        };
        t("attn_norm.weight", vec![d]);
        t("ffn_norm.weight", vec![d]);
        if let Some(m) = &meta.mhc {
            let streams = u64::from(m.streams);
            let mix = (2 + streams) * streams;
            for which in ["attn", "ffn"] {
                t(&format!("hc_{which}_fn.weight"), vec![mix, streams * d]);
                t(&format!("hc_{which}_base.weight"), vec![mix]);
                t(&format!("hc_{which}_scale.weight"), vec![3]);
            }
        }
        let kind = meta.layer_kind(layer);
        match (kind.mixer, &meta.mla) {
            (Mixer::Kda, _) => kda_tensors(meta, &mut t),
            (Mixer::Mla | Mixer::Dsa | Mixer::DsaShared, Some(mla)) => {
                let (ql, kvl) = (u64::from(mla.q_lora_rank), u64::from(mla.kv_lora_rank));
                let (nope, rope) = (
                    u64::from(mla.qk_nope_head_dim),
                    u64::from(mla.qk_rope_head_dim),
                );
                let v = u64::from(mla.v_head_dim);
                if ql > 0 {
                    t("attn_q_a.weight", vec![ql, d]);
                    t("attn_q_a_norm.weight", vec![ql]);
                    t("attn_q_b.weight", vec![h * (nope + rope), ql]);
                } else {
                    t("attn_q.weight", vec![h * (nope + rope), d]);
                }
                t("attn_kv_a_mqa.weight", vec![kvl + rope, d]);
                t("attn_kv_a_norm.weight", vec![kvl]);
                // per head: k_b maps a no-rope query into the latent, v_b the latent to a value
                t("attn_k_b.weight", vec![h, kvl, nope]);
                t("attn_v_b.weight", vec![h, v, kvl]);
                t("attn_output.weight", vec![d, h * v]);
                if let (Mixer::Dsa, Some(x)) = (kind.mixer, &meta.dsa) {
                    let (ih, id) = (u64::from(x.heads), u64::from(x.head_dim));
                    t("indexer.k_norm.weight", vec![id]);
                    t("indexer.k_norm.bias", vec![id]);
                    t("indexer.proj.weight", vec![ih, d]);
                    t("indexer.attn_k.weight", vec![id, d]);
                    t("indexer.attn_q_b.weight", vec![ih * id, ql]);
                    t("indexer_compressor_gate.weight", vec![id, d]);
                    t(
                        "indexer_compressor_ape.weight",
                        vec![u64::from(x.kpool), id],
                    );
                }
            }
            _ => {
                t("attn_q.weight", vec![h * hd, d]);
                t("attn_k.weight", vec![kv * hd, d]);
                t("attn_v.weight", vec![kv * hd, d]);
                t("attn_output.weight", vec![d, h * hd]);
                if meta.qkv_bias {
                    t("attn_q.bias", vec![h * hd]);
                    t("attn_k.bias", vec![kv * hd]);
                    t("attn_v.bias", vec![kv * hd]);
                }
                if meta.qk_norm {
                    t("attn_q_norm.weight", vec![hd]);
                    t("attn_k_norm.weight", vec![hd]);
                }
            }
        }
        match (kind.ffn, &meta.moe) {
            (FfnKind::Moe { shared }, Some(moe)) => {
                let (e, eff) = (u64::from(moe.experts), u64::from(moe.expert_ffn));
                t("ffn_gate_inp.weight", vec![e, d]);
                t("ffn_gate_exps.weight", vec![e, eff, d]);
                t("ffn_up_exps.weight", vec![e, eff, d]);
                t("ffn_down_exps.weight", vec![e, d, eff]);
                if moe.probs_bias {
                    t("exp_probs_b.bias", vec![e]);
                }
                if shared {
                    let sff = u64::from(moe.shared_expert_ffn);
                    t("ffn_gate_shexp.weight", vec![sff, d]);
                    t("ffn_up_shexp.weight", vec![sff, d]);
                    t("ffn_down_shexp.weight", vec![d, sff]);
                }
            }
            _ => {
                let ffn = u64::from(meta.ffn);
                t("ffn_gate.weight", vec![ffn, d]);
                t("ffn_up.weight", vec![ffn, d]);
                t("ffn_down.weight", vec![d, ffn]);
            }
        }
    }
    out
}

/// A KDA layer's tensors (llama.cpp's kimi-linear names; separate q/k/v projections).
fn kda_tensors(meta: &ModelMeta, t: &mut impl FnMut(&str, Vec<u64>)) {
    let k = meta
        .kda
        .as_ref()
        .expect("invariant: a KDA layer comes from KDA facts");
    let (d, h, hd) = (
        u64::from(meta.embedding),
        u64::from(meta.heads),
        u64::from(k.head_dim),
    );
    let w = h * hd;
    for p in ["q", "k", "v"] {
        t(&format!("attn_{p}.weight"), vec![w, d]);
        t(
            &format!("ssm_conv1d_{p}.weight"),
            vec![w, u64::from(k.conv_kernel)],
        );
    }
    t("ssm_f_a.weight", vec![hd, d]);
    t("ssm_f_b.weight", vec![w, hd]);
    t("ssm_beta.weight", vec![h, d]);
    t("ssm_a", vec![h]);
    t("ssm_dt.bias", vec![w]);
    t("ssm_g_a.weight", vec![hd, d]);
    t("ssm_g_b.weight", vec![w, hd]);
    t("ssm_norm.weight", vec![hd]);
    t("attn_output.weight", vec![d, w]);
}

/// Build a tensor meta from a name, dtype and shape; `None` for an unknown name.
pub fn tensor_meta(name: &str, dtype: Dtype, shape: Vec<u64>) -> Option<TensorMeta> {
    let (site, rule) = classify(name)?;
    Some(TensorMeta {
        name: name.to_string(),
        dtype,
        shape,
        site,
        rule,
    })
}

/// Synthesize the tensor list of a config.json model: norms, biases, routers, KDA's
/// convolutions and glm5-next's mHC and compressor tensors in f32 (ggml's convolution reads only f32), matrices in `dtype`, and q8_0 for
/// the short per-head rows that do not fill its blocks (MLA's per-head matrices and KDA's
/// low-rank gates under a k-quant), as llama.cpp's quantizer falls back.
pub fn synthesize(meta: &ModelMeta, dtype: Dtype) -> Vec<TensorMeta> {
    let mut tensors: Vec<TensorMeta> = expected(meta)
        .into_iter()
        .map(|(name, shape)| {
            // glm5-next's converter keeps the mHC and k-pool compressor tensors in f32 too
            let small = shape.len() == 1
                || ["ffn_gate_inp", "ssm_conv1d_", ".hc_", "indexer_compressor_"]
                    .iter()
                    .any(|s| name.contains(s));
            // per-head rows (MLA's k/v up-projections, KDA's low-rank gates) are short
            // (128); where they do not fill a k-quant block, llama.cpp's quantizer falls back
            let short = ["attn_k_b", "attn_v_b", "ssm_f_b", "ssm_g_b"]
                .iter()
                .any(|s| name.contains(s));
            let fits = shape[shape.len() - 1] % dtype.block_elems() == 0;
            let dt = match (small, short && !fits) {
                (true, _) => Dtype::F32,
                (false, true) => Dtype::Q8_0,
                (false, false) => dtype,
            };
            tensor_meta(&name, dt, shape).expect("invariant: expected() only yields known names")
        })
        .collect();
    sort_tensors(&mut tensors);
    tensors
}

/// The canonical tensor order: by site, then name.
pub fn sort_tensors(tensors: &mut [TensorMeta]) {
    tensors.sort_by(|a, b| (a.site, &a.name).cmp(&(b.site, &b.name)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_names() {
        assert_eq!(
            classify("blk.12.attn_output.weight"),
            Some((TensorSite::Layer(12), ShardRule::Cols))
        );
        assert_eq!(
            classify("blk.0.attn_q.bias"),
            Some((TensorSite::Layer(0), ShardRule::Rows))
        );
        assert_eq!(
            classify("output.weight"),
            Some((TensorSite::Head, ShardRule::Rows))
        );
        assert_eq!(classify("blk.x.attn_q.weight"), None);
        assert_eq!(classify("rope_freqs.weight"), None);
    }
}
