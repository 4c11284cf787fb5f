//! glm5-next's layer schema from memra-synth's tiny GGUF (written with llama.cpp's keys and
//! tensor names): KDA and MLA+DSA layers where the per-block `head_count_kv` array says, the
//! indexer, mHC, clamp and bounded-decay facts, NextN blocks left out as llama.cpp leaves
//! them for plain decoding, and clear errors for what memra does not run.

mod common;

use common::{assert_same_facts, read_config_text};
use memra_compiler::model::{read_gguf, Dtype, Mixer, ModelMeta};
use memra_compiler::plan::{ClampSummary, DsaSummary, FfnKind, Gating, MhcSummary};
use memra_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    common::scratch("glm5", name)
}

/// The tiny synthetic glm5-next model (q8_0) written as `{tag}.gguf` (one file per test:
/// tests run in parallel).
fn tiny_gguf(tag: &str) -> PathBuf {
    let path = scratch(&format!("{tag}.gguf"));
    let model = memra_gguf::synth::model("tiny-glm5-next").unwrap();
    model.write(GgmlType::Q8_0, 1, &path, false).unwrap();
    path
}

/// The tiny model's file rewritten as `{tag}.gguf` with the keys of `edits` replaced (or
/// added), tensor bytes zeroed.
fn rewritten(tag: &str, edits: &[(&str, Value)]) -> PathBuf {
    let file = GgufFile::open(&tiny_gguf(&format!("{tag}-source"))).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata.iter() {
        let v = match edits.iter().find(|(name, _)| name == k) {
            Some((_, value)) => value.clone(),
            None => v.clone(),
        };
        w.add(k, v).unwrap();
    }
    for (k, v) in edits {
        if !file.metadata.contains_key(*k) {
            w.add(k, v.clone()).unwrap();
        }
    }
    for t in &file.tensors {
        w.declare_tensor(&t.name, &t.dims, t.dtype).unwrap();
    }
    let out = scratch(&format!("{tag}.gguf"));
    let f = std::fs::File::create(&out).unwrap();
    let mut stream = w.start(std::io::BufWriter::new(f)).unwrap();
    for t in w.tensors().to_vec() {
        stream.write(&vec![0u8; t.n_bytes() as usize]).unwrap();
    }
    stream.finish().unwrap();
    out
}

fn read(path: &Path) -> ModelMeta {
    read_gguf(path).unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn the_schema_alternates_kda_and_sparse_mla_in_mhc_streams() {
    let meta = read(&tiny_gguf("schema"));
    let mixers: Vec<Mixer> = (0..4).map(|l| meta.layer_kind(l).mixer).collect();
    assert_eq!(mixers, [Mixer::Kda, Mixer::Dsa, Mixer::Kda, Mixer::Dsa]);
    assert_eq!(meta.layer_kind(0).ffn, FfnKind::Dense);
    assert_eq!(meta.layer_kind(1).ffn, FfnKind::Moe { shared: true });
    let kda = meta.kda.as_ref().expect("kda facts");
    assert_eq!(kda.attention_layers, vec![1, 3]);
    assert_eq!(kda.gate_lower_bound, Some(-1.0));
    let mla = meta.mla.as_ref().expect("mla facts");
    assert!(!mla.rope);
    assert_eq!(
        (
            mla.q_lora_rank,
            mla.kv_lora_rank,
            mla.qk_nope_head_dim,
            mla.qk_rope_head_dim
        ),
        (128, 128, 64, 0)
    );
    assert_eq!(
        meta.dsa,
        Some(DsaSummary {
            heads: 2,
            head_dim: 32,
            top_k: 8,
            kpool: 4,
            select_tail: true,
            norm_eps: 1e-6,
        })
    );
    assert_eq!(
        meta.mhc,
        Some(MhcSummary {
            streams: 4,
            sinkhorn_iters: 20,
            eps: 1e-6,
        })
    );
    assert_eq!(meta.residual_width(), 4 * 256);
    let moe = meta.moe.as_ref().expect("moe facts");
    assert_eq!(moe.gating, Gating::Sigmoid);
    assert!(moe.norm_weights && moe.probs_bias);
    assert_eq!(
        moe.clamp,
        Some(ClampSummary {
            experts: 2.0,
            shared: 2.0,
        })
    );
    let t = |name: &str| {
        let t = meta.tensors.iter().find(|t| t.name == name).unwrap();
        (t.shape.clone(), t.dtype)
    };
    assert_eq!(t("blk.0.hc_attn_fn.weight"), (vec![24, 1024], Dtype::F32));
    assert_eq!(
        t("blk.1.indexer.attn_q_b.weight"),
        (vec![64, 128], Dtype::F32)
    );
    assert_eq!(
        t("blk.1.indexer_compressor_ape.weight"),
        (vec![4, 32], Dtype::F32)
    );
    assert_eq!(t("blk.2.ssm_a"), (vec![4], Dtype::F32));
}

#[test]
fn nextn_blocks_are_left_out() {
    // the last block read as a NextN block: the trunk has 3 layers, blk.3 is never loaded
    let out = rewritten(
        "nextn",
        &[("glm5-next.nextn_predict_layers", Value::U32(1))],
    );
    let meta = read(&out);
    assert_eq!(meta.layers, 3);
    assert!(meta.tensors.iter().all(|t| !t.name.starts_with("blk.3.")));
    assert_eq!(meta.kda.as_ref().unwrap().attention_layers, vec![1]);
}

#[test]
fn what_memra_does_not_run_is_refused_by_name() {
    let cases: [(&str, Value, &str); 4] = [
        (
            "glm5-next.hyper_connection.count",
            Value::U32(2),
            "glm5-next.hyper_connection.count is 2; supported: 4",
        ),
        (
            "glm5-next.attention.indexer.types",
            Value::Array(vec![Value::Bool(true), Value::Bool(true), Value::Bool(true), Value::Bool(false)]),
            "glm5-next.attention.indexer.types[3] is false (a layer sharing the indexer of the layer before); memra runs full indexers only",
        ),
        (
            "glm5-next.rope.dimension_count",
            Value::U32(16),
            "glm5-next.rope.dimension_count is 16; glm5-next's MLA is nope-only (0)",
        ),
        (
            "glm5-next.swiglu_clamp_exp",
            Value::Array(vec![Value::F32(2.0), Value::F32(3.0), Value::F32(2.0), Value::F32(2.0)]),
            "glm5-next.swiglu_clamp_exp must be one f32 or an array of one equal f32 per block; memra supports one limit for every layer",
        ),
    ];
    for (i, (key, value, want)) in cases.into_iter().enumerate() {
        let out = rewritten(&format!("refused-{i}"), &[(key, value)]);
        let err = format!("{:#}", read_gguf(&out).unwrap_err());
        assert!(err.ends_with(want), "{err}");
    }
}

/// The tiny model's hyperparameters as GLM-5.3-Flash's config.json spells them (the language
/// model's keys in `text_config`); the executor's synthetic-weights tests run it too.
const TINY_CONFIG: &str = include_str!("../../plans/models/tiny-glm5-next.json");

fn config(tag: &str, text: &str) -> anyhow::Result<ModelMeta> {
    read_config_text(scratch(&format!("{tag}.json")), text, Dtype::Q8_0)
}

#[test]
fn config_json_gives_the_gguf_facts() {
    let from_gguf = read(&tiny_gguf("facts"));
    let from_config = config("facts", TINY_CONFIG).unwrap_or_else(|e| panic!("{e:#}"));
    assert_same_facts(&from_config, &from_gguf);
    // the converter's f32 tensors stay f32 under a quantized placement dtype
    let hc = from_config
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.hc_attn_fn.weight")
        .unwrap();
    assert_eq!(hc.dtype, Dtype::F32);
}

#[test]
fn config_json_refuses_what_memra_does_not_run() {
    let cases = [
        ("\"hc_mult\": 4", "\"hc_mult\": 2", "key `text_config.hc_mult` must be 4"),
        (
            "\"index_kpool\": 4",
            "\"index_kpool\": 4, \"indexer_types\": [\"full\", \"shared\", \"full\", \"full\"]",
            "key `text_config.indexer_types` must be an array of \"full\" (memra runs full indexers only)",
        ),
        (
            "\"qk_rope_head_dim\": 0",
            "\"qk_rope_head_dim\": 64",
            "key `text_config.qk_rope_head_dim` must be 0 (glm5-next's MLA is nope-only)",
        ),
    ];
    for (i, (from, to, want)) in cases.into_iter().enumerate() {
        let err = format!(
            "{:#}",
            config(&format!("bad-{i}"), &TINY_CONFIG.replace(from, to)).unwrap_err()
        );
        assert!(err.ends_with(want), "{err}");
    }
}

#[test]
fn the_indexer_and_mhc_epsilons_must_be_positive_and_below_one() {
    // 0, a negative, NaN or 2 were accepted and divided by zero or swamped the norms
    for key in [
        "glm5-next.hyper_connection.epsilon",
        "glm5-next.attention.layer_norm_epsilon",
    ] {
        for (i, eps) in [0.0, -1e-6, f32::NAN, 2.0].into_iter().enumerate() {
            let tag = format!("eps-{}-{i}", key.len());
            let out = rewritten(&tag, &[(key, Value::F32(eps))]);
            let err = format!("{:#}", read_gguf(&out).unwrap_err());
            let want = format!("{key} is {eps}; allowed: a positive number below 1");
            assert!(err.ends_with(&want), "{err}");
        }
    }
    for eps in ["0", "-1e-6", "2"] {
        let text = TINY_CONFIG.replace("\"hc_eps\": 1e-6", &format!("\"hc_eps\": {eps}"));
        let err = format!("{:#}", config(&format!("eps{eps}"), &text).unwrap_err());
        assert!(
            err.ends_with("key `text_config.hc_eps` must be a positive number below 1"),
            "{err}"
        );
    }
}
