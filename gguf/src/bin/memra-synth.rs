//! `memra-synth`: writes a GGUF with seeded random weights (llama, qwen3moe, deepseek2,
//! kimi-linear or glm5-next architecture), so tests and benchmarks run at real model shapes without downloading a model.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use clap::Parser;
use memra_gguf::output::escaped_lines;
use memra_gguf::{progress, synth, GgmlType};

/// Write a synthetic GGUF with seeded random weights.
#[derive(Parser)]
#[command(name = "memra-synth")]
struct Args {
    /// Model shape: tiny, tiny-tp, smol135m, llama1b, llama8b (llama); tiny-qwen3moe,
    /// qwen3-30b-a3b (qwen3moe); tiny-deepseek2, tiny-deepseek2-lite, deepseek-v2-lite,
    /// deepseek-v3 (deepseek2); tiny-kimi-linear (kimi-linear); tiny-glm5-next, tiny-glm5-next-shared, glm-5.3-flash (glm5-next).
    #[arg(long, default_value = "tiny")]
    shape: String,
    /// Matrix type: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k.
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep only the first N transformer blocks (a depth cut of a real-width shape).
    #[arg(long)]
    layers: Option<u32>,
    /// Output path.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

/// Errors go to stderr as `error: ` and their causes, with exit status 1, as memra-compile
/// and memra-run report them.
fn main() -> ExitCode {
    let args = Args::parse();
    progress::report_to_stderr();
    match synthesize(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", escaped_lines(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

fn synthesize(args: &Args) -> Result<()> {
    let mut model = synth::model(&args.shape)?;
    if let Some(n) = args.layers {
        model = model.with_layers(n)?;
    }
    let dtype = GgmlType::from_name(&args.dtype)
        .filter(|t| t.supported())
        .ok_or_else(|| {
            anyhow!(
                "unknown dtype `{}`; supported: {}",
                args.dtype,
                memra_gguf::supported_names()
            )
        })?;
    model.write(dtype, args.seed, &args.output, true)
}
