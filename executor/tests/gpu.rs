//! End-to-end tests of the CUDA backend on device 0 (feature `gpu-tests`; plain `cargo test`
//! builds nothing here): tiny-tp placements written to a scratch directory and compiled, each
//! gated bit for bit against the 1-rank eager CUDA run, the CUDA run against the CPU backend
//! within a relative logit tolerance, and batched plans (several sequence slots: tiny-tp on
//! one device, PP-2, TP-2, PP-2 x TP-2; tiny-qwen3moe, tiny-deepseek2, tiny-kimi-linear and
//! tiny-glm5-next on one device, PP-2, TP-2, EP-2) whose sequences decoded together must have,
//! bit for bit, the logits of each decoded alone (by the one-sequence decode kernels, and by
//! the batched plan itself), a KDA and a DSA plan's second sequence in one session, which must
//! start from a fresh state, and speculative plans (tiny-tp, tiny-deepseek2, tiny-kimi-linear
//! and tiny-glm5-next on one device, PP-2, TP-2; tiny-qwen3moe on one device, PP-2, EP-2; both
//! arms) whose greedy tokens and every generated token's logits are the plain plan's, bit for
//! bit, with drafts accepted and rejected. Run with
//! `cargo test --release -p memra-executor --features gpu-tests --test gpu`.
#![cfg(feature = "gpu-tests")]

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_same, decode_turns, garbled, options, tiny_deepseek2_model, tiny_glm5_next_model,
    tiny_kimi_linear_model, tiny_qwen3moe_model, tiny_tp_model,
};
use memra_executor::batch_gate::{batch_gate, sequences};
use memra_executor::cpu::Arm;
use memra_executor::engine::{open, Backend, EngineOptions, StepOutput};
use memra_executor::gate::{decode_all, first_mismatch, gate};
use memra_executor::plan_load::{load, LoadedPlan};
use memra_executor::session::{Flow, Session};
use memra_executor::speculate::Drafts;

const PROMPT: [u32; 5] = [1, 17, 200, 33, 401];
const GENERATED: usize = 12;
/// Expert parallelism 2 on device 0: attention replicated, the experts split.
const EP2: &str = "devices = [[0, 0]]\n\n[parallel]\nattention = \"replicated\"";

fn cuda() -> EngineOptions {
    EngineOptions {
        backend: Backend::Cuda,
        ..options(Arm::Serial)
    }
}

/// Compiles a tiny-tp placement with `pipeline` (and `extra` tables) on device 0.
fn plan(dir: &Path, name: &str, pipeline: &str, extra: &str) -> LoadedPlan {
    plan_of(&tiny_tp_model(), dir, name, pipeline, extra)
}

/// Compiles a placement of `model` with `pipeline` (and `extra` tables) on device 0.
fn plan_of(model: &Path, dir: &Path, name: &str, pipeline: &str, extra: &str) -> LoadedPlan {
    let placement = dir.join(format!("{name}.toml"));
    let text = format!(
        "[model]\ngguf = \"{}\"\n\n[[devices]]\nids = [0]\nmemory_gib = 141\n\n[runtime]\nmax_context = 256\nin_flight = 3\n{extra}\n[pipeline]\n{pipeline}\n",
        model.display()
    );
    std::fs::write(&placement, text).unwrap();
    let compiled =
        memra_compiler::passes::compile(&placement).unwrap_or_else(|e| panic!("{name}: {e}"));
    let out = dir.join(format!("{name}.plan.toml"));
    std::fs::write(&out, compiled.plan.to_toml()).unwrap();
    load(&out, Some(model)).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memra-gpu-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn every_plan_on_one_device_matches_the_eager_run_bit_for_bit() {
    let dir = scratch("gates");
    let reference = plan(
        &dir,
        "eager",
        "devices = [[0]]",
        "\n[capture]\nmode = \"eager\"\n",
    );
    for (name, pipeline) in [
        ("graphs", "devices = [[0]]"),
        ("pp2", "devices = [[0], [0]]"),
        ("tp2", "devices = [[0, 0]]"),
        ("tp4", "devices = [[0, 0, 0, 0]]"),
        ("pp2-tp2", "devices = [[0, 0], [0, 0]]"),
    ] {
        let candidate = plan(&dir, name, pipeline, "");
        let report = gate(&reference, &candidate, &PROMPT, GENERATED, cuda()).unwrap();
        assert_eq!(report.arms, vec![Arm::Serial, Arm::Pipelined], "{name}");
        assert!(
            report.mismatch.is_none(),
            "{name}: {}",
            report.mismatch.unwrap()
        );
    }
}

#[test]
fn cuda_agrees_with_the_cpu_backend() {
    let dir = scratch("cpu");
    let loaded = plan(&dir, "graphs", "devices = [[0]]", "");
    let want = decode_all(&loaded, options(Arm::Serial), &PROMPT, GENERATED).unwrap();
    let got = decode_all(&loaded, cuda(), &PROMPT, GENERATED).unwrap();
    assert_eq!(want.len(), got.len());
    for (a, b) in want.iter().zip(&got) {
        assert_eq!(a.token, b.token, "step {}", a.step);
        let scale = a.logits.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = a
            .logits
            .iter()
            .zip(&b.logits)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            err <= 1e-3 * scale,
            "step {}: error {err} of scale {scale}",
            a.step
        );
    }
}

#[test]
fn sequences_decoded_together_on_cuda_equal_their_one_sequence_decode() {
    let dir = scratch("batch");
    for (model, placements) in [
        (
            tiny_tp_model(),
            &[
                ("batch", "devices = [[0]]"),
                ("batch-pp2", "devices = [[0], [0]]"),
                ("batch-tp2", "devices = [[0, 0]]"),
                ("batch-pp2-tp2", "devices = [[0, 0], [0, 0]]"),
            ][..],
        ),
        (
            tiny_qwen3moe_model(),
            &[
                ("moe-batch", "devices = [[0]]"),
                ("moe-batch-pp2", "devices = [[0], [0]]"),
                ("moe-batch-tp2", "devices = [[0, 0]]"),
                ("moe-batch-ep2", EP2),
            ][..],
        ),
        (
            tiny_deepseek2_model(),
            &[
                ("mla-batch", "devices = [[0]]"),
                ("mla-batch-pp2", "devices = [[0], [0]]"),
                ("mla-batch-tp2", "devices = [[0, 0]]"),
                ("mla-batch-ep2", EP2),
            ][..],
        ),
        (
            tiny_kimi_linear_model(),
            &[
                ("kda-batch", "devices = [[0]]"),
                ("kda-batch-pp2", "devices = [[0], [0]]"),
                ("kda-batch-tp2", "devices = [[0, 0]]"),
                ("kda-batch-ep2", EP2),
            ][..],
        ),
        (
            tiny_glm5_next_model(),
            &[
                ("dsa-batch", "devices = [[0]]"),
                ("dsa-batch-pp2", "devices = [[0], [0]]"),
                ("dsa-batch-tp2", "devices = [[0, 0]]"),
                ("dsa-batch-ep2", EP2),
            ][..],
        ),
    ] {
        // the reference decodes one sequence with the decode kernels only (prompts token by
        // token, graphs): a batched row must have exactly those bits
        let one = format!("{}-one", placements[0].0);
        let reference = plan_of(&model, &dir, &one, "devices = [[0]]", "prefill_chunk = 1\n");
        let batch = "max_sequences = 4\nprefill_chunk = 6\n";
        for &(name, pipeline) in placements {
            let batched = plan_of(&model, &dir, name, pipeline, batch);
            let vocab = batched.plan.model.vocab;
            let arms = [Arm::Serial, Arm::Pipelined];
            for against in [&reference, &batched] {
                let report =
                    batch_gate(against, &batched, &sequences(vocab, 4, 0), cuda(), &arms).unwrap();
                assert!(
                    report.widest.iter().all(|&w| w >= 4),
                    "{name}: at most {:?} sequences together",
                    report.widest
                );
                assert!(
                    report.mismatch.is_none(),
                    "{name} against {}: {}",
                    against.path.display(),
                    report.mismatch.unwrap()
                );
            }
        }
    }
}

#[test]
fn a_second_sequence_on_a_kda_or_dsa_plan_starts_from_a_fresh_state() {
    // the KDA state and convolution windows, and the DSA indexer's keys and pools, live on the
    // device across steps: a sequence started again at position 0 in the same session
    // (bench's repetitions, a chat whose history was cut) must decode with the bits of the
    // first, not from what it left. The tiny models' vocabulary is 256 tokens.
    const PROMPT: [u32; 5] = [1, 17, 200, 33, 101];
    let dir = scratch("recurrent");
    for (name, model) in [
        ("kimi", tiny_kimi_linear_model()),
        ("glm5", tiny_glm5_next_model()),
    ] {
        let loaded = plan_of(&model, &dir, name, "devices = [[0]]", "");
        let runtime = &loaded.plan.runtime;
        let engine = open(&loaded, cuda()).unwrap();
        let mut session = Session::new(engine, runtime.in_flight, runtime.max_context);
        let run = |session: &mut Session| {
            let mut outs: Vec<StepOutput> = Vec::new();
            session
                .run(&PROMPT, GENERATED, 0, |out, _| {
                    outs.push(out.clone());
                    Ok(Flow::Continue)
                })
                .unwrap();
            outs
        };
        let first = run(&mut session);
        assert!(
            first.iter().all(|o| o.logits.iter().all(|v| v.is_finite())),
            "{name}: a logit of the first sequence is not finite"
        );
        session.reset();
        let again = run(&mut session);
        let mismatch = first_mismatch(Arm::Serial, &first, &again);
        assert!(
            mismatch.is_none(),
            "{name}: the second sequence differs: {}",
            mismatch.unwrap()
        );
        // a new sequence sharing only part of the history (reused where the plan rewinds)
        let mut tokens = PROMPT[..3].to_vec();
        tokens.push(99);
        let continued = |session: &mut Session| {
            let mut outs: Vec<StepOutput> = Vec::new();
            session
                .continue_with(&tokens, 1, |out, _| {
                    outs.push(out.clone());
                    Ok(Flow::Continue)
                })
                .unwrap();
            outs
        };
        let shared = continued(&mut session);
        // the same call on a session that never held anything (the same rows scored, so the
        // same prefill path)
        let engine = open(&loaded, cuda()).unwrap();
        let fresh = continued(&mut Session::new(
            engine,
            runtime.in_flight,
            runtime.max_context,
        ));
        let mismatch = first_mismatch(Arm::Serial, &fresh, &shared);
        assert!(
            mismatch.is_none(),
            "{name}: a continued sequence over a cut history differs from a fresh one: {}",
            mismatch.unwrap()
        );
    }
}

#[test]
fn speculative_plans_on_cuda_generate_plain_decodings_tokens_and_logits() {
    // the verify step runs the batched decode kernels, so each of its rows has the bits of
    // the one-row decode step the plain plan takes at that position; the prompt is prefill
    // in both
    let dir = scratch("speculation");
    let section = "\n[speculative]\ndraft = \"lookup\"\ntokens = 3\n";
    let prompt: Vec<u32> = vec![5, 9, 200, 31, 7, 5, 9];
    let turns = [prompt.clone(), vec![12, 5]];
    let n = 14;
    for (model, placements) in [
        (
            tiny_tp_model(),
            &[
                ("spec", "devices = [[0]]"),
                ("spec-pp2", "devices = [[0], [0]]"),
                ("spec-tp2", "devices = [[0, 0]]"),
            ][..],
        ),
        (
            tiny_qwen3moe_model(),
            &[
                ("moe-spec", "devices = [[0]]"),
                ("moe-spec-pp2", "devices = [[0], [0]]"),
                ("moe-spec-ep2", EP2),
            ][..],
        ),
        (
            tiny_deepseek2_model(),
            &[
                ("mla-spec", "devices = [[0]]"),
                ("mla-spec-pp2", "devices = [[0], [0]]"),
                ("mla-spec-tp2", "devices = [[0, 0]]"),
            ][..],
        ),
        (
            tiny_kimi_linear_model(),
            &[
                ("kda-spec", "devices = [[0]]"),
                ("kda-spec-pp2", "devices = [[0], [0]]"),
                ("kda-spec-tp2", "devices = [[0, 0]]"),
            ][..],
        ),
        (
            tiny_glm5_next_model(),
            &[
                ("dsa-spec", "devices = [[0]]"),
                ("dsa-spec-pp2", "devices = [[0], [0]]"),
                ("dsa-spec-tp2", "devices = [[0, 0]]"),
            ][..],
        ),
    ] {
        let plain_name = format!("{}-plain", placements[0].0);
        let plain = plan_of(&model, &dir, &plain_name, "devices = [[0]]", "");
        let want = decode_turns(&plain, cuda(), &turns, n, None);
        let sequence = [&prompt[..], &want.0[..n], &turns[1], &want.0[n..]].concat();
        let vocab = plain.plan.model.vocab;
        let replay = Drafts::Replay {
            tokens: garbled(&sequence, prompt.len() + 3, vocab),
            cut: 3,
        };
        for &(name, pipeline) in placements {
            let spec = plan_of(&model, &dir, name, pipeline, section);
            for arm in [Arm::Serial, Arm::Pipelined] {
                let options = EngineOptions { arm, ..cuda() };
                for drafts in [replay.clone(), Drafts::Lookup] {
                    let (tokens, logits, tally) =
                        decode_turns(&spec, options, &turns, n, Some(drafts.clone()));
                    let label = format!("{name} {arm:?} {drafts:?}");
                    assert_same(&label, &(want.0.clone(), want.1.clone()), &(tokens, logits));
                    let t = tally.unwrap();
                    if matches!(drafts, Drafts::Replay { .. }) {
                        assert!(
                            t.accepted > 0 && t.accepted < t.drafted,
                            "{label}: drafts accepted and rejected both: {t:?}"
                        );
                    }
                }
            }
        }
    }
}
