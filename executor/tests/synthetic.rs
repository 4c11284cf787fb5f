//! `--weights synthetic`: a plan compiled from the tiny glm5-next `config.json`
//! (`plans/models/tiny-glm5-next.json`, no model file anywhere) runs on seeded weights; its
//! TP-2 and PP-2 plans are bit-identical to the 1-rank plan (every shard is the matching
//! slice of the whole tensor's values), and TP-2 also against the PP-2 plan (a pipeline of
//! whole layers is a reference; a tensor-parallel plan is refused as one); two loads give the
//! same logits; commands that need a tokenizer say why they cannot run.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{options, root};
use memra_executor::cpu::Arm;
use memra_executor::gate::decode_all;
use memra_executor::plan_load::load_synthetic;
use memra_executor::synthetic::BlocksDrawn;
use memra_executor::weights::RankWeights;

/// Compiles the tiny config with `pipeline` (and the devices it needs) into a scratch plan.
fn config_plan(name: &str, devices: &str, pipeline: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memra-synthetic-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = root().join("plans/models/tiny-glm5-next.json");
    let placement = dir.join("placement.toml");
    std::fs::write(
        &placement,
        format!(
            "[model]\nconfig = \"{}\"\nweight_dtype = \"q8_0\"\n\n[[devices]]\nids = {devices}\nmemory_gib = 141\n\n[runtime]\nmax_context = 256\n\n[pipeline]\n{pipeline}\n",
            config.display()
        ),
    )
    .unwrap();
    let compiled =
        memra_compiler::passes::compile(&placement).unwrap_or_else(|e| panic!("{name}: {e}"));
    let plan = dir.join("placement.plan.toml");
    std::fs::write(&plan, compiled.plan.to_toml()).unwrap();
    plan
}

/// The 1-rank plan, compiled for the test `tag` (tests run side by side).
fn one_rank(tag: &str) -> PathBuf {
    config_plan(&format!("one-{tag}"), "[0]", "devices = [[0]]")
}

fn memra_run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

const PROMPT: [u32; 9] = [1, 17, 200, 3, 99, 42, 7, 255, 128];

/// `memra-run gate PLAN --reference REFERENCE` on synthetic weights, 5 prompt tokens and 6
/// generated, one thread.
fn gate(plan: &Path, reference: &Path) -> Output {
    memra_run(&[
        "gate",
        plan.to_str().unwrap(),
        "--reference",
        reference.to_str().unwrap(),
        "--weights",
        "synthetic",
        "--tokens",
        "1,17,200,3,99",
        "-n",
        "6",
        "-t",
        "1",
    ])
}

#[test]
fn a_config_plan_runs_on_synthetic_weights_with_the_same_logits_twice() {
    let plan = one_rank("twice");
    let run = || {
        let loaded = load_synthetic(&plan).unwrap_or_else(|e| panic!("{e:#}"));
        decode_all(&loaded, options(Arm::Serial), &PROMPT, 12).unwrap()
    };
    let (first, second) = (run(), run());
    assert_eq!(first.len(), PROMPT.len() + 11);
    for (a, b) in first.iter().zip(&second) {
        assert!(a.logits.iter().all(|x| x.is_finite()), "step {}", a.step);
        let bits = |o: &[f32]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.logits), bits(&b.logits), "step {}", a.step);
    }
    // the logits carry the weights: not one flat row
    let last = &first.last().unwrap().logits;
    let (lo, hi) = last
        .iter()
        .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
    assert!(hi - lo > 1e-3, "logits span {lo}..{hi}");
}

#[test]
fn bench_runs_a_config_plan_on_synthetic_weights() {
    let plan = one_rank("bench");
    let out = memra_run(&[
        "bench",
        plan.to_str().unwrap(),
        "--weights",
        "synthetic",
        "--prompt",
        "4",
        "-n",
        "4",
        "--reps",
        "1",
        "-t",
        "1",
    ]);
    let text = stdout(&out);
    assert!(
        text.contains("4 tokens x 1 reps") && text.contains("tok/s"),
        "{text}"
    );
}

#[test]
fn tp2_and_pp2_gate_bit_for_bit_on_synthetic_weights() {
    let reference = one_rank("gate");
    for (name, devices, pipeline) in [
        ("tp2", "[0, 1]", "devices = [[0, 1]]"),
        ("pp2", "[0, 1]", "devices = [[0], [1]]"),
    ] {
        let plan = config_plan(name, devices, pipeline);
        let text = stdout(&gate(&plan, &reference));
        assert!(text.contains("gate passed"), "{name}: {text}");
    }
}

#[test]
fn a_pipeline_of_whole_layers_is_a_reference_and_a_tensor_parallel_plan_is_not() {
    // a model too large for one device is gated against its pipeline's eager run
    let pp2 = config_plan("ref-pp2", "[0, 1]", "devices = [[0], [1]]");
    let tp2 = config_plan("ref-tp2", "[0, 1]", "devices = [[0, 1]]");
    let text = stdout(&gate(&tp2, &pp2));
    assert!(text.contains("gate passed"), "{text}");
    let refused = gate(&pp2, &tp2);
    assert!(!refused.status.success());
    let err = String::from_utf8(refused.stderr).unwrap();
    assert!(
        err.contains("splits layers across ranks (rank 0 is one of 2 in a group)")
            && err.contains("pipeline stages without tensor- or expert-parallel groups"),
        "{err}"
    );
}

#[test]
fn shards_left_to_the_device_draw_on_a_host_take_as_the_host_load_does() {
    // the cuda backend loads quantized shards undrawn (`BlocksDrawn::OnDevice`); what it
    // takes on the host instead (embeddings, KDA and indexer matrices, per-head stacks) is
    // drawn then, with the bytes of a load that drew everything at once
    for (name, devices, pipeline) in [
        ("drawn-one", "[0]", "devices = [[0]]"),
        ("drawn-tp2", "[0, 1]", "devices = [[0, 1]]"),
    ] {
        let loaded = load_synthetic(&config_plan(name, devices, pipeline)).unwrap();
        for rank in &loaded.plan.ranks {
            let mut now = RankWeights::load(&loaded, rank, BlocksDrawn::OnHost).unwrap();
            let mut later = RankWeights::load(&loaded, rank, BlocksDrawn::OnDevice).unwrap();
            for shard in &rank.weights {
                let what = format!("{name} rank {} `{}`", rank.rank, shard.tensor);
                match shard.shape.len() {
                    1 => assert_eq!(
                        now.take_vector(&shard.tensor).unwrap(),
                        later.take_vector(&shard.tensor).unwrap(),
                        "{what}"
                    ),
                    2 => {
                        let (a, b) = (
                            now.take_matrix(&shard.tensor).unwrap(),
                            later.take_matrix(&shard.tensor).unwrap(),
                        );
                        assert_eq!(
                            (a.dtype, a.rows, a.cols),
                            (b.dtype, b.rows, b.cols),
                            "{what}"
                        );
                        assert!(a.data == b.data, "{what}: the bytes differ");
                    }
                    _ => {
                        let (a, b) = (
                            now.take_stack(&shard.tensor).unwrap(),
                            later.take_stack(&shard.tensor).unwrap(),
                        );
                        assert_eq!(
                            (a.dtype, a.first, a.count, a.rows, a.cols),
                            (b.dtype, b.first, b.count, b.rows, b.cols),
                            "{what}"
                        );
                        assert!(a.data == b.data, "{what}: the bytes differ");
                    }
                }
            }
            assert!(
                later.remaining().is_empty(),
                "{name}: {:?}",
                later.remaining()
            );
        }
    }
}

#[test]
fn text_commands_and_model_files_are_refused_with_synthetic_weights() {
    let plan = one_rank("refused");
    let plan = plan.to_str().unwrap();
    let err = |args: &[&str]| {
        let out = memra_run(args);
        assert!(!out.status.success(), "{args:?} must fail");
        String::from_utf8(out.stderr).unwrap()
    };
    let generate = err(&["generate", plan, "-p", "hi", "--weights", "synthetic"]);
    assert!(
        generate.contains("runs on synthetic weights (--weights synthetic), which have no model file to read a tokenizer"),
        "{generate}"
    );
    let gate = err(&["gate", plan, "--reference", plan, "--weights", "synthetic"]);
    assert!(gate.contains("gate --tokens"), "{gate}");
    let model = err(&["bench", plan, "--weights", "synthetic", "--model", "x.gguf"]);
    assert!(
        model.contains("--model: synthetic weights read no model file"),
        "{model}"
    );
    let vocab = err(&[
        "gate",
        plan,
        "--reference",
        plan,
        "--weights",
        "synthetic",
        "--tokens",
        "3,256",
    ]);
    assert!(
        vocab.contains("--tokens: token id 256 is not below the vocabulary size 256"),
        "{vocab}"
    );
}
