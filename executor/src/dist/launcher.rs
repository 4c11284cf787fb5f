//! Who this process is when a site's launcher started it: `srun`, `mpirun` (Open MPI, MPICH,
//! Intel MPI) or torchrun set a rank and a world size in every process's environment, and
//! `memra-run launch` under one of them runs that rank as process `P` of `W` instead of
//! starting processes itself.
//!
//! A process inside an allocation inherits the outer launcher's variables too (`mpirun` or
//! `torchrun` inside `sbatch` or `srun` sees `SLURM_PROCID` of the batch step or of its node's
//! task), so the innermost launcher wins, in the order of `LAUNCHERS`: Open MPI, PMI, torchrun,
//! SLURM. The MPI launchers' variables of one process must agree (`PMIX_RANK` beside them is
//! a check only: PMIx exports no world size). The rendezvous (where process 0 listens) is
//! `MASTER_ADDR:MASTER_PORT` when set, under SLURM the first host of the step's node list;
//! the MPI launchers name no host, so they need `MASTER_ADDR` or `--rendezvous`.
//!
//! Explicit flags win over the environment: `--process`, `--processes`, `--rendezvous`, and
//! `--port` for the port alone.

use std::collections::BTreeMap;
use std::ffi::OsString;

use anyhow::{bail, Result};

/// The port process 0 listens at when the launcher names a host but no port (torchrun's
/// default too).
pub const DEFAULT_PORT: u16 = 29500;

/// The rendezvous of a world of one process: localhost, a port the system picks.
pub const ALONE: &str = "127.0.0.1:0";

/// A launcher whose variables `launch` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's `mpirun` / `prterun`.
    OpenMpi,
    /// A PMI launcher: MPICH's and Intel MPI's Hydra `mpiexec`, `srun --mpi=pmi2`.
    Pmi,
    /// torchrun, or any launcher setting its variables.
    Torchrun,
    /// SLURM's `srun`.
    Slurm,
}

/// A launcher's variables: rank, world size and rank on the node.
struct Vars {
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
    local: Option<&'static str>,
}

/// The launchers, innermost first.
const LAUNCHERS: [Vars; 4] = [
    Vars {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
    },
    Vars {
        launcher: Launcher::Pmi,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local: None,
    },
    Vars {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: "WORLD_SIZE",
        local: Some("LOCAL_RANK"),
    },
    Vars {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local: Some("SLURM_LOCALID"),
    },
];

/// A PMIx server's rank, set beside Open MPI's or SLURM's (`srun --mpi=pmix`).
const PMIX_RANK: &str = "PMIX_RANK";
/// SLURM's node lists: the step's, then the job's.
const NODELISTS: [&str; 2] = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"];
/// torchrun's agent serves its own store at `MASTER_PORT` when this is `True`.
const AGENT_STORE: &str = "TORCHELASTIC_USE_AGENT_STORE";

/// Every variable `launch` reads.
pub const VARIABLES: [&str; 17] = [
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    PMIX_RANK,
    NODELISTS[0],
    NODELISTS[1],
    "MASTER_ADDR",
    "MASTER_PORT",
    AGENT_STORE,
];

impl Launcher {
    /// The name `launch` prints.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::OpenMpi => "open mpi",
            Launcher::Pmi => "pmi (mpich, intel mpi)",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "slurm",
        }
    }
}

/// The launcher variables of this process's environment.
#[derive(Debug, Default, Clone)]
pub struct Env {
    vars: BTreeMap<&'static str, String>,
}

impl Env {
    /// Reads `VARIABLES` from this process's environment; a value that is not UTF-8 is
    /// refused by name.
    pub fn current() -> Result<Env> {
        Env::from_os(VARIABLES.map(|name| (name, std::env::var_os(name))))
    }

    /// The variables given, each with its value when set (names outside `VARIABLES` are
    /// not read).
    fn from_os(vars: impl IntoIterator<Item = (&'static str, Option<OsString>)>) -> Result<Env> {
        let mut env = Env::default();
        for (name, value) in vars {
            let Some(value) = value else { continue };
            match value.into_string() {
                Ok(v) => env.vars.insert(name, v),
                Err(v) => bail!("{name}={v:?} is not UTF-8; allowed: an integer or a host name"),
            };
        }
        Ok(env)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }
}

/// What the command line says, which wins over the environment.
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub process: Option<u32>,
    pub processes: Option<u32>,
    pub rendezvous: Option<String>,
    pub port: Option<u16>,
}

/// This process's place in a world a launcher (or the flags) set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The launcher detected; `None` when the flags alone say everything.
    pub launcher: Option<Launcher>,
    pub process: u32,
    pub processes: u32,
    /// HOST:PORT where process 0 listens.
    pub rendezvous: String,
    /// Where each value came from, for the line `launch` prints: the process's, the world
    /// size's, then the local rank's and the rendezvous's.
    pub sources: Vec<String>,
}

impl Assignment {
    /// What assigned the process: the launcher's name, or the flags.
    pub fn by(&self) -> &'static str {
        self.launcher.map_or("flags", Launcher::name)
    }
}

/// The world of this process, from `flags` over `env`; `None` when neither names one (launch
/// then starts the plan's processes itself).
pub fn assign(env: &Env, flags: &Flags) -> Result<Option<Assignment>> {
    let mut errors = Vec::new();
    let found = detect(env, &mut errors);
    if !errors.is_empty() {
        bail!("{}", errors.join("\n"));
    }
    let (launcher, rank, size, local) = match found {
        Some(f) => (Some(f.launcher), Some(f.rank), Some(f.size), f.local),
        None => (None, None, None, None),
    };
    if launcher.is_none()
        && flags.process.is_none()
        && flags.processes.is_none()
        && flags.rendezvous.is_none()
    {
        if flags.port.is_some() {
            bail!("--port sets the port of a launcher's rendezvous, but no launcher is detected; allowed: with one of {}, or --process, --processes and --rendezvous HOST:PORT", launcher_list());
        }
        return Ok(None);
    }
    let mut sources = Vec::new();
    let process = pick(flags.process, "--process", rank, &mut sources);
    let processes = pick(flags.processes, "--processes", size, &mut sources);
    let (Some(process), Some(processes)) = (process, processes) else {
        bail!("launch needs this process's rank and the world size; give both --process and --processes, or start it under a launcher ({})", launcher_list());
    };
    if process >= processes {
        bail!(
            "process {process} ({}) is not below the world size {processes} ({}); processes are numbered 0..{processes}",
            sources[0],
            sources[1]
        );
    }
    if let Some((name, l)) = local {
        sources.push(format!("local rank {l} from {name}"));
    }
    let rendezvous = if processes == 1 && flags.rendezvous.is_none() {
        // nobody joins a world of one: process 0 listens where the system picks
        sources.push("no rendezvous for one process".into());
        ALONE.to_string()
    } else {
        rendezvous(env, flags, launcher, &mut sources)?
    };
    Ok(Some(Assignment {
        launcher,
        process,
        processes,
        rendezvous,
        sources,
    }))
}

/// The flag's value when given, otherwise the environment's; says which in `sources`.
fn pick(
    flag: Option<u32>,
    flag_name: &str,
    env: Option<(&'static str, u32)>,
    sources: &mut Vec<String>,
) -> Option<u32> {
    match (flag, env) {
        (Some(v), Some((name, e))) if v != e => {
            sources.push(format!("{flag_name} {v} over {name}={e}"));
            Some(v)
        }
        (Some(v), _) => {
            sources.push(format!("{flag_name} {v}"));
            Some(v)
        }
        (None, Some((name, e))) => {
            sources.push(format!("{name}={e}"));
            Some(e)
        }
        (None, None) => None,
    }
}

fn launcher_list() -> String {
    let vars: Vec<String> = LAUNCHERS
        .iter()
        .map(|v| format!("{} and {}", v.rank, v.size))
        .collect();
    vars.join(", ")
}

/// The innermost launcher's variables, each with its name.
struct Found {
    launcher: Launcher,
    rank: (&'static str, u32),
    size: (&'static str, u32),
    local: Option<(&'static str, u32)>,
}

/// The innermost launcher whose variables are set, checked; every problem goes to `errors`.
fn detect(env: &Env, errors: &mut Vec<String>) -> Option<Found> {
    let vars = LAUNCHERS.iter().find(|v| {
        [Some(v.rank), Some(v.size), v.local]
            .into_iter()
            .flatten()
            .any(|n| env.get(n).is_some())
    });
    let pmix = number(env, PMIX_RANK, errors);
    let Some(vars) = vars else {
        if let Some(p) = pmix {
            errors.push(format!("{PMIX_RANK}={p} is set, but no variable gives the world size (PMIx exports none); allowed: with {}, or --process and --processes", launcher_list()));
        }
        return None;
    };
    let (rank, size) = (
        number(env, vars.rank, errors),
        number(env, vars.size, errors),
    );
    let local = vars
        .local
        .and_then(|n| number(env, n, errors).map(|l| (n, l)));
    for (name, value) in [(vars.rank, rank), (vars.size, size)] {
        if value.is_none() && env.get(name).is_none() {
            let other = [vars.rank, vars.size, vars.local.unwrap_or("")]
                .into_iter()
                .find(|n| env.get(n).is_some())
                .unwrap_or(name);
            errors.push(format!(
                "{other} is set but {name} is not; a {} launch sets {} and {} in every process",
                vars.launcher.name(),
                vars.rank,
                vars.size
            ));
        }
    }
    let (Some(rank), Some(size)) = (rank, size) else {
        return None;
    };
    if size == 0 {
        errors.push(format!("{}=0; allowed: 1 or more", vars.size));
    } else if rank >= size {
        errors.push(format!(
            "{}={rank} is not below {}={size}; allowed: 0..{size}",
            vars.rank, vars.size
        ));
    }
    if let Some((name, l)) = local {
        if size > 0 && l >= size {
            errors.push(format!(
                "{name}={l} is not below {}={size}; allowed: 0..{size}",
                vars.size
            ));
        }
    }
    // The MPI launchers of one process agree (a PMIx server's rank beside them too).
    if vars.launcher != Launcher::Torchrun {
        let mpi = LAUNCHERS
            .iter()
            .filter(|o| matches!(o.launcher, Launcher::OpenMpi | Launcher::Pmi))
            .filter(|o| o.launcher != vars.launcher)
            .filter_map(|o| number(env, o.rank, &mut Vec::new()).map(|r| (o.rank, r)));
        for (name, other) in mpi.chain(pmix.map(|p| (PMIX_RANK, p))) {
            if other != rank {
                errors.push(format!("{}={rank} but {name}={other}: two launchers give this process different ranks; start it under one launcher", vars.rank));
            }
        }
    }
    Some(Found {
        launcher: vars.launcher,
        rank: (vars.rank, rank),
        size: (vars.size, size),
        local,
    })
}

/// The variable `name` as a count, when set; a value that is not one goes to `errors`.
fn number(env: &Env, name: &'static str, errors: &mut Vec<String>) -> Option<u32> {
    let value = env.get(name)?;
    match value.trim().parse::<u32>() {
        Ok(n) => Some(n),
        Err(_) => {
            errors.push(format!(
                "{name}=`{value}` is not allowed; allowed: an integer 0 or more"
            ));
            None
        }
    }
}

/// Where process 0 listens: `--rendezvous`, else `MASTER_ADDR` or SLURM's first host with
/// `--port`, `MASTER_PORT` or the default port.
fn rendezvous(
    env: &Env,
    flags: &Flags,
    launcher: Option<Launcher>,
    sources: &mut Vec<String>,
) -> Result<String> {
    if let Some(at) = &flags.rendezvous {
        sources.push(format!("rendezvous {at} from --rendezvous"));
        return Ok(at.clone());
    }
    let Some(launcher) = launcher else {
        bail!("--process and --processes need --rendezvous HOST:PORT (where process 0 listens) when no launcher is detected");
    };
    let (host, from) = match (env.get("MASTER_ADDR"), launcher) {
        (Some(h), _) if !h.trim().is_empty() => (h.trim().to_string(), "MASTER_ADDR".to_string()),
        (Some(_), _) => bail!("MASTER_ADDR is empty; allowed: the host name or address of process 0"),
        (None, Launcher::Slurm) => {
            let Some(name) = NODELISTS.into_iter().find(|n| env.get(n).is_some()) else {
                bail!("slurm sets neither {} nor {}, so the rendezvous host is unknown; set MASTER_ADDR or pass --rendezvous HOST:PORT", NODELISTS[0], NODELISTS[1]);
            };
            let list = env.get(name).unwrap_or_default();
            let host = first_host(list).map_err(|e| anyhow::anyhow!("{name}=`{list}`: {e}"))?;
            (host, format!("the first host of {name}"))
        }
        (None, Launcher::Torchrun) => bail!("RANK and WORLD_SIZE are set but MASTER_ADDR is not; a torchrun-style launch sets MASTER_ADDR and MASTER_PORT in every process (or pass --rendezvous HOST:PORT)"),
        (None, l) => bail!("{} sets no rendezvous address; set MASTER_ADDR (and MASTER_PORT, default {DEFAULT_PORT}) to process 0's host in every process (mpirun -x MASTER_ADDR=HOST), or pass --rendezvous HOST:PORT", l.name()),
    };
    let port = match (flags.port, env.get("MASTER_PORT")) {
        (Some(p), _) => (p, "--port".to_string()),
        (None, Some(p)) => {
            let port = p.trim().parse::<u16>().ok().filter(|&p| p > 0);
            let Some(port) = port else {
                bail!("MASTER_PORT=`{p}` is not allowed; allowed: a port 1..=65535");
            };
            if env.get(AGENT_STORE) == Some("True") {
                bail!("MASTER_PORT={port} is torchrun's own store ({AGENT_STORE}=True); give memra's rendezvous another port with --port PORT (the host stays MASTER_ADDR)");
            }
            (port, "MASTER_PORT".to_string())
        }
        (None, None) if launcher == Launcher::Torchrun => {
            bail!("MASTER_ADDR is set but MASTER_PORT is not; a torchrun-style launch sets both (or pass --port PORT)")
        }
        (None, None) => (DEFAULT_PORT, "the default port".to_string()),
    };
    sources.push(format!(
        "rendezvous {host}:{} from {from} and {}",
        port.0, port.1
    ));
    Ok(format!("{host}:{}", port.0))
}

/// The first host of a SLURM node list: `node[03-05,07],gpu1` gives `node03`. Hosts are
/// comma-separated; a bracket holds comma-separated numbers and ranges `a-b`, and a host may
/// have several brackets (`rack[1-2]-n[01-04]` starts with `rack1-n01`).
pub fn first_host(list: &str) -> Result<String> {
    let list = list.trim();
    let mut host = String::new();
    let mut depth = 0;
    let mut inside = String::new();
    for c in list.chars() {
        match (c, depth) {
            (',', 0) => break,
            ('[', 0) => depth = 1,
            ('[', _) => bail!("a bracket inside a bracket; allowed: host[N-M,K],..."),
            (']', 0) => bail!("`]` without `[`; allowed: host[N-M,K],..."),
            (']', _) => {
                host += &first_number(&inside)?;
                inside.clear();
                depth = 0;
            }
            (c, 0) if c.is_whitespace() => {
                bail!("a space in a host name; allowed: host[N-M,K],...")
            }
            (c, 0) => host.push(c),
            (c, _) => inside.push(c),
        }
    }
    if depth > 0 {
        bail!("`[` without `]`; allowed: host[N-M,K],...");
    }
    if host.is_empty() {
        bail!("no host; allowed: host[N-M,K],...");
    }
    Ok(host)
}

/// The first number of a bracket's `N-M,K,...`, as written (leading zeros kept).
fn first_number(inside: &str) -> Result<String> {
    for item in inside.split(',') {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            bail!("`[{inside}]` holds `{item}`; allowed: numbers and ranges N-M, comma-separated");
        }
        // compared as digit strings, so no length overflows
        let value = |s: &str| s.trim_start_matches('0').to_string();
        let (a, b) = (value(lo), value(hi));
        if (a.len(), &a) > (b.len(), &b) {
            bail!("`[{inside}]` holds the range {item}, which runs backwards; allowed: N-M with N <= M");
        }
    }
    let first = inside.split(',').next().unwrap_or_default();
    Ok(first.split('-').next().unwrap_or_default().to_string())
}

#[cfg(test)]
#[path = "launcher_tests.rs"]
mod tests;
