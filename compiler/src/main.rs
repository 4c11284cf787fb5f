//! `memra-compile`: compile a placement into an execution plan, print its per-rank summary,
//! or check that a committed plan is up to date.

use anyhow::{bail, Context, Result};
use clap::Parser;
use memra_compiler::passes::compile;
use memra_compiler::plan::{Plan, Step};
use memra_compiler::textdiff::unified;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Compile a placement plan (TOML) and its model's metadata into an execution plan.
#[derive(Parser)]
#[command(name = "memra-compile", version, about)]
struct Cli {
    /// Placement files to compile (e.g. plans/smollm2-pp2.toml).
    #[arg(required = true)]
    placements: Vec<PathBuf>,
    /// Where to write the plan (default: beside the placement, `NAME.plan.toml`).
    #[arg(short, long, conflicts_with = "check")]
    output: Option<PathBuf>,
    /// Write nothing; fail with a diff when the committed plan differs from a fresh compile.
    #[arg(long)]
    check: bool,
    /// Print only errors.
    #[arg(short, long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.output.is_some() && cli.placements.len() > 1 {
        eprintln!(
            "error: --output takes one placement; {} were given",
            cli.placements.len()
        );
        return ExitCode::from(2);
    }
    let mut failed = false;
    for placement in &cli.placements {
        if let Err(e) = run(&cli, placement) {
            eprintln!("error: {e:#}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `plans/x.toml` -> `plans/x.plan.toml`.
fn default_output(placement: &Path) -> PathBuf {
    let stem = placement.file_stem().unwrap_or_default().to_string_lossy();
    placement.with_file_name(format!("{stem}.plan.toml"))
}

fn run(cli: &Cli, placement: &Path) -> Result<()> {
    let compiled = compile(placement).map_err(|d| anyhow::anyhow!("{d}"))?;
    let text = compiled.plan.to_toml();
    let out = cli
        .output
        .clone()
        .unwrap_or_else(|| default_output(placement));
    if cli.check {
        let committed = std::fs::read_to_string(&out)
            .with_context(|| format!("{}: cannot read the committed plan", out.display()))?;
        let diff = unified(
            &format!("{} (committed)", out.display()),
            &format!("{} (compiled now)", out.display()),
            &committed,
            &text,
            3,
        );
        if !diff.is_empty() {
            bail!(
                "{} is stale:\n{diff}update it with: memra-compile {}",
                out.display(),
                placement.display()
            );
        }
        if !cli.quiet {
            println!("{}: up to date", out.display());
        }
        return Ok(());
    }
    std::fs::write(&out, &text).with_context(|| format!("{}: cannot write", out.display()))?;
    if !cli.quiet {
        print!("{}", summary(&compiled.plan, placement, &out));
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// The per-rank summary printed after a compile.
fn summary(plan: &Plan, placement: &Path, out: &Path) -> String {
    let m = &plan.model;
    let mut s = format!(
        "{} -> {}\nmodel {} ({}, {} layers, fingerprint {}), placement {}, capture {:?}\n",
        placement.display(),
        out.display(),
        m.name,
        m.architecture,
        m.layers,
        m.fingerprint,
        plan.placement_hash,
        plan.runtime.capture
    );
    for r in &plan.ranks {
        let runs = r
            .program
            .iter()
            .filter(|p| matches!(p, Step::Run { .. }))
            .count();
        let islands: Vec<String> = r
            .program
            .iter()
            .filter_map(|p| match p {
                Step::Island { id, reason, .. } => Some(format!("{id} ({reason})")),
                _ => None,
            })
            .collect();
        let weights: u64 = r.weights.iter().map(|w| w.bytes).sum();
        s += &format!(
            "rank {:<2} stage {:<2} device {:<2} tp {}/{} layers {:<7} runs {runs} islands {} weights {}\n",
            r.rank,
            r.stage,
            r.device,
            r.tp_index,
            r.tp_degree,
            r.layers.to_string(),
            islands.len(),
            mib(weights)
        );
        for island in islands {
            s += &format!("    eager {island}\n");
        }
    }
    for d in &plan.devices {
        if d.total_bytes > 0 {
            s += &format!(
                "device {}: {} of {} (weights {}, kv {}, buffers {})\n",
                d.device,
                mib(d.total_bytes),
                mib(d.memory_bytes),
                mib(d.weight_bytes),
                mib(d.kv_bytes),
                mib(d.buffer_bytes)
            );
        }
    }
    s
}
