//! `memra-synth`: writes a llama-architecture GGUF with seeded random weights, so tests and
//! benchmarks run at real model shapes without downloading a model.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::Parser;
use memra_gguf::{progress, synth, GgmlType};

/// Write a synthetic llama GGUF with seeded random weights.
#[derive(Parser)]
#[command(name = "memra-synth")]
struct Args {
    /// Model shape: tiny, tiny-tp, smol135m, llama1b, llama8b.
    #[arg(long, default_value = "tiny")]
    shape: String,
    /// Matrix type: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k.
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output path.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

fn main() -> Result<()> {
    let args = Args::parse();
    progress::report_to_stderr();
    let shape = synth::shape(&args.shape)?;
    let dtype = GgmlType::from_name(&args.dtype)
        .filter(|t| t.supported())
        .ok_or_else(|| {
            anyhow!(
                "unknown dtype `{}`; supported: {}",
                args.dtype,
                memra_gguf::supported_names()
            )
        })?;
    synth::write_model(&shape, dtype, args.seed, &args.output, true)
}
