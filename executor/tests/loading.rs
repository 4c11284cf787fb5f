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
