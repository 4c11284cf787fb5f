//! `memra-run serve`: checks the options and hands the plan to `crate::serve`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use super::{api_key, RunArgs};
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

/// `--api-key-file PATH`: the key on the file's one line (a final newline is dropped).
pub fn api_key_from(path: &Path) -> Result<String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--api-key-file {shown}: cannot read the key"))?;
    let key = text
        .strip_suffix('\n')
        .map_or(text.as_str(), |k| k.strip_suffix('\r').unwrap_or(k));
    if key.is_empty() {
        bail!("--api-key-file {shown}: the file is empty; it must hold the key on one line");
    }
    api_key(key).map_err(|allowed| anyhow::anyhow!("--api-key-file {shown}: {allowed}"))
}
