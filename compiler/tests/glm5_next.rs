//! glm5-next's layer schema from memra-synth's tiny GGUF (written with llama.cpp's keys and
//! tensor names): KDA and MLA+DSA layers where the per-block `head_count_kv` array says, the
//! indexer, mHC, clamp and bounded-decay facts, NextN blocks left out as llama.cpp leaves
//! them for plain decoding, and clear errors for what memra does not run.

mod common;

use common::{assert_refused, assert_same_facts, read_config_text};
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
            shared_layers: Vec::new(),
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
    let cases: [(&str, Value, &str); 6] = [
        (
            "glm5-next.hyper_connection.count",
            Value::U32(2),
            "glm5-next.hyper_connection.count is 2; supported: 4",
        ),
        (
            // the first MLA layer (1) has no full layer before it to share
            "glm5-next.attention.indexer.types",
            Value::Array(vec![Value::Bool(true), Value::Bool(false), Value::Bool(true), Value::Bool(true)]),
            "glm5-next.attention.indexer.types[1] is false, but no MLA layer before layer 1 has a full indexer whose selection it could reuse; allowed: false only after a layer with a full indexer (true)",
        ),
        (
            "glm5-next.attention.indexer.types",
            Value::Array(vec![Value::Bool(true); 3]),
            "glm5-next.attention.indexer.types has 3 entries; it must have one per trunk layer (4)",
        ),
        (
            "glm5-next.attention.indexer.types",
            Value::Array([1, 1, 2, 1].map(Value::U32).to_vec()),
            "glm5-next.attention.indexer.types[2] is not a bool; allowed: true (a full indexer) or false (the selection of the closest full layer before)",
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
        assert_refused(read_gguf(&out), want);
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
            "key `text_config.indexer_types`: entry 1 is \"shared\", but no MLA layer before layer 1 has a full indexer whose selection it could reuse; allowed: \"shared\" only after a layer with a full indexer (\"full\")",
        ),
        (
            "\"index_kpool\": 4",
            "\"index_kpool\": 4, \"indexer_types\": [\"full\", \"full\", \"sparse\", \"full\"]",
            "key `text_config.indexer_types` must be an array of 4 entries (one per layer), each \"full\" or \"shared\"",
        ),
        (
            "\"qk_rope_head_dim\": 0",
            "\"qk_rope_head_dim\": 64",
            "key `text_config.qk_rope_head_dim` must be 0 (glm5-next's MLA is nope-only)",
        ),
    ];
    for (i, (from, to, want)) in cases.into_iter().enumerate() {
        let text = TINY_CONFIG.replace(from, to);
        assert_refused(config(&format!("bad-{i}"), &text), want);
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
            let want = format!("{key} is {eps}; allowed: a positive number below 1");
            assert_refused(read_gguf(&out), &want);
        }
    }
    for eps in ["0", "-1e-6", "2"] {
        let text = TINY_CONFIG.replace("\"hc_eps\": 1e-6", &format!("\"hc_eps\": {eps}"));
        assert_refused(
            config(&format!("eps{eps}"), &text),
            "key `text_config.hc_eps` must be a positive number below 1",
        );
    }
}

#[test]
fn a_shared_indexer_layer_reuses_the_closest_full_one_and_caches_nothing() {
    // KDA layers' flags (0 and 2, false here) are not read, as llama.cpp does not read them;
    // layer 3's indexer tensors (still in the file) are optional and not loaded
    let types = [false, true, false, false].map(Value::Bool).to_vec();
    let out = rewritten(
        "shared",
        &[("glm5-next.attention.indexer.types", Value::Array(types))],
    );
    let meta = read(&out);
    let mixers: Vec<Mixer> = (0..4).map(|l| meta.layer_kind(l).mixer).collect();
    assert_eq!(
        mixers,
        [Mixer::Kda, Mixer::Dsa, Mixer::Kda, Mixer::DsaShared]
    );
    assert_eq!(meta.dsa.as_ref().unwrap().shared_layers, vec![3]);
    assert!(meta
        .tensors
        .iter()
        .any(|t| t.name == "blk.1.indexer.proj.weight"));
    assert!(!meta
        .tensors
        .iter()
        .any(|t| t.name.starts_with("blk.3.indexer")));
    // a cut at 2 or 3 parts layer 3 from layer 1; at 4 nothing follows
    let crosses: Vec<bool> = (0..=4).map(|c| meta.selection_crosses(c)).collect();
    assert_eq!(crosses, [false, false, true, true, false]);
    // the indexer's f32 row (key, gate, pooled key: 3 x 32) for layer 1 only
    assert_eq!(meta.indexer_bytes_per_token(0..4), 4 * 96);
    assert_eq!(
        read(&tiny_gguf("all-full")).indexer_bytes_per_token(0..4),
        2 * 4 * 96
    );
    // one bool for every layer: all full (all false would leave layer 1 without a source)
    let one = rewritten(
        "shared-one",
        &[("glm5-next.attention.indexer.types", Value::Bool(true))],
    );
    assert!(read(&one).dsa.unwrap().shared_layers.is_empty());
    // config.json: the same facts and tensors from indexer_types
    let text = TINY_CONFIG.replace(
        "\"index_kpool\": 4",
        "\"index_kpool\": 4, \"indexer_types\": [\"shared\", \"full\", \"shared\", \"shared\"]",
    );
    let from_config = config("shared", &text).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(from_config.dsa, meta.dsa);
    let names =
        |m: &ModelMeta| -> Vec<String> { m.tensors.iter().map(|t| t.name.clone()).collect() };
    assert_eq!(names(&from_config), names(&meta));
}

#[test]
fn the_shared_synthetic_model_alternates_full_and_shared_indexers() {
    let path = scratch("shared-synth.gguf");
    let model = memra_gguf::synth::model("tiny-glm5-next-shared").unwrap();
    model.write(GgmlType::Q8_0, 1, &path, false).unwrap();
    let meta = read(&path);
    let mixers: Vec<Mixer> = (0..8).map(|l| meta.layer_kind(l).mixer).collect();
    use Mixer::{Dsa, DsaShared, Kda};
    assert_eq!(mixers, [Kda, Dsa, Kda, DsaShared, Kda, Dsa, Kda, DsaShared]);
    let sources: Vec<Option<u32>> = [3, 7, 2]
        .iter()
        .map(|&l| memra_compiler::plan::selection_source(|x| meta.layer_kind(x).mixer, l))
        .collect();
    assert_eq!(sources, [Some(1), Some(5), None]);
    let crosses: Vec<u32> = (0..=8).filter(|&c| meta.selection_crosses(c)).collect();
    assert_eq!(crosses, [2, 3, 6, 7]);
}
