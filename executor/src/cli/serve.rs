//! `memra-run serve`: checks the options and hands the plan to `crate::serve`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Result};

use super::RunArgs;
use crate::sample::SamplerConfig;
use crate::serve::{serve as run_server, ServerOptions};

/// Serves `plan` on `server`'s address until the process is stopped.
pub fn serve(plan: &Path, server: ServerOptions, run: &RunArgs) -> Result<ExitCode> {
    if run.processes.is_some() {
        bail!("--process/--processes/--rendezvous: serve runs every rank in one process");
    }
    let loaded = run.load(plan)?;
    // Each request samples on the host; the engine's own sampler is never read.
    let options = run.options(SamplerConfig::GREEDY);
    run_server(loaded, options, &server)?;
    Ok(ExitCode::SUCCESS)
}
