//! Loading refuses what it cannot run: a model whose fingerprint differs from the plan's, a
//! truncated model file, another plan format version. Each error says what is wrong.

mod common;

use common::{root, tiny_tp_model};
use memra_executor::plan_load::load;

fn load_err(plan: &std::path::Path, model: Option<&std::path::Path>) -> String {
    format!("{:#}", load(plan, model).expect_err("loading must fail"))
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memra-loading-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

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
    let plan = root().join("plans/synthetic/tiny-tp.plan.toml");
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
    let text = std::fs::read_to_string(root().join("plans/synthetic/tiny-tp.plan.toml")).unwrap();
    let plan = scratch("future.plan.toml");
    std::fs::write(
        &plan,
        text.replacen("format_version = 2", "format_version = 99", 1),
    )
    .unwrap();
    let err = load_err(&plan, None);
    assert!(
        err.contains("plan format version 99 is not supported; this build reads version 2"),
        "{err}"
    );
}

#[test]
fn a_missing_model_names_the_override() {
    let err = load_err(
        &root().join("plans/synthetic/tiny-tp.plan.toml"),
        Some(&scratch("absent.gguf")),
    );
    assert!(
        err.contains("pass --model PATH") && err.contains("absent.gguf"),
        "{err}"
    );
}

/// `plans/synthetic/tiny-tp.plan.toml` with `from` replaced by `to`, written to a scratch file.
fn edited_tiny_tp(name: &str, from: &str, to: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(root().join("plans/synthetic/tiny-tp.plan.toml")).unwrap();
    assert!(text.contains(from), "{from}");
    let plan = scratch(name);
    std::fs::write(&plan, text.replacen(from, to, 1)).unwrap();
    plan
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
        let plan = edited_tiny_tp("facts.plan.toml", from, to);
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
    // synthetic weights read no model file to check the facts against; these panicked
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
    ] {
        let plan = edited_tiny_tp("settings.plan.toml", from, to);
        let err = format!(
            "{:#}",
            memra_executor::plan_load::load_synthetic(&plan).expect_err("loading must fail")
        );
        assert!(err.contains(want), "{to}: {err}");
    }
}

#[test]
fn a_directory_given_as_the_model_is_named_as_one() {
    // mapping a directory said "No such device (os error 19)"
    let dir = std::env::temp_dir();
    let err = load_err(
        &root().join("plans/synthetic/tiny-tp.plan.toml"),
        Some(&dir),
    );
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
    let err = format!(
        "{:#}",
        memra_executor::plan_load::load_synthetic(&root().join("plans/llama3.1-70b-tp8.plan.toml"))
            .expect_err("loading must fail")
    );
    assert!(
        err.contains("model.rope_llama3: rope_scaling llama3 (Llama 3.1's rope scaling) is not implemented by the executors"),
        "{err}"
    );
}
