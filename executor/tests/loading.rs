//! Loading refuses what it cannot run: a model whose fingerprint differs from the plan's, a
//! truncated model file, another plan format version. Each error says what is wrong.

mod common;

use common::{root, tiny_tp_model};
use memra_executor::plan_load::load;

fn load_err(plan: &std::path::Path, model: Option<&std::path::Path>) -> String {
    format!("{:#}", load(plan, model).expect_err("loading must fail"))
}

fn load_synthetic_err(plan: &std::path::Path) -> String {
    format!(
        "{:#}",
        memra_executor::plan_load::load_synthetic(plan).expect_err("loading must fail")
    )
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memra-loading-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `plan` with each `(from, to)` replaced once, written to a scratch file.
fn edited(plan: &str, name: &str, edits: &[(&str, &str)]) -> std::path::PathBuf {
    let mut text = std::fs::read_to_string(root().join(plan)).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{plan}: {from}");
        text = text.replacen(from, to, 1);
    }
    let path = scratch(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The plan most of these tests edit.
const TINY_TP: &str = "plans/synthetic/tiny-tp.plan.toml";

#[test]
fn a_different_model_is_refused_by_fingerprint() {
    let other = tiny_tp_model();
    let err = load_err(&root().join("plans/smollm2.plan.toml"), Some(&other));
    assert!(
        err.contains("model fingerprint")
            && err.contains("does not match the plan's e3075f9fe5860360"),
        "{err}"
    );
    assert!(err.contains("recompile the placement"), "{err}");
}

#[test]
fn a_truncated_model_is_refused() {
    let bytes = std::fs::read(tiny_tp_model()).unwrap();
    let plan = root().join(TINY_TP);
    for (name, len) in [("header", 200), ("weights", bytes.len() - 1000)] {
        let cut = scratch(&format!("cut-{name}.gguf"));
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let err = load_err(&plan, Some(&cut));
        assert!(err.contains(&cut.display().to_string()), "{name}: {err}");
        assert!(err.contains("loading the model of plan"), "{name}: {err}");
    }
}

#[test]
fn another_plan_format_version_is_refused() {
    let plan = edited(
        TINY_TP,
        "future.plan.toml",
        &[("format_version = 2", "format_version = 99")],
    );
    let err = load_err(&plan, None);
    assert!(
        err.contains("plan format version 99 is not supported; this build reads version 2"),
        "{err}"
    );
}

#[test]
fn a_missing_model_names_the_override() {
    let err = load_err(&root().join(TINY_TP), Some(&scratch("absent.gguf")));
    assert!(
        err.contains("pass --model PATH") && err.contains("absent.gguf"),
        "{err}"
    );
}

#[test]
fn model_facts_edited_by_hand_are_refused_against_the_model_file() {
    // the fingerprint covers the file, not the plan's copy of its facts: a plan whose facts
    // were edited ran with them (wrong text, or a panic for a vocabulary past the table)
    let model = tiny_tp_model();
    for (from, to, want) in [
        (
            "head_dim = 8",
            "head_dim = 4",
            "model.head_dim is 4, the model's is 8",
        ),
        (
            "vocab = 512",
            "vocab = 600",
            "model.vocab is 600, the model's is 512",
        ),
        (
            "rms_eps = 0.00001",
            "rms_eps = 0.1",
            "model.rms_eps is 0.1, the model's is 0.00001",
        ),
        (
            "[model.reduction_chunks]\nattn_out = 8",
            "[model.reduction_chunks]\nattn_out = 4",
            "model.reduction_chunks.attn_out is 4, the model's is 8",
        ),
    ] {
        let plan = edited(TINY_TP, "facts.plan.toml", &[(from, to)]);
        let err = load_err(&plan, Some(&model));
        assert!(
            err.contains(&format!(
                "the plan's model facts differ from {}: {want}; recompile the placement",
                model.display()
            )),
            "{to}: {err}"
        );
    }
}

#[test]
fn settings_the_kernels_cannot_run_are_refused_without_a_model_file() {
    // synthetic weights read no model file to check the facts against; all but the last (a
    // context past the model's) panicked
    for (from, to, want) in [
        (
            "head_dim = 8",
            "head_dim = 0",
            "model.head_dim is 0; it must be at least 1",
        ),
        (
            "[model.reduction_chunks]\nattn_out = 8",
            "[model.reduction_chunks]\nattn_out = 3",
            "model.reduction_chunks.attn_out is 3; allowed: a power of two in 1..=65536",
        ),
        (
            "max_sequences = 1",
            "max_sequences = 0",
            "runtime.max_sequences 0 must be in 1..=4096",
        ),
        (
            "in_flight = 1",
            "in_flight = 0",
            "runtime.in_flight 0 must be in 1..=64",
        ),
        (
            "max_context = 256",
            "max_context = 1024",
            "runtime.max_context 1024 must be in 1..=512 (the model's context_length)",
        ),
    ] {
        let plan = edited(TINY_TP, "settings.plan.toml", &[(from, to)]);
        let err = load_synthetic_err(&plan);
        assert!(err.contains(want), "{to}: {err}");
    }
}

#[test]
fn a_directory_given_as_the_model_is_named_as_one() {
    // mapping a directory said "No such device (os error 19)"
    let dir = std::env::temp_dir();
    let err = load_err(&root().join(TINY_TP), Some(&dir));
    assert!(
        err.contains(&format!(
            "{}: is a directory; a GGUF model file is expected",
            dir.display()
        )),
        "{err}"
    );
}

#[test]
fn llama3_rope_scaling_is_refused_by_the_executors() {
    // a Llama 3.1 config.json plans (plans/llama3.1-70b-*), but no executor implements its
    // rope scaling: running it with plain rope gave wrong numbers
    let err = load_synthetic_err(&root().join("plans/llama3.1-70b-tp8.plan.toml"));
    assert!(
        err.contains("model.rope_llama3: rope_scaling llama3 (Llama 3.1's rope scaling) is not implemented by the executors"),
        "{err}"
    );
}

#[test]
fn every_committed_plan_loads_and_matches_its_placement() {
    // the loader recompiles each plan from the placement it records: what the compiler wrote
    // must come out the same, with the model file where it is here and with synthetic weights
    let mut plans = Vec::new();
    for dir in ["plans", "plans/synthetic"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.to_string_lossy().ends_with(".plan.toml") {
                plans.push(path);
            }
        }
    }
    plans.sort();
    assert!(plans.len() >= 50, "{}", plans.len());
    tiny_tp_model();
    for plan in &plans {
        let text = std::fs::read_to_string(plan).unwrap();
        let parsed = memra_compiler::plan::Plan::from_toml(&text).unwrap();
        let loaded = memra_executor::plan_load::load_synthetic(plan);
        if parsed.model.rope_llama3.is_some() {
            // planning only (compiler/tests/verify.rs recompiles it): no executor runs it
            let e = format!(
                "{:#}",
                loaded.expect_err("a llama3-rope plan must be refused")
            );
            assert!(e.contains("model.rope_llama3"), "{}: {e}", plan.display());
            continue;
        }
        if let Err(e) = loaded {
            panic!("{}: {e:#}", plan.display());
        }
        let model = memra_executor::plan_load::default_model_path(plan, &parsed);
        if model.extension().is_some_and(|e| e == "gguf") && model.exists() {
            if let Err(e) = load(plan, None) {
                panic!("{}: {e:#}", plan.display());
            }
        }
    }
}

/// Edits of a rank's program, its group or its bytes: each ran wrong or panicked before the
/// loader compared the plan with what its placement compiles to.
#[test]
fn programs_edited_by_hand_are_refused_by_field() {
    let model = tiny_tp_model();
    let run = r#"{ step = "run", id = "r0.run0", stream = "compute", phases = 1, ops = ["embed", "layers 0..2: attn_pre attn_core attn_out ffn", "head", "sample"] }"#;
    for (what, edits, want) in [
        (
            // panicked in a matmul's assert
            "segments reordered",
            vec![("layers 0..2: attn_pre attn_core attn_out ffn", "layers 0..2: attn_pre attn_out attn_core ffn")],
            r#"rank 0 program step 1 (r0.run0) ops[1] is "layers 0..2: attn_pre attn_out attn_core ffn"; its placement compiles to "layers 0..2: attn_pre attn_core attn_out ffn""#,
        ),
        (
            // skipped a layer silently
            "a layer dropped",
            vec![("layers 0..2: attn_pre", "layers 0..1: attn_pre")],
            r#"rank 0 program step 1 (r0.run0) ops[1] is "layers 0..1: attn_pre attn_core attn_out ffn"; its placement compiles to "layers 0..2: attn_pre attn_core attn_out ffn""#,
        ),
        (
            // generated one token and stopped
            "sample before head",
            vec![(r#""head", "sample"]"#, r#""sample", "head"]"#)],
            r#"rank 0 program step 1 (r0.run0) ops[2] is "sample"; its placement compiles to "head""#,
        ),
        (
            // gave garbage text
            "a tensor-parallel degree without a group",
            vec![("tp_degree = 1", "tp_degree = 2")],
            "rank 0 tp_degree is 2; its placement compiles to 1",
        ),
        (
            "phases changed",
            vec![(run, &run.replace("phases = 1", "phases = 2"))],
            "rank 0 program step 1 (r0.run0) phases is 2; its placement compiles to 1",
        ),
        (
            "buffer bytes changed",
            vec![(
                r#"{ name = "r0.scores", kind = "scratch", bytes = 32768"#,
                r#"{ name = "r0.scores", kind = "scratch", bytes = 16384"#,
            )],
            "rank 0 buffer `r0.scores` bytes is 16384; its placement compiles to 32768",
        ),
        (
            "device bytes changed",
            vec![("kv_bytes = 131072\n", "kv_bytes = 65536\n")],
            "device 0 kv_bytes is 65536; its placement compiles to 131072",
        ),
        (
            "a rank on an undeclared device",
            vec![("device = 0\ntp_index", "device = 1\ntp_index")],
            "rank 0 device is 1, which [[devices]] does not list; listed: 0",
        ),
        (
            "a rank's layers cut short",
            vec![("layers = \"0..2\"", "layers = \"0..1\"")],
            "rank 0 layers is 0..1; the last stage must end at layer 2 (model.layers is 2): every layer of the model runs exactly once",
        ),
    ] {
        let plan = edited(TINY_TP, "program.plan.toml", &edits);
        for err in [load_err(&plan, Some(&model)), load_synthetic_err(&plan)] {
            assert!(err.contains(&plan.display().to_string()), "{what}: {err}");
            assert!(err.contains(want), "{what}: {err}");
            assert!(err.contains("recompile the placement"), "{what}: {err}");
        }
    }
}

#[test]
fn a_pipeline_runs_every_layer_once() {
    // stage 1 of tiny-tp-pp2 starts where stage 0 ends
    let plan = edited(
        "plans/synthetic/tiny-tp-pp2.plan.toml",
        "pp2.plan.toml",
        &[("layers = \"1..2\"", "layers = \"0..2\"")],
    );
    let err = load_synthetic_err(&plan);
    assert!(
        err.contains("rank 1 layers is 0..2; stage 1 must start at layer 1, where stage 0 ends"),
        "{err}"
    );
}

#[test]
fn synthetic_weights_refuse_facts_their_shards_contradict() {
    // no model file to check the facts against: the shards' shapes are the model; these ran
    // silently (heads, ffn) or panicked in weights.rs (vocab past the embedding table)
    for (from, to, want) in [
        (
            "heads = 32\n",
            "heads = 16\n",
            "weights: `blk.*.attn_q.weight` has shape [256, 256]; the [model] facts give [128, 256] (2 layers)",
        ),
        (
            "ffn = 512\n",
            "ffn = 1024\n",
            "weights: `blk.*.ffn_down.weight` has shape [256, 512]; the [model] facts give [256, 1024] (2 layers)",
        ),
        (
            "vocab = 512\n",
            "vocab = 60000\n",
            "weights: `output.weight` has shape [512, 256]; the [model] facts give [60000, 256]",
        ),
        (
            "layers = 2\n",
            "layers = 3\n",
            "model.layers is 3, but the ranks' weights hold layers 0..2",
        ),
    ] {
        let plan = edited(
            TINY_TP,
            "facts.plan.toml",
            &[(from, to)],
        );
        let err = load_synthetic_err(&plan);
        assert!(err.contains(&plan.display().to_string()), "{to}: {err}");
        assert!(
            err.contains("the plan's model facts and weights disagree"),
            "{to}: {err}"
        );
        assert!(err.contains(want), "{to}: {err}");
    }
}
