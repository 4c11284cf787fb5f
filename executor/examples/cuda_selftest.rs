//! The CUDA self-test (memra_executor::cuda::selftest): every kernel against the CPU reference,
//! tensor-parallel bit-exactness, determinism and graph replay, optionally matvec bandwidth.
//! Exits non-zero on any failure. `--compile-only sm_XY` only compiles the kernels with NVRTC
//! (no GPU or driver needed), which checks the sources on a build machine.

use std::process::ExitCode;

use clap::Parser;
use memra_executor::cuda::{compile, selftest};

#[derive(Parser)]
#[command(
    about = "memra cuda self-test: kernels vs the cpu reference, tp bit-exactness, graphs, bandwidth"
)]
struct Args {
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Also time the matvec kernels on llama-8B shapes.
    #[arg(long)]
    bench: bool,
    /// Also time the prefill products on llama-8B shapes, in every tile.
    #[arg(long)]
    prefill_bench: bool,
    /// Skip the checks (with --bench: timing only, e.g. under a profiler).
    #[arg(long)]
    no_checks: bool,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 20261129)]
    seed: u64,
    /// Only time the all-reduce between two members on these devices (e.g. 0,1 or 0,0).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    collective: Option<Vec<usize>>,
    /// Only compile every kernel file for this architecture (e.g. sm_90) and exit.
    #[arg(long, value_name = "ARCH")]
    compile_only: Option<String>,
    /// With --compile-only: also write each file's PTX here (for `ptxas -v`, `cuobjdump`).
    #[arg(long, value_name = "DIR", requires = "compile_only")]
    ptx_dir: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(devices) = &args.collective {
        return match selftest::collective::run(devices, args.seed) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let result = match &args.compile_only {
        Some(arch) => compile::compiled(arch).and_then(|ptx| {
            for (file, ptx) in compile::FILES.iter().zip(ptx.iter()) {
                if let Some(dir) = &args.ptx_dir {
                    let path = dir.join(file.name.replace(".cu", ".ptx"));
                    memra_gguf::output::write_atomically(&path, |f| {
                        Ok(std::io::Write::write_all(f, ptx.to_src().as_bytes())?)
                    })?;
                }
                println!(
                    "kernels/{}: {} entry points, {} bytes of ptx",
                    file.name,
                    file.entries.len(),
                    ptx.to_src().len()
                );
            }
            Ok(true)
        }),
        None => selftest::run(&selftest::Options {
            device: args.device,
            checks: !args.no_checks,
            bench: args.bench,
            prefill_bench: args.prefill_bench,
            seed: args.seed,
        }),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
