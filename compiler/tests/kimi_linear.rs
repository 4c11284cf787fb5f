//! kimi-linear's layer schema from both readers: memra-synth's tiny GGUF (written with
//! llama.cpp's keys and tensor names) and the equivalent config.json give the same KDA, MLA
//! and MoE facts and tensors; the schema puts KDA and MLA layers where the per-layer
//! `head_count_kv` array (or `full_attn_layers`) says; a malformed layer list is a clear error.

mod common;

use common::{assert_refused, assert_same_facts, read_config_text};
use memra_compiler::model::{read_gguf, Dtype, Mixer, ModelMeta};
use memra_compiler::plan::{FfnKind, Gating};
use memra_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    common::scratch("kimi", name)
}

/// The tiny synthetic kimi-linear model (f32) written as `{tag}.gguf` (one file per test:
/// tests run in parallel), its header read.
fn tiny_gguf(tag: &str) -> (PathBuf, ModelMeta) {
    let path = scratch(&format!("{tag}.gguf"));
    let model = memra_gguf::synth::model("tiny-kimi-linear").unwrap();
    model.write(GgmlType::F32, 1, &path, false).unwrap();
    let meta = read_gguf(&path).unwrap_or_else(|e| panic!("{e:#}"));
    (path, meta)
}

/// The tiny model's hyperparameters as a Hugging Face config.json.
const TINY_CONFIG: &str = r#"{"model_type": "kimi_linear", "hidden_size": 256,
  "intermediate_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8,
  "num_experts_per_token": 2, "num_shared_experts": 1, "first_k_dense_replace": 1,
  "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446,
  "q_lora_rank": null, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
  "v_head_dim": 64, "vocab_size": 256, "model_max_length": 4096, "rms_norm_eps": 1e-5,
  "linear_attn_config": {"full_attn_layers": [2, 4], "head_dim": 32,
    "short_conv_kernel_size": 4}}"#;

fn config(tag: &str, text: &str) -> anyhow::Result<ModelMeta> {
    read_config_text(scratch(&format!("{tag}.json")), text, Dtype::F32)
}

#[test]
fn the_schema_alternates_kda_and_mla_as_the_file_says() {
    let (_, meta) = tiny_gguf("schema");
    let kda = meta.kda.as_ref().expect("kda facts");
    assert_eq!((kda.head_dim, kda.conv_kernel), (32, 4));
    assert_eq!(kda.attention_layers, vec![1, 3]);
    let mixers: Vec<Mixer> = (0..4).map(|l| meta.layer_kind(l).mixer).collect();
    assert_eq!(mixers, [Mixer::Kda, Mixer::Mla, Mixer::Kda, Mixer::Mla]);
    assert_eq!(meta.layer_kind(0).ffn, FfnKind::Dense);
    assert_eq!(meta.layer_kind(2).ffn, FfnKind::Moe { shared: true });
    let mla = meta.mla.as_ref().expect("mla facts");
    assert!(!mla.rope, "kimi-linear's MLA has no rope");
    assert_eq!(mla.q_lora_rank, 0);
    assert!(meta.rope_yarn.is_none());
    let moe = meta.moe.as_ref().expect("moe facts");
    assert_eq!(moe.gating, Gating::Sigmoid);
    assert!(moe.norm_weights && moe.probs_bias);
    assert_eq!(moe.weights_scale, 2.446);
    // the convolutions read as [channels, taps] matrices, ssm_a as a vector of heads
    let conv = meta
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.ssm_conv1d_q.weight")
        .unwrap();
    assert_eq!((conv.shape.clone(), conv.dtype), (vec![128, 4], Dtype::F32));
    let a = meta
        .tensors
        .iter()
        .find(|t| t.name == "blk.2.ssm_a")
        .unwrap();
    assert_eq!(a.shape, vec![4]);
}

#[test]
fn config_json_gives_the_gguf_facts() {
    let (_, from_gguf) = tiny_gguf("facts");
    let from_config = config("facts", TINY_CONFIG).unwrap_or_else(|e| panic!("{e:#}"));
    assert_same_facts(&from_config, &from_gguf);
}

#[test]
fn config_json_refuses_what_memra_does_not_run() {
    for (tag, from, to, want) in [
        (
            // KDA heads other than the model's heads
            "kda-heads",
            "\"head_dim\": 32,",
            "\"head_dim\": 32, \"num_heads\": 8,",
            "key `linear_attn_config.num_heads` must be num_attention_heads (4), as llama.cpp reads kimi-linear",
        ),
        (
            // a bad attention layer list
            "bad-layers",
            "[2, 4]",
            "[0, 4]",
            "key `linear_attn_config.full_attn_layers` must be an array of layer numbers in 1..=4",
        ),
    ] {
        assert_refused(config(tag, &TINY_CONFIG.replace(from, to)), want);
    }
}

/// The tiny model's file rewritten as `{tag}.gguf` with `key` (if any) replaced by `value`
/// and the tensors `keep` accepts, `dims` renaming their GGUF dims.
fn rewritten(
    tag: &str,
    key: Option<(&str, Value)>,
    keep: impl Fn(&str) -> bool,
    dims: impl Fn(&str, &[u64]) -> Vec<u64>,
) -> PathBuf {
    let (path, _) = tiny_gguf(&format!("{tag}-source"));
    let file = GgufFile::open(&path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata.iter() {
        let v = match &key {
            Some((name, value)) if name == k => value.clone(),
            _ => v.clone(),
        };
        w.add(k, v).unwrap();
    }
    let kept: Vec<_> = file.tensors.iter().filter(|t| keep(&t.name)).collect();
    for t in &kept {
        w.declare_tensor(&t.name, &dims(&t.name, &t.dims), t.dtype)
            .unwrap();
    }
    let out = scratch(&format!("{tag}.gguf"));
    let f = std::fs::File::create(&out).unwrap();
    let mut stream = w.start(std::io::BufWriter::new(f)).unwrap();
    for t in &kept {
        let n = w
            .tensors()
            .iter()
            .find(|x| x.name == t.name)
            .unwrap()
            .n_bytes();
        stream.write(&vec![0u8; n as usize]).unwrap();
    }
    stream.finish().unwrap();
    out
}

#[test]
fn a_scalar_head_count_kv_is_a_clear_error() {
    // a scalar `head_count_kv` leaves the mixers unknown
    let kv = ("kimi-linear.attention.head_count_kv", Value::U32(1));
    let out = rewritten("scalar-kv", Some(kv), |_| true, |_, d| d.to_vec());
    assert_refused(
        read_gguf(&out),
        "kimi-linear.attention.head_count_kv must be an array of 4 integers (0 for a KDA layer, the kv head count for an MLA layer)",
    );
}

#[test]
fn a_missing_or_misshapen_kda_tensor_is_named() {
    let out = rewritten(
        "no-f-b",
        None,
        |n| n != "blk.2.ssm_f_b.weight",
        |_, d| d.to_vec(),
    );
    assert_refused(read_gguf(&out), "missing tensor `blk.2.ssm_f_b.weight`");
    let out = rewritten(
        "beta-shape",
        None,
        |_| true,
        |n, d| match n {
            "blk.0.ssm_beta.weight" => vec![256, 8],
            _ => d.to_vec(),
        },
    );
    assert_refused(
        read_gguf(&out),
        "tensor `blk.0.ssm_beta.weight` has shape [8, 256], expected [4, 256]",
    );
    // llama.cpp's 4-d convolution form reads as the same [channels, taps] matrix
    let out = rewritten(
        "conv-4d",
        None,
        |_| true,
        |n, d| match n.contains("ssm_conv1d") {
            true => [d, &[1]].concat(),
            false => d.to_vec(),
        },
    );
    read_gguf(&out).unwrap_or_else(|e| panic!("{e:#}"));
}
