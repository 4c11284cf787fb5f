//! The qwen3moe, deepseek2, kimi-linear and glm5-next synthetic shapes: each tiny shape writes a file whose metadata
//! and tensor list (names, GGUF dims, storage types, in file order) are the ones llama.cpp
//! reads, written out here independently of the generator; depth cuts keep the leading dense
//! layers; shape lookup lists every architecture's names; and the real-width GLM-5.3-Flash
//! shape has the layers and sizes of its config.json.

use std::path::PathBuf;

use memra_gguf::{synth, GgmlType, GgufFile};

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("memra-synth-moe-{}-{tag}.gguf", std::process::id()))
}

/// One expected tensor: name, GGUF dims (innermost first), storage type.
type Want = (String, Vec<u64>, GgmlType);

/// Writes `shape` in `dtype` and returns the opened file.
fn write(shape: &str, dtype: GgmlType, layers: Option<u32>) -> (GgufFile, PathBuf) {
    let mut m = synth::model(shape).unwrap();
    if let Some(n) = layers {
        m = m.with_layers(n).unwrap();
    }
    let p = temp_path(&format!("{shape}-{}-{layers:?}", dtype.name()));
    m.write(dtype, 7, &p, false).unwrap();
    (GgufFile::open(&p).unwrap(), p)
}

/// The token embedding's type: Q8_0 under a block-quantized model dtype, the dtype otherwise.
fn embd(m: GgmlType) -> GgmlType {
    if m.block_size() > 1 {
        GgmlType::Q8_0
    } else {
        m
    }
}

/// A tensor's GGUF dims and storage type; panics naming a missing one.
fn dims_and_type(f: &GgufFile, name: &str) -> (Vec<u64>, GgmlType) {
    let t = f.tensor(name).unwrap_or_else(|| panic!("{name}"));
    (t.dims.clone(), t.dtype)
}

/// The per-layer `attention.head_count_kv` array of a hybrid file (0 for a KDA layer).
fn kv_heads_per_layer(f: &GgufFile) -> Vec<i128> {
    let key = format!("{}.attention.head_count_kv", f.architecture().unwrap());
    f.get_array(&key)
        .unwrap()
        .iter()
        .map(|v| v.as_int().unwrap())
        .collect()
}

fn assert_tensors(f: &GgufFile, want: &[Want]) {
    let got: Vec<Want> = f
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone(), t.dtype))
        .collect();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "tensor {i}");
    }
    assert_eq!(got.len(), want.len());
    for t in &f.tensors {
        let v = f.dequantize_tensor(t).unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{}", t.name);
    }
}

/// The tensors of tiny-qwen3moe (dim 256, 8 heads of 64, 2 kv heads, 8 experts of 256).
fn qwen3moe_tensors(m: GgmlType) -> Vec<Want> {
    let f32 = GgmlType::F32;
    let mut w = vec![("token_embd.weight".to_string(), vec![256, 256], embd(m))];
    for l in 0..2 {
        let t = |s: &str, d: &[u64], ty| (format!("blk.{l}.{s}.weight"), d.to_vec(), ty);
        w.extend([
            t("attn_norm", &[256], f32),
            t("attn_q", &[256, 512], m),
            t("attn_q_norm", &[64], f32),
            t("attn_k", &[256, 128], m),
            t("attn_k_norm", &[64], f32),
            t("attn_v", &[256, 128], m),
            t("attn_output", &[512, 256], m),
            t("ffn_norm", &[256], f32),
            t("ffn_gate_inp", &[256, 8], f32),
            t("ffn_gate_exps", &[256, 256, 8], m),
            t("ffn_up_exps", &[256, 256, 8], m),
            t("ffn_down_exps", &[256, 256, 8], m),
        ]);
    }
    w.push(("output_norm.weight".into(), vec![256], f32));
    w.push(("output.weight".into(), vec![256, 256], m));
    w
}

/// The tensors of a tiny deepseek2 shape (dim 256, 4 heads, kv latent 256, nope 64, rope 32,
/// v 64, one leading dense layer of 512, experts of 256) with `layers` blocks.
fn deepseek2_tensors(
    m: GgmlType,
    q_lora: bool,
    experts: u64,
    shared: u64,
    bias: bool,
    layers: u32,
) -> Vec<Want> {
    let f32 = GgmlType::F32;
    let mut w = vec![("token_embd.weight".to_string(), vec![256, 256], embd(m))];
    for l in 0..layers {
        let t = |s: &str, d: &[u64], ty| (format!("blk.{l}.{s}.weight"), d.to_vec(), ty);
        w.push(t("attn_norm", &[256], f32));
        if q_lora {
            w.push(t("attn_q_a", &[256, 256], m));
            w.push(t("attn_q_a_norm", &[256], f32));
            w.push(t("attn_q_b", &[256, 4 * 96], m));
        } else {
            w.push(t("attn_q", &[256, 4 * 96], m));
        }
        w.extend([
            t("attn_kv_a_mqa", &[256, 256 + 32], m),
            t("attn_kv_a_norm", &[256], f32),
            t("attn_k_b", &[64, 256, 4], m),
            t("attn_v_b", &[256, 64, 4], m),
            t("attn_output", &[256, 256], m),
            t("ffn_norm", &[256], f32),
        ]);
        if l == 0 {
            w.extend([
                t("ffn_gate", &[256, 512], m),
                t("ffn_up", &[256, 512], m),
                t("ffn_down", &[512, 256], m),
            ]);
            continue;
        }
        w.push(t("ffn_gate_inp", &[256, experts], f32));
        if bias {
            w.push((format!("blk.{l}.exp_probs_b.bias"), vec![experts], f32));
        }
        let s = 256 * shared;
        w.extend([
            t("ffn_gate_exps", &[256, 256, experts], m),
            t("ffn_up_exps", &[256, 256, experts], m),
            t("ffn_down_exps", &[256, 256, experts], m),
            t("ffn_gate_shexp", &[256, s], m),
            t("ffn_up_shexp", &[256, s], m),
            t("ffn_down_shexp", &[s, 256], m),
        ]);
    }
    w.push(("output_norm.weight".into(), vec![256], f32));
    w.push(("output.weight".into(), vec![256, 256], m));
    w
}

#[test]
fn tiny_qwen3moe_has_llama_cpp_tensors_and_keys() {
    let (f, p) = write("tiny-qwen3moe", GgmlType::Q8_0, None);
    assert_eq!(f.architecture().unwrap(), "qwen3moe");
    let u = |k: &str| f.get_u32(&format!("qwen3moe.{k}")).unwrap();
    assert_eq!(
        [
            u("block_count"),
            u("embedding_length"),
            u("attention.head_count")
        ],
        [2, 256, 8]
    );
    assert_eq!(
        [u("attention.head_count_kv"), u("attention.key_length")],
        [2, 64]
    );
    assert_eq!(
        [
            u("expert_count"),
            u("expert_used_count"),
            u("expert_feed_forward_length")
        ],
        [8, 4, 256]
    );
    assert!(!f.metadata.contains_key("qwen3moe.rope.dimension_count"));
    assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 256);
    assert_tensors(&f, &qwen3moe_tensors(GgmlType::Q8_0));
    let _ = std::fs::remove_file(p);
}

#[test]
fn tiny_deepseek2_has_llama_cpp_tensors_and_keys() {
    let (f, p) = write("tiny-deepseek2", GgmlType::F16, None);
    assert_eq!(f.architecture().unwrap(), "deepseek2");
    let u = |k: &str| f.get_u32(&format!("deepseek2.{k}")).unwrap();
    let fl = |k: &str| f.get_f32(&format!("deepseek2.{k}")).unwrap();
    assert_eq!(
        [u("attention.q_lora_rank"), u("attention.kv_lora_rank")],
        [256, 256]
    );
    // the absorbed form: one kv head of latent + rope; the real head widths in the _mla keys
    assert_eq!(
        [
            u("attention.head_count_kv"),
            u("attention.key_length"),
            u("attention.value_length")
        ],
        [1, 288, 256]
    );
    assert_eq!(
        [
            u("attention.key_length_mla"),
            u("attention.value_length_mla")
        ],
        [96, 64]
    );
    assert_eq!(u("rope.dimension_count"), 32);
    assert_eq!(
        [u("expert_group_count"), u("expert_group_used_count")],
        [4, 2]
    );
    assert_eq!(
        [u("expert_gating_func"), u("leading_dense_block_count")],
        [2, 1]
    );
    assert_eq!(
        [
            u("expert_count"),
            u("expert_used_count"),
            u("expert_shared_count")
        ],
        [16, 4, 1]
    );
    assert_eq!(fl("expert_weights_scale"), 2.5);
    assert_eq!(f.get_str("deepseek2.rope.scaling.type").unwrap(), "yarn");
    assert_eq!(fl("rope.scaling.factor"), 4.0);
    assert_eq!(u("rope.scaling.original_context_length"), 4096);
    assert_eq!(fl("rope.scaling.yarn_log_multiplier"), 0.1);
    assert!(f.metadata.contains_key("deepseek2.expert_weights_norm"));
    assert_tensors(&f, &deepseek2_tensors(GgmlType::F16, true, 16, 1, true, 3));
    let _ = std::fs::remove_file(p);
}

#[test]
fn tiny_deepseek2_lite_has_no_q_lora_and_v2_routing() {
    let (f, p) = write("tiny-deepseek2-lite", GgmlType::Q8_0, None);
    let u = |k: &str| f.get_u32(&format!("deepseek2.{k}")).unwrap();
    assert_eq!(u("attention.q_lora_rank"), 0);
    assert_eq!([u("expert_gating_func"), u("expert_group_count")], [1, 1]);
    assert!(!f.metadata.contains_key("deepseek2.expert_weights_norm"));
    let log_mul = f
        .get_f32("deepseek2.rope.scaling.yarn_log_multiplier")
        .unwrap();
    assert_eq!(log_mul, (0.1f64 * 0.707) as f32);
    assert_tensors(
        &f,
        &deepseek2_tensors(GgmlType::Q8_0, false, 8, 2, false, 3),
    );
    let _ = std::fs::remove_file(p);
}

#[test]
fn k_quants_fall_back_for_per_head_rows() {
    // k_b rows are qk_nope = 64 wide: too short for a 256-block, so Q8_0 as llama.cpp's quantizer
    let (f, p) = write("tiny-deepseek2", GgmlType::Q4_K, Some(2));
    for (name, dtype) in [
        ("blk.1.attn_k_b.weight", GgmlType::Q8_0),
        ("blk.1.attn_v_b.weight", GgmlType::Q4_K),
        ("blk.1.ffn_down_exps.weight", GgmlType::Q4_K),
        ("blk.1.ffn_gate_inp.weight", GgmlType::F32),
    ] {
        assert_eq!(f.tensor(name).unwrap().dtype, dtype, "{name}");
    }
    assert_eq!(f.get_u32("deepseek2.block_count").unwrap(), 2);
    let _ = std::fs::remove_file(p);
}

#[test]
fn depth_cuts_keep_leading_dense_layers_and_refuse_lite_depths() {
    let (f, p) = write("tiny-deepseek2", GgmlType::F32, Some(1));
    assert_eq!(f.get_u32("deepseek2.leading_dense_block_count").unwrap(), 1);
    assert_tensors(&f, &deepseek2_tensors(GgmlType::F32, true, 16, 1, true, 1));
    let _ = std::fs::remove_file(p);

    let v3 = synth::model("deepseek-v3").unwrap();
    assert_eq!(v3.with_layers(4).unwrap().layers(), 4);
    let e = v3.with_layers(27).unwrap_err().to_string();
    assert!(
        e.starts_with("layers: shape `deepseek-v3` has q-lora"),
        "{e}"
    );
    let lite = synth::model("deepseek-v2-lite").unwrap();
    assert_eq!(lite.with_layers(27).unwrap().layers(), 27);
    let e = lite.with_layers(28).unwrap_err().to_string();
    assert_eq!(
        e,
        "layers: 28 is out of range for shape `deepseek-v2-lite`; allowed: 1 to 27"
    );
}

#[test]
fn model_lookup_covers_every_architecture() {
    let e = synth::model("huge").unwrap_err().to_string();
    assert_eq!(
        e,
        "unknown shape `huge`; known shapes: tiny, tiny-tp, smol135m, llama1b, llama8b, \
         llama8b-tp2-rank, tiny-qwen3moe, qwen3-30b-a3b, tiny-deepseek2, tiny-deepseek2-lite, deepseek-v2-lite, \
         deepseek-v3, tiny-kimi-linear, kimi-linear-48b, tiny-glm5-next, tiny-glm5-next-shared, glm-5.3-flash"
    );
    let archs: Vec<&str> = synth::models().iter().map(|m| m.architecture()).collect();
    assert_eq!(archs.iter().filter(|a| **a == "qwen3moe").count(), 2);
    assert_eq!(archs.iter().filter(|a| **a == "deepseek2").count(), 4);
    assert_eq!(archs.iter().filter(|a| **a == "kimi-linear").count(), 2);
    assert_eq!(archs.iter().filter(|a| **a == "glm5-next").count(), 3);
    assert_eq!(
        synth::model("tiny").unwrap(),
        synth::Model::Llama(synth::shape("tiny").unwrap())
    );
}

#[test]
fn tiny_kimi_linear_has_llama_cpp_kda_tensors_and_keys() {
    let (f, p) = write("tiny-kimi-linear", GgmlType::Q8_0, None);
    assert_eq!(f.architecture().unwrap(), "kimi-linear");
    let u = |k: &str| f.get_u32(&format!("kimi-linear.{k}")).unwrap();
    // KDA layers carry 0 kv heads, MLA layers the one kv head of the absorbed form
    assert_eq!(kv_heads_per_layer(&f), [0, 1, 0, 1]);
    assert_eq!([u("kda.head_dim"), u("ssm.conv_kernel")], [32, 4]);
    assert_eq!(
        [u("expert_gating_func"), u("leading_dense_block_count")],
        [2, 1]
    );
    let t = |name: &str| dims_and_type(&f, name);
    // ggml's ssm_conv reads f32 taps laid out [d_conv, 1, channels]; ssm_a is [1, heads]
    assert_eq!(
        t("blk.0.ssm_conv1d_q.weight"),
        (vec![4, 1, 128], GgmlType::F32)
    );
    assert_eq!(t("blk.2.ssm_a"), (vec![1, 4], GgmlType::F32));
    assert_eq!(t("blk.2.ssm_dt.bias"), (vec![128], GgmlType::F32));
    assert_eq!(t("blk.0.ssm_f_b.weight"), (vec![32, 128], GgmlType::Q8_0));
    assert_eq!(t("blk.0.ssm_beta.weight"), (vec![256, 4], GgmlType::Q8_0));
    assert_eq!(
        t("blk.0.attn_output.weight"),
        (vec![128, 256], GgmlType::Q8_0)
    );
    // MLA layers: direct query, per-head k/v up-projections, no KDA tensors
    assert_eq!(t("blk.1.attn_q.weight"), (vec![256, 384], GgmlType::Q8_0));
    assert_eq!(
        t("blk.1.attn_k_b.weight"),
        (vec![64, 256, 4], GgmlType::Q8_0)
    );
    assert!(f.tensor("blk.1.ssm_a").is_none() && f.tensor("blk.1.attn_k.weight").is_none());
    let _ = std::fs::remove_file(p);
}

#[test]
fn tiny_glm5_next_has_llama_cpp_tensors_and_keys() {
    let (f, p) = write("tiny-glm5-next", GgmlType::Q8_0, None);
    assert_eq!(f.architecture().unwrap(), "glm5-next");
    let u = |k: &str| f.get_u32(&format!("glm5-next.{k}")).unwrap();
    assert_eq!(kv_heads_per_layer(&f), [0, 1, 0, 1]);
    assert_eq!(
        [
            u("attention.indexer.head_count"),
            u("attention.indexer.key_length"),
            u("attention.indexer.top_k"),
            u("attention.indexer.kpool"),
        ],
        [2, 32, 8, 4]
    );
    assert_eq!(
        [u("hyper_connection.count"), u("rope.dimension_count")],
        [4, 0]
    );
    let t = |name: &str| dims_and_type(&f, name);
    // mHC: fn {hc*n_embd, (2+hc)*hc}, base {(2+hc)*hc}, scale {3}, all F32
    assert_eq!(
        t("blk.0.hc_attn_fn.weight"),
        (vec![1024, 24], GgmlType::F32)
    );
    assert_eq!(t("blk.3.hc_ffn_base.weight"), (vec![24], GgmlType::F32));
    assert_eq!(t("blk.3.hc_ffn_scale.weight"), (vec![3], GgmlType::F32));
    // KDA: ssm_a is 1-d; the low-rank gates stay unquantized
    assert_eq!(t("blk.0.ssm_a"), (vec![4], GgmlType::F32));
    assert_eq!(t("blk.0.ssm_f_b.weight"), (vec![32, 128], GgmlType::F32));
    assert_eq!(t("blk.0.attn_q.weight"), (vec![256, 128], GgmlType::Q8_0));
    // nope MLA with q-LoRA: the latent projection has no rope part
    assert_eq!(t("blk.1.attn_q_b.weight"), (vec![128, 256], GgmlType::Q8_0));
    assert_eq!(
        t("blk.1.attn_kv_a_mqa.weight"),
        (vec![256, 128], GgmlType::F32)
    );
    // the indexer and its k-pool compressor
    assert_eq!(
        t("blk.1.indexer.attn_q_b.weight"),
        (vec![128, 64], GgmlType::F32)
    );
    assert_eq!(
        t("blk.1.indexer_compressor_ape.weight"),
        (vec![32, 4], GgmlType::F32)
    );
    assert_eq!(t("blk.1.indexer.k_norm.bias"), (vec![32], GgmlType::F32));
    assert!(f.tensor("blk.0.indexer.proj.weight").is_none() && f.tensor("blk.1.ssm_a").is_none());
    let _ = std::fs::remove_file(p);
}

#[test]
fn glm_5_3_flash_follows_its_config() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../plans/models/glm-5.3-flash.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let number = |key: &str| -> f64 {
        let rest = text.split(&format!("\"{key}\": ")).nth(1).unwrap();
        rest.split([',', '\n'])
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let synth::Model::Glm5Next(s) = synth::model("glm-5.3-flash").unwrap() else {
        panic!("glm-5.3-flash is not a glm5-next shape");
    };
    // a one-line array of strings, as `key` lists them
    let strings = |key: &str| -> Vec<String> {
        let list = text.split(&format!("\"{key}\": [")).nth(1).unwrap();
        let list = list.split(']').next().unwrap();
        list.split(',').map(|t| t.trim().replace('"', "")).collect()
    };
    // the mixers and, the MLA layers alternating full and shared from a full one, the indexers
    let (layer_types, indexer_types) = (strings("layer_types"), strings("indexer_types"));
    assert_eq!((layer_types.len(), indexer_types.len()), (45, 45));
    for l in 0..s.layers {
        let (mixer, indexer) = (&layer_types[l as usize], &indexer_types[l as usize]);
        assert_eq!(
            (mixer == "full_attention", indexer == "full"),
            (s.is_attention(l), s.has_indexer(l)),
            "layer {l}"
        );
    }
    let mla_full: Vec<bool> = (0..s.layers)
        .filter(|&l| s.is_attention(l))
        .map(|l| s.has_indexer(l))
        .collect();
    assert_eq!(mla_full.len(), 12);
    assert!(
        mla_full.iter().step_by(2).all(|&f| f) && mla_full.iter().skip(1).step_by(2).all(|&f| !f)
    );
    for (key, value) in [
        ("hidden_size", s.dim as f64),
        ("intermediate_size", s.moe.ffn as f64),
        ("moe_intermediate_size", s.moe.expert_ffn as f64),
        ("num_attention_heads", f64::from(s.heads)),
        ("n_routed_experts", f64::from(s.moe.experts)),
        ("num_experts_per_tok", f64::from(s.moe.experts_used)),
        ("q_lora_rank", s.q_lora_rank as f64),
        ("kv_lora_rank", s.kv_lora_rank as f64),
        ("qk_nope_head_dim", s.qk_nope as f64),
        ("v_head_dim", s.v_head as f64),
        ("vocab_size", s.vocab as f64),
        ("swiglu_limit", f64::from(s.swiglu_limit)),
        ("gate_lower_bound", f64::from(s.gate_lower_bound.unwrap())),
        ("index_topk", f64::from(s.indexer_top_k)),
        ("index_head_dim", s.indexer_head as f64),
        ("rms_norm_eps", f64::from(s.norm_eps)),
        ("head_dim", s.kda_head as f64),
        ("short_conv_kernel_size", s.conv as f64),
        ("index_n_heads", f64::from(s.indexer_heads)),
        ("index_kpool", f64::from(s.kpool)),
        ("first_k_dense_replace", f64::from(s.moe.dense_layers)),
        ("n_shared_experts", f64::from(s.moe.shared_experts)),
        ("routed_scaling_factor", f64::from(s.weights_scale)),
        ("hc_sinkhorn_iters", f64::from(s.sinkhorn_iters)),
        ("hc_eps", f64::from(s.hc_eps)),
        ("max_position_embeddings", f64::from(s.context)),
    ] {
        assert!(
            (number(key) - value).abs() <= 1e-6 * value.abs(),
            "{key}: {} != {value}",
            number(key)
        );
    }
}
