//! Helpers shared by the end-to-end tests: paths in the repository, the real model (or a
//! clear message telling how to fetch it), and the synthetic tiny-tp model, written on first
//! use.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memra_executor::cpu::{Arm, EngineOptions, ReduceOrder};
use memra_executor::plan_load::{load, LoadedPlan};
use memra_executor::sample::SamplerConfig;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The SmolLM2 plan `name` (e.g. `smollm2-pp2`), loaded; fails with the fetch command when
/// the model is missing.
pub fn smollm2(name: &str) -> LoadedPlan {
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        model.exists(),
        "{} is missing; run scripts/fetch-model.sh",
        model.display()
    );
    load(&root().join(format!("plans/{name}.plan.toml")), None).unwrap()
}

static SYNTH: Mutex<()> = Mutex::new(());

/// Path of the synthetic tiny-tp q8_0 model, written (seed 0) when absent.
pub fn tiny_tp_model() -> PathBuf {
    let path = root().join("models/tiny-tp-q8_0.gguf");
    let _guard = SYNTH.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Written beside and renamed, so a test binary running at the same time never reads a
        // partial file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let shape = memra_gguf::synth::shape("tiny-tp").unwrap();
        memra_gguf::synth::write_model(&shape, memra_gguf::GgmlType::Q8_0, 0, &tmp, false).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// The synthetic plan `plans/synthetic/{name}.plan.toml`, loaded.
pub fn tiny_tp(name: &str) -> LoadedPlan {
    tiny_tp_model();
    load(
        &root().join(format!("plans/synthetic/{name}.plan.toml")),
        None,
    )
    .unwrap()
}

/// Greedy decoding on one kernel thread per engine: tests run side by side on CI's two
/// cores, and spinning pools would fight over them.
pub fn options(arm: Arm) -> EngineOptions {
    EngineOptions {
        backend: memra_executor::engine::Backend::Cpu,
        threads: 1,
        arm,
        sampler: SamplerConfig::GREEDY,
        reduce_order: ReduceOrder::Tree,
        world: None,
    }
}
