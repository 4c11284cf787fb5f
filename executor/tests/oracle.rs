//! The oracle: llama.cpp (commit 0c1e570, CPU, f32 KV cache, no flash attention) decoded the
//! tiny synthetic `qwen3moe` and `deepseek2` models of `testdata/oracle/*.json` (recorded by
//! `scripts/oracle/run.sh`). Each test regenerates the file's GGUF with memra-synth (and checks
//! its FNV-1a against the recording, so the weights are the ones llama.cpp read), compiles a
//! 1-rank plan with the recording's KV dtype, decodes the same prompt greedily and requires
//! the same token at every recorded step and logits within `MAX_REL_ERR` of llama.cpp's.
//!
//! The error of a step is `max |memra - llama.cpp| / max |llama.cpp|` over its logits; the
//! bound depends on the weights' dtype (`max_rel_err`):
//!
//! - f32: 1e-5. Both sides compute in f32 and differ only in summation order and libm
//!   (measured at most 4.7e-7 for qwen3moe), so a wrong gating function, scale or rope is
//!   orders of magnitude above it; `a_wrong_*` tests break one piece of the math and show it.
//! - f16: 2e-3. ggml rounds the activations of f16 products to f16 (relative 2^-11), memra
//!   keeps them f32 (measured at most 7.6e-4).
//! - q8_0: 3e-2. Both sides quantize activations to the same 8-bit blocks, so most steps agree
//!   to 2e-7; but where an activation sits an ulp from a rounding boundary, the two summation
//!   orders put its 8-bit value one step apart, and one such step in the final norm's output
//!   moves a logit by a weight times the block's scale (measured at most 1.2e-2, in 5 of 53
//!   steps of qwen3moe).

mod common;

use std::path::PathBuf;

use common::{options, root, synth_model};
use memra_compiler::model::fnv1a;
use memra_compiler::passes::compile;
use memra_compiler::plan::Gating;
use memra_executor::cpu::Arm;
use memra_executor::gate::decode_all;
use memra_executor::plan_load::{load, LoadedPlan};
use serde_json::Value;

/// Largest accepted `max |memra - llama.cpp| / max |llama.cpp|` of any step's logits, by the
/// dtype of the weights (see the module doc).
fn max_rel_err(dtype: &str) -> f64 {
    match dtype {
        "f32" => 1e-5,
        "f16" => 2e-3,
        "q8_0" => 3e-2,
        other => panic!("no bound for dtype {other}"),
    }
}

/// What a recording holds that the test reads.
struct Recording {
    shape: String,
    dtype: String,
    seed: u64,
    /// FNV-1a 64 of the GGUF file llama.cpp read.
    fnv1a64: String,
    kv_cache: String,
    prompt: Vec<u32>,
    generated: usize,
    steps: Vec<Step>,
}

/// One decode step of a recording: the position fed, llama.cpp's greedy pick, its logits.
struct Step {
    pos: u32,
    argmax: u32,
    logits: Vec<f32>,
}

fn recording(name: &str) -> Recording {
    let path = root().join(format!("testdata/oracle/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let str_at = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap().to_string();
    let u32s = |x: &Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    Recording {
        shape: str_at("/synth/shape"),
        dtype: str_at("/synth/dtype"),
        seed: v.pointer("/synth/seed").and_then(Value::as_u64).unwrap(),
        fnv1a64: str_at("/synth/fnv1a64"),
        kv_cache: str_at("/settings/kv_cache"),
        prompt: u32s(&v["prompt"]),
        generated: v["generated"].as_array().unwrap().len(),
        steps: v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| Step {
                pos: s["pos"].as_u64().unwrap() as u32,
                argmax: s["argmax"].as_u64().unwrap() as u32,
                logits: s["logits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l.as_f64().unwrap() as f32)
                    .collect(),
            })
            .collect(),
    }
}

/// The recording's model (regenerated and checked) and a 1-rank plan of it, compiled into
/// a scratch directory.
fn plan_for(rec: &Recording, name: &str) -> LoadedPlan {
    let rel = format!(
        "models/oracle/{}-{}-seed{}.gguf",
        rec.shape, rec.dtype, rec.seed
    );
    let model = synth_model(&rec.shape, &rec.dtype, rec.seed, &rel);
    let bytes = std::fs::read(&model).unwrap();
    assert_eq!(
        format!("{:016x}", fnv1a(&bytes, 0)),
        rec.fnv1a64,
        "{name}: memra-synth no longer writes the file llama.cpp decoded"
    );
    let dir = scratch(name);
    let placement = dir.join("placement.toml");
    let text = format!(
        "[model]\ngguf = {model:?}\n\n[[devices]]\nids = [0]\nmemory_gib = 8\n\n[runtime]\nmax_context = 256\nkv_dtype = {:?}\n\n[pipeline]\ndevices = [[0]]\n",
        rec.kv_cache
    );
    std::fs::write(&placement, text).unwrap();
    let compiled = compile(&placement).unwrap_or_else(|e| panic!("{name}: {e}"));
    let plan = dir.join("placement.plan.toml");
    std::fs::write(&plan, compiled.plan.to_toml()).unwrap();
    load(&plan, Some(&model)).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memra-oracle-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Decodes the recording's prompt with `loaded`; returns the worst step error, and the
/// first step whose greedy token differs from llama.cpp's, if any.
fn compare(rec: &Recording, loaded: &LoadedPlan) -> (f64, Option<u32>) {
    let outs = decode_all(loaded, options(Arm::Serial), &rec.prompt, rec.generated)
        .expect("decoding succeeds");
    assert_eq!(outs.len(), rec.steps.len(), "steps decoded");
    let mut worst = 0f64;
    let mut first_wrong = None;
    for (out, step) in outs.iter().zip(&rec.steps) {
        assert_eq!(out.pos, step.pos);
        let scale = step
            .logits
            .iter()
            .fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        let diff = out
            .logits
            .iter()
            .zip(&step.logits)
            .fold(0f64, |m, (&a, &b)| {
                m.max((f64::from(a) - f64::from(b)).abs())
            });
        worst = worst.max(diff / scale);
        if out.token != step.argmax && first_wrong.is_none() {
            first_wrong = Some(step.pos);
        }
    }
    (worst, first_wrong)
}

fn assert_matches(name: &str) {
    let rec = recording(name);
    let loaded = plan_for(&rec, name);
    let (err, wrong) = compare(&rec, &loaded);
    let bound = max_rel_err(&rec.dtype);
    eprintln!(
        "{name}: max relative logit error {err:.3e} over {} steps (bound {bound:e})",
        rec.steps.len()
    );
    assert_eq!(
        wrong, None,
        "{name}: greedy token differs from llama.cpp at this position"
    );
    assert!(
        err <= bound,
        "{name}: max relative logit error {err:e} > {bound:e}"
    );
}

/// Decodes with a deliberately broken plan and requires the oracle to notice.
fn assert_caught(name: &str, what: &str, break_it: impl FnOnce(&mut LoadedPlan)) {
    let rec = recording(name);
    let mut loaded = plan_for(&rec, name);
    break_it(&mut loaded);
    let (err, wrong) = compare(&rec, &loaded);
    eprintln!(
        "{name} with {what}: max relative logit error {err:.3e}, first wrong token {wrong:?}"
    );
    let bound = max_rel_err(&rec.dtype);
    assert!(
        err > bound,
        "{name}: {what} stays within the bound ({err:e})"
    );
}

#[test]
fn qwen3moe_f32_matches_llama_cpp() {
    assert_matches("tiny-qwen3moe-f32");
}

#[test]
fn qwen3moe_f16_matches_llama_cpp() {
    assert_matches("tiny-qwen3moe-f16");
}

#[test]
fn qwen3moe_q8_0_matches_llama_cpp() {
    assert_matches("tiny-qwen3moe-q8_0");
}

#[test]
fn a_wrong_gating_function_is_caught() {
    assert_caught("tiny-qwen3moe-f32", "sigmoid gating", |p| {
        p.plan.model.moe.as_mut().unwrap().gating = Gating::Sigmoid;
    });
}

#[test]
fn unnormalized_expert_weights_are_caught() {
    assert_caught("tiny-qwen3moe-f32", "unnormalized weights", |p| {
        p.plan.model.moe.as_mut().unwrap().norm_weights = false;
    });
}
