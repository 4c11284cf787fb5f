//! Golden tests: every placement in `plans/` compiles to its committed `.plan.toml` byte for
//! byte, every placement in `plans/err/` fails with exactly its committed `.err` text.
//! `UPDATE_GOLDEN=1 cargo test -p memra-compiler --test golden` rewrites them; review the
//! change with `git diff plans/`.

use memra_compiler::passes::compile;
use memra_compiler::plan::Plan;
use memra_compiler::review::semantic_diff;
use memra_compiler::textdiff::unified;
use std::path::{Path, PathBuf};
use std::process::Command;

const BLESS: &str =
    "UPDATE_GOLDEN=1 cargo test -p memra-compiler --test golden (or: memra-compile plans/NAME.toml)";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Placement files (not compiled plans) in a directory, sorted.
fn placements(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".toml") && !name.ends_with(".plan.toml")
        })
        .collect();
    out.sort();
    out
}

/// Compare `actual` with the golden file, or rewrite it when blessing; returns a failure text.
fn check_golden(golden: &Path, actual: &str) -> Option<String> {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(golden, actual).unwrap();
        return None;
    }
    let expected = std::fs::read_to_string(golden).unwrap_or_default();
    let name = golden.display().to_string();
    let diff = unified(&name, &format!("{name} (now)"), &expected, actual, 3);
    (!diff.is_empty()).then(|| format!("{diff}accept with: {BLESS}\n"))
}

fn needs_model(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .unwrap()
        .contains("gguf = \"../models/")
}

#[test]
fn plans_compile_to_their_golden_text() {
    let root = root();
    let mut failures = Vec::new();
    for placement in placements(&root.join("plans")) {
        if needs_model(&placement) {
            let model = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
            assert!(
                model.exists()
                    || !std::fs::read_to_string(&placement)
                        .unwrap()
                        .contains("SmolLM2"),
                "{} is missing; run scripts/fetch-model.sh",
                model.display()
            );
        }
        let compiled = match compile(&placement) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{}: does not compile:\n{e}", placement.display()));
                continue;
            }
        };
        let stem = placement.file_stem().unwrap().to_string_lossy().to_string();
        let golden = placement.with_file_name(format!("{stem}.plan.toml"));
        if let Some(failure) = check_golden(&golden, &compiled.plan.to_toml()) {
            // Lead with the semantic diff: what moved, split or appeared.
            let committed = std::fs::read_to_string(&golden).unwrap_or_default();
            let semantic = Plan::from_toml(&committed)
                .map(|old| semantic_diff(&old, &compiled.plan))
                .unwrap_or_else(|e| format!("the committed plan does not parse: {e}\n"));
            failures.push(format!(
                "{} is stale\n{semantic}{failure}",
                golden.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bad_placements_fail_with_their_golden_errors() {
    let root = root();
    let err_dir = root.join("plans/err");
    let cases = placements(&err_dir);
    assert!(cases.len() >= 20, "plans/err holds {} cases", cases.len());
    let mut failures = Vec::new();
    for placement in cases {
        let rel = placement.strip_prefix(&root).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_memra-compile"))
            .current_dir(&root)
            .arg(rel)
            .arg("--output")
            .arg(std::env::temp_dir().join("memra-golden-should-not-exist.plan.toml"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        if out.status.code() != Some(1) {
            failures.push(format!(
                "{}: exit status {:?}, expected 1; stderr:\n{stderr}",
                rel.display(),
                out.status.code()
            ));
            continue;
        }
        let golden = placement.with_extension("err");
        failures.extend(check_golden(&golden, &stderr));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_stale_plan_fails_check_with_a_diff_and_the_update_command() {
    let root = root();
    let dir = std::env::temp_dir().join(format!("memra-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let placement = dir.join("pp4.toml");
    let source = std::fs::read_to_string(root.join("plans/llama3-8b-pp4.toml"))
        .unwrap()
        .replace(
            "models/llama-3-8b.json",
            &root
                .join("plans/models/llama-3-8b.json")
                .display()
                .to_string(),
        );
    std::fs::write(&placement, &source).unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_memra-compile"))
            .args(args)
            .arg(&placement)
            .output()
            .unwrap()
    };
    assert!(run(&["-q"]).status.success());
    assert!(run(&["--check"]).status.success());
    // Move one cut by one layer: the committed plan is now stale.
    std::fs::write(
        &placement,
        source.replace("[pipeline]", "[pipeline]\ncuts = [9, 16, 24]"),
    )
    .unwrap();
    let out = run(&["--check"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is stale"), "{stderr}");
    assert!(
        stderr.contains(
            "layers:\n  layer 8 moved: rank 1 (stage 1, device 1) -> rank 0 (stage 0, device 0)"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("-layers = \"0..8\"") && stderr.contains("+layers = \"0..9\""),
        "{stderr}"
    );
    assert!(stderr.contains("update it with: memra-compile"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
