//! The two model readers agree: for each supported architecture, a tiny config.json and a GGUF
//! header written with llama.cpp's keys and tensor names give the same `ModelMeta` facts.
//! Unknown architectures and missing keys are clear errors.

use memra_compiler::model::{read_config, read_gguf, Dtype, ModelMeta, TensorMeta};
use memra_compiler::plan::Gating;
use memra_gguf::{GgmlType, GgufWriter, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh path per call: tests run in parallel and must not share files.
fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("memra-readers-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

const BASE: &str = r#""hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
  "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0"#;

/// `read_config` of a `model_type` config of `BASE` with `extra` keys (later keys replace
/// earlier ones).
fn read_base_config(model_type: &str, extra: &str) -> anyhow::Result<ModelMeta> {
    let path = scratch(&format!("{model_type}.json"));
    let text = format!("{{\"model_type\": \"{model_type}\", {BASE}{extra}}}");
    std::fs::write(&path, text).unwrap();
    read_config(&path, Dtype::F32)
}

fn config(model_type: &str, extra: &str) -> ModelMeta {
    read_base_config(model_type, extra).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The error `read_config` gives for a `model_type` config of `BASE` with `extra` keys.
fn config_error(model_type: &str, extra: &str) -> String {
    format!("{:#}", read_base_config(model_type, extra).unwrap_err())
}

/// The error `read_gguf` gives for the file at `path`, with its context chain.
fn read_error(path: &Path) -> String {
    format!("{:#}", read_gguf(path).unwrap_err())
}

/// The tensor of `meta` named `name`, to misshape.
fn tensor_mut<'a>(meta: &'a mut ModelMeta, name: &str) -> &'a mut TensorMeta {
    meta.tensors.iter_mut().find(|t| t.name == name).unwrap()
}

/// A GGUF header for `meta` in llama.cpp's spelling, with zeroed f32 tensors.
fn gguf_for(meta: &ModelMeta, arch: &str) -> PathBuf {
    gguf_without(meta, arch, "")
}

/// `gguf_for` without the key `{arch}.{dropped}`.
fn gguf_without(meta: &ModelMeta, arch: &str, dropped: &str) -> PathBuf {
    gguf_with(meta, arch, dropped, &[])
}

/// `gguf_for` without the key `{arch}.{dropped}` and with the keys `{arch}.{key}` of `extra`.
fn gguf_with(meta: &ModelMeta, arch: &str, dropped: &str, extra: &[(&str, Value)]) -> PathBuf {
    let mut w = GgufWriter::new();
    for (k, v) in extra {
        w.add(&format!("{arch}.{k}"), v.clone()).unwrap();
    }
    let dropped = format!("{arch}.{dropped}");
    let mut put = |k: &str, v: Value| {
        if k != dropped {
            w.add(k, v).unwrap();
        }
    };
    put("general.architecture", Value::Str(arch.into()));
    put("general.name", Value::Str(meta.name.clone()));
    let key = |k: &str| format!("{arch}.{k}");
    put(&key("block_count"), Value::U32(meta.layers));
    put(&key("context_length"), Value::U32(meta.context_length));
    put(&key("embedding_length"), Value::U32(meta.embedding));
    put(&key("feed_forward_length"), Value::U32(meta.ffn));
    put(&key("attention.head_count"), Value::U32(meta.heads));
    put(&key("attention.head_count_kv"), Value::U32(meta.kv_heads));
    if meta.mla.is_none() {
        put(&key("attention.key_length"), Value::U32(meta.head_dim));
    }
    put(&key("rope.freq_base"), Value::F32(meta.rope_theta));
    put(
        &key("attention.layer_norm_rms_epsilon"),
        Value::F32(meta.rms_eps),
    );
    put(&key("vocab_size"), Value::U32(meta.vocab));
    if let Some(moe) = &meta.moe {
        put(&key("expert_count"), Value::U32(moe.experts));
        put(&key("expert_used_count"), Value::U32(moe.top_k));
        put(
            &key("expert_feed_forward_length"),
            Value::U32(moe.expert_ffn),
        );
        put(
            &key("expert_shared_count"),
            Value::U32(moe.shared_expert_ffn / moe.expert_ffn),
        );
        put(
            &key("leading_dense_block_count"),
            Value::U32(moe.dense_layers),
        );
        if arch == "deepseek2" {
            let gating = match moe.gating {
                Gating::Softmax => 1,
                Gating::Sigmoid => 2,
            };
            put(&key("expert_gating_func"), Value::U32(gating));
            put(&key("expert_weights_norm"), Value::Bool(moe.norm_weights));
            put(
                &key("expert_weights_scale"),
                Value::F32(moe.weights_scale as f32),
            );
            put(&key("expert_group_count"), Value::U32(moe.groups));
            put(&key("expert_group_used_count"), Value::U32(moe.groups_used));
        }
    }
    if let Some(mla) = &meta.mla {
        // the converter's absorbed (MQA over the latent) lengths, and the real ones
        let (rope, kvl) = (mla.qk_rope_head_dim, mla.kv_lora_rank);
        put(&key("attention.q_lora_rank"), Value::U32(mla.q_lora_rank));
        put(&key("attention.kv_lora_rank"), Value::U32(kvl));
        put(&key("attention.key_length"), Value::U32(kvl + rope));
        put(&key("attention.value_length"), Value::U32(kvl));
        put(
            &key("attention.key_length_mla"),
            Value::U32(mla.qk_nope_head_dim + rope),
        );
        put(
            &key("attention.value_length_mla"),
            Value::U32(mla.v_head_dim),
        );
        put(&key("rope.dimension_count"), Value::U32(rope));
    }
    if let Some(yarn) = &meta.rope_yarn {
        put(&key("rope.scaling.type"), Value::Str("yarn".into()));
        put(&key("rope.scaling.factor"), Value::F32(yarn.factor as f32));
        put(
            &key("rope.scaling.original_context_length"),
            Value::U32(yarn.original_context),
        );
        put(
            &key("rope.scaling.yarn_log_multiplier"),
            Value::F32(0.1 * yarn.mscale_all_dim as f32),
        );
    }
    for t in &meta.tensors {
        let dims: Vec<u64> = t.shape.iter().rev().copied().collect();
        w.add_tensor(
            &t.name,
            &dims,
            GgmlType::F32,
            vec![0; t.elems() as usize * 4],
        )
        .unwrap();
    }
    let path = scratch(&format!("{arch}-{}.gguf", meta.name));
    std::fs::write(&path, w.to_bytes().unwrap()).unwrap();
    path
}

fn assert_same(cfg: &ModelMeta, gguf: &ModelMeta) {
    assert_eq!(cfg.architecture, gguf.architecture);
    assert_eq!(
        (
            cfg.layers,
            cfg.embedding,
            cfg.heads,
            cfg.kv_heads,
            cfg.head_dim,
            cfg.ffn,
            cfg.vocab
        ),
        (
            gguf.layers,
            gguf.embedding,
            gguf.heads,
            gguf.kv_heads,
            gguf.head_dim,
            gguf.ffn,
            gguf.vocab
        )
    );
    assert_eq!(
        (cfg.rope_theta, cfg.rms_eps),
        (gguf.rope_theta, gguf.rms_eps)
    );
    assert_eq!(
        (cfg.tied_embeddings, cfg.qk_norm, cfg.qkv_bias),
        (gguf.tied_embeddings, gguf.qk_norm, gguf.qkv_bias)
    );
    assert_eq!(cfg.moe, gguf.moe);
    assert_eq!(cfg.mla, gguf.mla);
    assert_eq!(cfg.rope_yarn, gguf.rope_yarn);
    let shapes = |m: &ModelMeta| {
        m.tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone(), t.rule))
            .collect::<Vec<_>>()
    };
    assert_eq!(shapes(cfg), shapes(gguf));
}

#[test]
fn config_and_gguf_agree_for_every_architecture() {
    let cases = [
        (config("llama", ""), "llama"),
        (config("llama", ", \"tie_word_embeddings\": true"), "llama"),
        (config("qwen2", ", \"tie_word_embeddings\": true"), "qwen2"),
        (config("qwen3", ", \"head_dim\": 32"), "qwen3"),
        (config("qwen3_moe", ", \"head_dim\": 16, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32"), "qwen3moe"),
        (
            config(
                "deepseek_v2",
                ", \"n_routed_experts\": 4, \"n_shared_experts\": 2, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"first_k_dense_replace\": 1, \"q_lora_rank\": null, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16",
            ),
            "deepseek2",
        ),
        (
            config(
                "deepseek_v3",
                ", \"n_routed_experts\": 4, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"first_k_dense_replace\": 1, \"q_lora_rank\": 32, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true, \"routed_scaling_factor\": 2.5, \"n_group\": 2, \"topk_group\": 1, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"original_max_position_embeddings\": 128, \"mscale_all_dim\": 0.707}",
            ),
            "deepseek2",
        ),
    ];
    for (cfg, arch) in cases {
        let gguf = read_gguf(&gguf_for(&cfg, arch)).unwrap_or_else(|e| panic!("{arch}: {e:#}"));
        assert_same(&cfg, &gguf);
    }
    let qwen2 = config("qwen2", "");
    assert!(qwen2.qkv_bias && !qwen2.qk_norm && !qwen2.tied_embeddings);
    let qwen3 = config("qwen3", ", \"head_dim\": 32");
    assert!(qwen3.qk_norm && qwen3.head_dim == 32);
}

#[test]
fn unknown_architectures_and_missing_keys_are_named() {
    let cfg = config("llama", "");
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::Str("gpt2".into()))
        .unwrap();
    let path = scratch("gpt2.gguf");
    std::fs::write(&path, w.to_bytes().unwrap()).unwrap();
    let err = read_error(&path);
    assert!(err.ends_with("architecture `gpt2` is not supported; supported: llama, qwen2, qwen3, qwen3moe, mixtral, deepseek2, kimi-linear, glm5-next"), "{err}");

    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::Str("llama".into()))
        .unwrap();
    w.add("llama.embedding_length", Value::U32(cfg.embedding))
        .unwrap();
    w.add("llama.attention.head_count", Value::U32(cfg.heads))
        .unwrap();
    let path = scratch("llama-missing.gguf");
    std::fs::write(&path, w.to_bytes().unwrap()).unwrap();
    let err = read_error(&path);
    assert!(
        err.contains("llama.feed_forward_length") || err.contains("llama.block_count"),
        "{err}"
    );
}

fn deepseek_v3() -> ModelMeta {
    config(
        "deepseek_v3",
        ", \"n_routed_experts\": 4, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"first_k_dense_replace\": 1, \"q_lora_rank\": 32, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\"",
    )
}

#[test]
fn missing_and_misshapen_expert_and_mla_tensors_are_named() {
    let mut meta = deepseek_v3();
    tensor_mut(&mut meta, "blk.1.ffn_up_exps.weight").shape = vec![4, 32, 48];
    let err = read_error(&gguf_for(&meta, "deepseek2"));
    assert!(
        err.ends_with(
            "tensor `blk.1.ffn_up_exps.weight` has shape [4, 32, 48], expected [4, 32, 64]"
        ),
        "{err}"
    );

    let mut meta = deepseek_v3();
    meta.tensors.retain(|t| t.name != "blk.1.attn_k_b.weight");
    let err = read_error(&gguf_for(&meta, "deepseek2"));
    assert!(
        err.ends_with("missing tensor `blk.1.attn_k_b.weight`"),
        "{err}"
    );
}

#[test]
fn the_legacy_unsplit_kv_up_projection_is_refused_by_name() {
    let mut meta = deepseek_v3();
    let k_b = tensor_mut(&mut meta, "blk.0.attn_k_b.weight");
    k_b.name = "blk.0.attn_kv_b.weight".into();
    k_b.shape = vec![4 * (16 + 16), 32];
    let path = gguf_without(&meta, "deepseek2", "attention.key_length_mla");
    let err = read_error(&path);
    assert!(
        err.contains("tensor `blk.0.attn_kv_b.weight` is the legacy unsplit k/v up-projection"),
        "{err}"
    );
}

#[test]
fn config_head_counts_the_layers_cannot_take_are_named() {
    // num_key_value_heads 0 divided by zero in allocate; 3 of 4 heads compiled a plan that
    // no executor runs; a zero width compiled too
    for (extra, want) in [
        (
            r#", "num_key_value_heads": 0"#,
            "key `num_key_value_heads` must be a divisor of num_attention_heads (4), got 0",
        ),
        (
            r#", "num_key_value_heads": 3"#,
            "key `num_key_value_heads` must be a divisor of num_attention_heads (4), got 3",
        ),
        (
            r#", "head_dim": 0"#,
            "key `head_dim` must be 1 to 4096 (memra's bound on model widths, which keeps its byte counts in 64 bits), got 0",
        ),
    ] {
        let err = config_error("llama", extra);
        assert!(err.ends_with(want), "{extra}: {err}");
    }
}

#[test]
fn both_readers_refuse_the_same_norm_epsilons_and_rope_bases() {
    // a GGUF's 0, negative, NaN or 1e30 compiled and ran with zero or NaN activations
    for eps in [0.0, -1e-5, f32::NAN, 1e30] {
        let mut meta = config("llama", "");
        meta.rms_eps = eps;
        let err = read_error(&gguf_for(&meta, "llama"));
        let want = format!(
            "llama.attention.layer_norm_rms_epsilon is {eps}; allowed: a positive number below 1"
        );
        assert!(err.ends_with(&want), "{eps}: {err}");
    }
    for theta in [0.0, -10000.0, f32::NAN] {
        let mut meta = config("llama", "");
        meta.rope_theta = theta;
        let err = read_error(&gguf_for(&meta, "llama"));
        let want = format!("llama.rope.freq_base is {theta}; allowed: a positive finite number");
        assert!(err.ends_with(&want), "{theta}: {err}");
    }
    for eps in ["0", "-1e-5", "1e30"] {
        let err = config_error("llama", &format!(", \"rms_norm_eps\": {eps}"));
        assert!(
            err.ends_with("key `rms_norm_eps` must be a positive number below 1"),
            "{eps}: {err}"
        );
    }
    for theta in ["0", "-10000", "1e39"] {
        let err = config_error("llama", &format!(", \"rope_theta\": {theta}"));
        assert!(
            err.ends_with("key `rope_theta` must be a positive finite number"),
            "{theta}: {err}"
        );
    }
}

/// A llama GGUF of the plain llama config whose `llama.{key}` is `bad` is refused with an
/// error ending in `want`, one whose key is the head size reads as the config; deepseek2's MLA
/// widths, which are its own, read too.
fn assert_gqa_key_is_the_head_size(key: &str, bad: u32, want: &str) {
    let meta = config("llama", "");
    let with = |value| gguf_with(&meta, "llama", "", &[(key, Value::U32(value))]);
    let err = read_error(&with(bad));
    assert!(err.ends_with(want), "{err}");
    let head_size = read_gguf(&with(meta.head_dim)).unwrap_or_else(|e| panic!("{e:#}"));
    assert_same(&meta, &head_size);
    let mla = deepseek_v3();
    assert_same(&mla, &read_gguf(&gguf_for(&mla, "deepseek2")).unwrap());
}

#[test]
fn a_partial_rope_dimension_count_is_refused_for_gqa_models() {
    // llama.cpp rotates rope.dimension_count dims of a head; memra rotated all of them
    // (deepseek2's rope dims are MLA's own)
    assert_gqa_key_is_the_head_size(
        "rope.dimension_count",
        8,
        "llama.rope.dimension_count is 8; allowed: the head size 16 (llama.attention.key_length or llama.embedding_length / llama.attention.head_count), as memra's rope rotates every dimension of a head (partial rope is not implemented)",
    );
    let err = config_error("llama", r#", "partial_rotary_factor": 0.5"#);
    assert!(
        err.ends_with("key `partial_rotary_factor` must be 1 (memra's rope rotates every dimension of a head; partial rope is not implemented)"),
        "{err}"
    );
}

#[test]
fn layer_counts_past_the_bound_are_refused_before_anything_is_sized() {
    // 0xffffffff layers got memra-compile killed for memory
    let mut meta = config("llama", "");
    meta.layers = u32::MAX;
    let err = read_error(&gguf_for(&meta, "llama"));
    assert!(
        err.ends_with(
            "llama.block_count is 4294967295; allowed: 1 to 1024 (memra plans at most 1024 layers)"
        ),
        "{err}"
    );
    let err = config_error("llama", r#", "num_hidden_layers": 4294967295"#);
    assert!(
        err.ends_with("key `num_hidden_layers` must be 1 to 1024 (memra plans at most 1024 layers), got 4294967295"),
        "{err}"
    );
    // a top-k past the experts compiled from a config.json (a GGUF refused it)
    let err = config_error(
        "mixtral",
        r#", "num_local_experts": 8, "num_experts_per_tok": 4294967295"#,
    );
    assert!(
        err.ends_with(
            "key `num_experts_per_tok` must be 1 to the expert count (8), got 4294967295"
        ),
        "{err}"
    );
}

#[test]
fn config_keys_of_unimplemented_features_are_refused() {
    for (extra, want) in [
        (
            r#", "rope_scaling": {"rope_type": "linear", "factor": 2.0}"#,
            "key `rope_scaling.rope_type` must be \"yarn\", \"llama3\" or \"default\" (memra implements no other rope scaling)",
        ),
        (
            r#", "hidden_act": "gelu""#,
            "key `hidden_act` must be \"silu\" (memra's FFNs are SwiGLU)",
        ),
        (
            r#", "attention_bias": true"#,
            "key `attention_bias` must be false (memra's attention projections have no bias)",
        ),
        (
            r#", "mlp_bias": true"#,
            "key `mlp_bias` must be false (memra's FFN projections have no bias)",
        ),
        (
            r#", "use_sliding_window": true, "sliding_window": 256"#,
            "key `use_sliding_window` must be false (sliding-window attention is not implemented)",
        ),
        (
            r#", "intermediate_size": 0"#,
            "key `intermediate_size` must be 1 to 262144 (memra's bound on model widths, which keeps its byte counts in 64 bits), got 0",
        ),
        (
            r#", "vocab_size": 0"#,
            "key `vocab_size` must be 1 to 1048576 (memra's bound on model widths, which keeps its byte counts in 64 bits), got 0",
        ),
    ] {
        let err = config_error("llama", extra);
        assert!(err.ends_with(want), "{extra}: {err}");
    }
    let err = config_error(
        "mixtral",
        r#", "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 256"#,
    );
    assert!(
        err.ends_with("key `sliding_window` must be null or at least the context length 512 (sliding-window attention is not implemented)"),
        "{err}"
    );
    // what real configs say of features they do not use still reads
    config(
        "qwen2",
        r#", "hidden_act": "silu", "attention_bias": false, "use_sliding_window": false, "sliding_window": 256, "rope_scaling": null"#,
    );
    config(
        "mixtral",
        r#", "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": null"#,
    );
}

#[test]
fn llama3_rope_scaling_is_carried_for_the_executors_to_refuse() {
    // a config.json of Llama 3.1 plans (plans/llama3.1-70b-*), and its plan says what no
    // executor runs; a GGUF carries the same scaling as a tensor and is refused
    let meta = config(
        "llama",
        r#", "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 128, "rope_type": "llama3"}"#,
    );
    let llama3 = meta.rope_llama3.as_ref().unwrap();
    assert_eq!(
        (
            llama3.factor,
            llama3.low_freq_factor,
            llama3.high_freq_factor,
            llama3.original_context
        ),
        (8.0, 1.0, 4.0, 128)
    );
    let mut with_freqs = config("llama", "");
    with_freqs.tensors.push(TensorMeta {
        name: "rope_freqs.weight".into(),
        shape: vec![8],
        ..with_freqs.tensors[0].clone()
    });
    let err = read_error(&gguf_for(&with_freqs, "llama"));
    assert!(
        err.ends_with("tensor `rope_freqs.weight` holds per-dimension rope frequency factors (Llama 3.1's rope scaling), which memra's rope does not implement"),
        "{err}"
    );
    let meta = config("llama", "");
    let err = read_error(&gguf_with(
        &meta,
        "llama",
        "",
        &[("rope.scaling.type", Value::Str("linear".into()))],
    ));
    assert!(
        err.ends_with("llama.rope.scaling.type is `linear`; supported: yarn, none (memra implements no other rope scaling)"),
        "{err}"
    );
}

const WIDTHS: &str = "(memra's bound on model widths, which keeps its byte counts in 64 bits)";

#[test]
fn widths_past_their_bounds_are_refused_by_key_from_both_readers() {
    // 2^31 experts, ffn, hidden and vocab compiled and reported "weights 520 GiB": the u64
    // byte counts wrapped
    let big = 1u64 << 31;
    let moe = r#", "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32"#;
    for (key, max) in [
        ("hidden_size", "65536"),
        ("intermediate_size", "262144"),
        ("vocab_size", "1048576"),
        ("num_attention_heads", "4096"),
        ("head_dim", "4096"),
        ("num_experts", "4096"),
        ("moe_intermediate_size", "262144"),
    ] {
        let err = config_error("qwen3_moe", &format!("{moe}, \"{key}\": {big}"));
        let want = format!("key `{key}` must be 1 to {max} {WIDTHS}, got {big}");
        assert!(err.ends_with(&want), "{key}: {err}");
    }
    let err = config_error("llama", &format!(", \"max_position_embeddings\": {big}"));
    assert!(
        err.ends_with("key `max_position_embeddings` must be 1 to 67108864 (memra's bound on a model's context), got 2147483648"),
        "{err}"
    );
    let err = config_error(
        "deepseek_v3",
        r#", "n_routed_experts": 4, "n_shared_experts": 65536, "num_experts_per_tok": 2, "moe_intermediate_size": 65536, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16"#,
    );
    assert!(
        err.ends_with("key `n_shared_experts` must be a count whose width together (times moe_intermediate_size 65536) is 0 to 262144 (memra's bound on model widths, which keeps its byte counts in 64 bits), got 65536"),
        "{err}"
    );
    let err = config_error(
        "deepseek_v3",
        &format!(", \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"kv_lora_rank\": {big}, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16"),
    );
    assert!(
        err.ends_with(&format!(
            "key `kv_lora_rank` must be 1 to 65536 {WIDTHS}, got {big}"
        )),
        "{err}"
    );

    let big = u32::MAX;
    let base = config(
        "qwen3_moe",
        r#", "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32"#,
    );
    for (key, value, allowed) in [
        ("embedding_length", big, format!("1 to 65536 {WIDTHS}")),
        ("feed_forward_length", big, format!("1 to 262144 {WIDTHS}")),
        ("feed_forward_length", 0, format!("1 to 262144 {WIDTHS}")),
        ("vocab_size", 0, format!("1 to 1048576 {WIDTHS}")),
        ("vocab_size", big, format!("1 to 1048576 {WIDTHS}")),
        ("attention.head_count", 0, format!("1 to 4096 {WIDTHS}")),
        (
            "attention.key_length",
            1 << 20,
            format!("1 to 4096 {WIDTHS}"),
        ),
        ("expert_count", big, format!("1 to 4096 {WIDTHS}")),
        (
            "expert_feed_forward_length",
            big,
            format!("1 to 262144 {WIDTHS}"),
        ),
        (
            "context_length",
            big,
            "1 to 67108864 (memra's bound on a model's context)".into(),
        ),
    ] {
        let err = read_error(&gguf_with(
            &base,
            "qwen3moe",
            key,
            &[(key, Value::U32(value))],
        ));
        let want = format!("qwen3moe.{key} is {value}; allowed: {allowed}");
        assert!(err.ends_with(&want), "{key} {value}: {err}");
    }
    // a vocabulary read from the embedding's rows is bounded alike
    let mut meta = config("llama", "");
    tensor_mut(&mut meta, "token_embd.weight").shape = vec![64 * 96];
    let err = read_error(&gguf_without(&meta, "llama", "vocab_size"));
    assert!(
        err.ends_with("tensor `token_embd.weight` has dims [6144]; expected [embedding, vocab]"),
        "{err}"
    );
    // the shared experts' width is a product of two keys
    let meta = deepseek_v3();
    let err = read_error(&gguf_with(
        &meta,
        "deepseek2",
        "expert_shared_count",
        &[("expert_shared_count", Value::U32(1 << 30))],
    ));
    assert!(
        err.ends_with(&format!("deepseek2.expert_shared_count (1073741824) times the expert width 32 is past 262144; allowed: a shared width of 0 to 262144 {WIDTHS}")),
        "{err}"
    );
}

#[test]
fn at_their_bounds_the_weights_are_counted_without_wrapping() {
    // every width at its bound, over the most layers: the weights' bytes, summed in u128,
    // agree with the u64 counts the compiler uses
    let meta = config(
        "qwen3_moe",
        r#", "hidden_size": 65536, "num_hidden_layers": 1024, "num_attention_heads": 4096, "num_key_value_heads": 4096, "head_dim": 4096, "vocab_size": 1048576, "intermediate_size": 262144, "num_experts": 4096, "num_experts_per_tok": 4096, "moe_intermediate_size": 262144"#,
    );
    let wide: u128 = meta
        .tensors
        .iter()
        .map(|t| {
            let elems: u128 = t.shape.iter().map(|&d| u128::from(d)).product();
            elems / u128::from(t.dtype.block_elems()) * u128::from(t.dtype.block_bytes())
        })
        .sum();
    let narrow = meta
        .tensors
        .iter()
        .try_fold(0u64, |sum, t| sum.checked_add(t.bytes()))
        .expect("the weights' bytes fit in u64");
    assert_eq!(u128::from(narrow), wide);
    assert!(wide < 1 << 62, "{wide}");
}

#[test]
fn gqa_value_heads_must_match_the_key_heads() {
    // llama.cpp's value_length may differ from key_length; memra's GQA attention has one
    // head size, so a differing one compiled a plan with the wrong value widths (MLA's
    // absorbed value_length, the latent rank, differs from its key_length by design)
    assert_gqa_key_is_the_head_size(
        "attention.value_length",
        32,
        "llama.attention.value_length is 32; allowed: the key head size 16 (llama.attention.key_length or llama.embedding_length / llama.attention.head_count), as memra's llama attention has one head size for keys and values",
    );
    // and a GGUF's kv heads must divide the query heads, as a config.json's must
    let mut meta = config("llama", "");
    meta.kv_heads = 3;
    let err = read_error(&gguf_for(&meta, "llama"));
    assert!(
        err.ends_with("llama.attention.head_count_kv is 3; allowed: a divisor of llama.attention.head_count (4)"),
        "{err}"
    );
}
