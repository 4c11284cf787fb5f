//! Loading an execution plan for running: parse it (refusing other format versions), verify it
//! with the compiler's own happens-before and ownership checks, open the model it names and
//! refuse a model whose header fingerprint differs from the one the plan was compiled for, or
//! whose facts differ from the plan's; or, for synthetic weights, open no model at all and
//! check the plan's facts against its own weight shards. Either way the plan is then compiled
//! again from the placement it records and refused where it differs (a plan edited by hand).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};
use memra_compiler::model::{fnv1a, gguf_meta, model_of_plan, ModelMeta};
use memra_compiler::passes::emit::model_summary;
use memra_compiler::passes::recompile::{recompile_differences, value_differences};
use memra_compiler::passes::verify::verify_plan;
use memra_compiler::plan::Plan;
use memra_gguf::output::escaped;
use memra_gguf::progress::{Progress, Unit};
use memra_gguf::GgufFile;

/// Architectures whose decode the CPU executor implements.
const RUNNABLE_ARCHITECTURES: [&str; 7] = [
    "llama",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "deepseek2",
    "kimi-linear",
    "glm5-next",
];

/// Where a plan's weights come from.
#[derive(Debug)]
pub enum Weights {
    /// The model file the plan was compiled for (weights are mapped, not read).
    File(GgufFile),
    /// Seeded values drawn from the plan alone (`crate::synthetic`); there is no model file,
    /// so no tokenizer either.
    Synthetic,
}

/// A verified plan and where its weights come from.
#[derive(Debug)]
pub struct LoadedPlan {
    /// The plan as parsed.
    pub plan: Plan,
    /// Where the plan was read from.
    pub path: PathBuf,
    /// The model file, or synthetic weights.
    pub weights: Weights,
    /// The weight load under way, shared by the ranks of one engine.
    weights_load: Mutex<WeightsLoad>,
}

/// Which ranks an engine loads and the report of their load.
#[derive(Debug)]
struct WeightsLoad {
    ranks: Vec<u32>,
    progress: Option<Progress>,
}

impl LoadedPlan {
    /// The model file; an error with synthetic weights, which have none (and so no tokenizer
    /// or chat template).
    pub fn gguf(&self) -> Result<&GgufFile> {
        match &self.weights {
            Weights::File(gguf) => Ok(gguf),
            Weights::Synthetic => bail!(
                "{}: runs on synthetic weights (--weights synthetic), which have no model file to read a tokenizer or chat template from; give token ids instead (bench, gate --tokens)",
                self.path.display()
            ),
        }
    }

    /// The progress of loading the weights of one engine's ranks. Engines load their ranks in
    /// plan order, so the first of them starts a new report: each engine opened on this plan
    /// (gate opens several) reports its own load.
    pub(crate) fn weights_progress(&self, rank: u32) -> Progress {
        let mut load = self
            .weights_load
            .lock()
            .expect("invariant: no rank panics while holding the progress");
        if load.progress.is_none() || load.ranks.first() == Some(&rank) {
            let bytes = self
                .plan
                .ranks
                .iter()
                .filter(|r| load.ranks.contains(&r.rank))
                .flat_map(|r| &r.weights);
            load.progress = Some(Progress::new(
                "loading weights",
                bytes.map(|w| w.bytes).sum(),
                Unit::Bytes,
            ));
        }
        load.progress.clone().expect("invariant: set above")
    }

    /// Engines load `ranks` from now on (all of the plan's by default; with one process per
    /// device, this process's).
    pub(crate) fn load_ranks(&self, ranks: &[u32]) {
        let mut load = self
            .weights_load
            .lock()
            .expect("invariant: no rank panics while holding the progress");
        load.ranks = ranks.to_vec();
    }
}

/// The model file a plan names: its `model.source`, relative to the plan's directory.
pub fn default_model_path(plan_path: &Path, plan: &Plan) -> PathBuf {
    let dir = plan_path.parent().unwrap_or(Path::new("."));
    dir.join(&plan.model.source)
}

/// The fingerprint the compiler writes for a GGUF file: FNV-1a 64 of its header.
pub fn fingerprint(gguf: &GgufFile) -> String {
    format!("{:016x}", fnv1a(gguf.header_bytes(), 0))
}

/// Reads and verifies the plan at `plan_path` and opens its model (`model` overrides the
/// path the plan names).
pub fn load(plan_path: &Path, model: Option<&Path>) -> Result<LoadedPlan> {
    let plan = read_verified(plan_path)?;
    let model_path = model.map_or_else(|| default_model_path(plan_path, &plan), Path::to_path_buf);
    let gguf = GgufFile::open(&model_path).map_err(|e| {
        if is_json(&model_path) {
            return anyhow!(
                "{}: its model {} is a config.json, which holds no weights; run the plan with --weights synthetic (seeded weights of the plan's shapes, no tokenizer: bench, gate --tokens), or compile a placement whose [model] gguf names a GGUF file",
                plan_path.display(),
                model_path.display()
            );
        }
        e.context(format!(
            "loading the model of plan {} (pass --model PATH to use another file)",
            plan_path.display()
        ))
    })?;
    let found = fingerprint(&gguf);
    if found != plan.model.fingerprint {
        bail!(
            "{}: model fingerprint {found} does not match the plan's {} ({}); recompile the placement for this model file",
            model_path.display(),
            plan.model.fingerprint,
            plan_path.display()
        );
    }
    let meta = check_model_facts(&plan, plan_path, &gguf, &model_path)?;
    check_program(&plan, plan_path, meta)?;
    Ok(loaded(plan, plan_path, Weights::File(gguf)))
}

/// Whether the file at `path` starts like JSON (a `{` after any blank space): a model's
/// config.json where a GGUF was expected.
fn is_json(path: &Path) -> bool {
    let mut head = [0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    head[..n].trim_ascii_start().starts_with(b"{")
}

/// Refuses a plan whose `[model]` facts differ from what the compiler reads from the model
/// file (a plan edited by hand: the fingerprint covers the file, not the plan's copy of it);
/// returns what it read.
fn check_model_facts(
    plan: &Plan,
    plan_path: &Path,
    gguf: &GgufFile,
    model_path: &Path,
) -> Result<ModelMeta> {
    let meta = gguf_meta(gguf, model_path)
        .with_context(|| format!("reading the model facts of plan {}", plan_path.display()))?;
    let want = serde_json::to_value(model_summary(&meta, &plan.model.source))?;
    let got = serde_json::to_value(&plan.model)?;
    let differ = value_differences("model", &want, &got, ", the model's is");
    if !differ.is_empty() {
        bail!(
            "{}: the plan's model facts differ from {}: {}; recompile the placement for this model file",
            plan_path.display(),
            model_path.display(),
            differ.join(", ")
        );
    }
    Ok(meta)
}

/// Refuses a plan whose programs, ranks, groups, boundaries or bytes differ from what its own
/// placement compiles to for `model` (a plan edited by hand: reordered segments, a layer range
/// cut short, head and sample swapped, a tensor-parallel degree without its group, phases or
/// bytes changed), naming each field and what the compiler derives for it.
fn check_program(plan: &Plan, plan_path: &Path, model: ModelMeta) -> Result<()> {
    let differ = recompile_differences(plan, plan_path, model);
    if !differ.is_empty() {
        bail!(
            "{}: the plan differs from what its own placement compiles to (edited by hand?):\n  {}\nrecompile the placement with memra-compile",
            plan_path.display(),
            differ.join("\n  ")
        );
    }
    Ok(())
}

/// Reads and verifies the plan at `plan_path` to run on synthetic weights: no model file is
/// opened, so a plan compiled from a `config.json` runs too.
pub fn load_synthetic(plan_path: &Path) -> Result<LoadedPlan> {
    let plan = read_verified(plan_path)?;
    // the weights are drawn from the plan's shards: its facts must describe those tensors
    let model = model_of_plan(&plan).map_err(|errors| {
        anyhow!(
            "{}: the plan's model facts and weights disagree (the facts embedding, heads, kv_heads, head_dim, ffn, vocab, tied_embeddings, qk_norm, qkv_bias, moe, mla, kda, dsa and mhc give the weights' shapes):\n  {}\nrecompile the placement with memra-compile",
            plan_path.display(),
            errors.join("\n  ")
        )
    })?;
    check_program(&plan, plan_path, model)?;
    Ok(loaded(plan, plan_path, Weights::Synthetic))
}

/// The plan at `plan_path`, parsed, verified and checked to be runnable.
fn read_verified(plan_path: &Path) -> Result<Plan> {
    let plan = Plan::read(plan_path)?;
    let errors = verify_plan(&plan);
    if !errors.is_empty() {
        bail!(
            "{}: the plan fails verification:\n  {}",
            plan_path.display(),
            errors.join("\n  ")
        );
    }
    check_runnable(&plan).map_err(|e| anyhow!("{}: {e}", plan_path.display()))?;
    Ok(plan)
}

fn loaded(plan: Plan, plan_path: &Path, weights: Weights) -> LoadedPlan {
    let ranks = plan.ranks.iter().map(|r| r.rank).collect();
    LoadedPlan {
        plan,
        path: plan_path.to_path_buf(),
        weights,
        weights_load: Mutex::new(WeightsLoad {
            ranks,
            progress: None,
        }),
    }
}

/// Refuses plans that name features the CPU executor does not run.
fn check_runnable(plan: &Plan) -> Result<()> {
    let arch = plan.model.architecture.as_str();
    if !RUNNABLE_ARCHITECTURES.contains(&arch) {
        bail!(
            "architecture `{}` is not supported by the executor; supported: {}",
            escaped(arch),
            RUNNABLE_ARCHITECTURES.join(", ")
        );
    }
    let m = &plan.model;
    if m.rope_llama3.is_some() {
        bail!(
            "model.rope_llama3: rope_scaling llama3 (Llama 3.1's rope scaling) is not implemented by the executors; the plan is for planning only"
        );
    }
    for (field, value) in [
        ("layers", m.layers),
        ("embedding", m.embedding),
        ("head_dim", m.head_dim),
        ("ffn", m.ffn),
        ("vocab", m.vocab),
    ] {
        if value == 0 {
            bail!("model.{field} is 0; it must be at least 1");
        }
    }
    // the kernels' reduction tree: a power of two of chunks, at most 65536
    for (field, chunks) in [
        ("attn_out", m.reduction_chunks.attn_out),
        ("ffn_down", m.reduction_chunks.ffn_down),
    ] {
        if !chunks.is_power_of_two() || chunks > 1 << 16 {
            bail!(
                "model.reduction_chunks.{field} is {chunks}; allowed: a power of two in 1..=65536"
            );
        }
    }
    if plan.model.mla.is_none()
        && (plan.model.heads == 0
            || plan.model.kv_heads == 0
            || !plan.model.heads.is_multiple_of(plan.model.kv_heads))
    {
        bail!(
            "model.heads {} is not a multiple of model.kv_heads {}",
            plan.model.heads,
            plan.model.kv_heads
        );
    }
    Ok(())
}
