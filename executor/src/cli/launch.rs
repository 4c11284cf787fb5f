//! `memra-run launch PLAN -- SUBCOMMAND [ARGS]`: one process per device of the plan, each
//! `memra-run SUBCOMMAND PLAN [ARGS] --process P --processes W --rendezvous ADDR`, then waits
//! for them.
//!
//! Process 0 starts first, listening on a free port of 127.0.0.1 that it announces on stderr;
//! the others start once the address is known. Every child's stderr comes through line by
//! line, prefixed with its process; stdout is shared (only the process holding the readback
//! rank prints), and stdin goes to that process (an interactive chat). The first child that
//! fails ends the others; launch then names it with its last stderr lines and exits 1.
//! A plan whose devices are on other hosts is refused: each host starts its own processes.
//!
//! Under a site's launcher (`dist::launcher`: srun, mpirun, torchrun set a rank and a world
//! size in every process) launch starts nothing: it runs the subcommand as the launcher's
//! process `P` of `W` itself, meeting the others at the rendezvous the environment or the
//! flags name. `srun memra-run launch PLAN -- gate ...` then works on several hosts.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use memra_compiler::plan::Plan;

use super::{execute, Cli};
use crate::dist::launcher::{self, Assignment, Env, Flags};
use crate::dist::{ProcessMap, JOIN_TIMEOUT, LISTENING, PEER_FAILED};

/// Stderr lines kept per child for the failure report.
const TAIL_LINES: usize = 20;
/// How often the children's states are polled.
const POLL: Duration = Duration::from_millis(10);
/// How long launch waits for the cause of a process's `PEER_FAILED` exit to exit too.
const CAUSE_GRACE: Duration = Duration::from_secs(2);
/// Kept off in every child: NVLink multicast can take a shared host's GPUs down.
const MULTICAST_OFF: [(&str, &str); 3] = [
    ("NCCL_NVLS_ENABLE", "0"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
];

/// One started process.
struct Running {
    process: u32,
    device: u32,
    child: Child,
    stderr: Option<JoinHandle<()>>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

/// The command line of process `p` of `processes` meeting at `rendezvous`: `command` (a
/// subcommand and its arguments, without the plan) with the plan and the process options.
fn process_args(
    plan: &Path,
    command: &[String],
    p: u32,
    processes: u32,
    rendezvous: &str,
) -> Vec<String> {
    let mut a = vec![command[0].clone(), plan.display().to_string()];
    a.extend(command[1..].iter().cloned());
    a.extend([
        "--process".into(),
        p.to_string(),
        "--processes".into(),
        processes.to_string(),
        "--rendezvous".into(),
        rendezvous.into(),
    ]);
    a
}

/// Runs `command` (a subcommand and its arguments, without the plan) on the plan: as the one
/// process a site's launcher or `flags` assign, or else as every process of this host,
/// started here and waited for.
pub fn launch(plan_path: &Path, command: &[String], flags: &Flags) -> Result<ExitCode> {
    let plan = Plan::read(plan_path)?;
    let map = ProcessMap::of(&plan);
    if let Some(a) = launcher::assign(&Env::current()?, flags)? {
        if a.processes > 1 || map.processes() == 1 {
            return run_assigned(plan_path, &plan, &map, command, &a);
        }
        // `srun -n 1`, a batch script: the launcher's one task starts this host's processes
        eprintln!(
            "launch: {}: one process ({}); launch starts the plan's {} processes on this host",
            a.by(),
            a.sources.join(", "),
            map.processes()
        );
    }
    check_hosts(&plan, &map)?;
    let args =
        |p: u32, rendezvous: &str| process_args(plan_path, command, p, map.processes(), rendezvous);
    parse_command(&args(0, launcher::ALONE))?;
    let reader = map.reader().unwrap_or(0);
    let exe = std::env::current_exe().context("cannot find the memra-run binary")?;
    let start = |p: u32, rendezvous: &str, announce: Option<Sender<String>>| {
        spawn(
            &exe,
            p,
            map.device(p),
            &args(p, rendezvous),
            p == reader,
            announce,
        )
    };
    let (tx, rx) = channel();
    let mut children = vec![start(0, launcher::ALONE, Some(tx))?];
    let deadline = Instant::now() + JOIN_TIMEOUT;
    let address = loop {
        match rx.recv_timeout(POLL) {
            Ok(address) => break address,
            Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                if children[0].child.try_wait()?.is_some() {
                    return end(children);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let report = end(children);
                bail!(
                    "process 0 did not announce its rendezvous address within {} s{}",
                    JOIN_TIMEOUT.as_secs(),
                    report.err().map_or(String::new(), |e| format!("; {e:#}"))
                );
            }
            // Its stderr closed without the address: it is ending.
            Err(RecvTimeoutError::Disconnected) => {
                children[0].child.wait()?;
                return end(children);
            }
        }
    };
    for p in 1..map.processes() {
        match start(p, &address, None) {
            Ok(c) => children.push(c),
            Err(e) => {
                let _ = end(children);
                return Err(e);
            }
        }
    }
    // A process that stopped because of another's failure waits a grace period for the
    // cause to exit, so that the report names the cause.
    let mut victim_since: Option<Instant> = None;
    loop {
        let mut running = false;
        for c in &mut children {
            match c.child.try_wait()? {
                None => running = true,
                Some(s) if s.code() == Some(i32::from(PEER_FAILED)) => {
                    victim_since.get_or_insert_with(Instant::now);
                }
                Some(s) if !s.success() => return end(children),
                Some(_) => {}
            }
        }
        if !running || victim_since.is_some_and(|t| t.elapsed() > CAUSE_GRACE) {
            return end(children);
        }
        std::thread::sleep(POLL);
    }
}

/// Runs `command` in this process as the process `a` assigns, once the world fits the plan.
fn run_assigned(
    plan_path: &Path,
    plan: &Plan,
    map: &ProcessMap,
    command: &[String],
    a: &Assignment,
) -> Result<ExitCode> {
    eprintln!(
        "launch: {}: process {} of {} ({})",
        a.by(),
        a.process,
        a.processes,
        a.sources.join(", ")
    );
    let want = map.processes();
    if a.processes != want {
        bail!(
            "{}: the world has {} processes ({}), but the plan's ranks use {want} devices, one process each; start {want} processes (srun -n {want}, mpirun -np {want}, torchrun --nproc-per-node {want})",
            plan_path.display(),
            a.processes,
            a.sources[1]
        );
    }
    let device = map.device(a.process);
    let host = plan.devices.iter().find(|d| d.device == device);
    if let Some(host) = host.and_then(|d| d.host.as_deref()) {
        let here = this_host();
        if !is_local(host, &here) {
            bail!(
                "process {} ({}) runs device {device}, which the plan puts on host `{host}`, but this is host `{here}`; the launcher must start process P on the host of the plan's P-th device (devices of the plan's ranks in increasing order)",
                a.process,
                a.sources[0]
            );
        }
    }
    let args = process_args(plan_path, command, a.process, a.processes, &a.rendezvous);
    Ok(execute(parse_command(&args)?))
}

/// Refuses a plan with a device of its ranks on another host.
fn check_hosts(plan: &Plan, map: &ProcessMap) -> Result<()> {
    let here = this_host();
    let elsewhere: Vec<String> = (0..map.processes())
        .map(|p| map.device(p))
        .filter_map(|device| {
            let d = plan.devices.iter().find(|d| d.device == device)?;
            let host = d.host.as_deref()?;
            (!is_local(host, &here)).then(|| format!("device {device} on host `{host}`"))
        })
        .collect();
    if !elsewhere.is_empty() {
        bail!(
            "the plan puts {}, but this is host `{here}`; launch starts the processes of one host; on each host, start one `memra-run SUBCOMMAND PLAN [ARGS] --process P --processes {} --rendezvous HOST:PORT` per device of the plan on it, P counting the devices of the plan's ranks in increasing order and HOST:PORT where process 0 listens (docs/multi-gpu.md: several hosts)",
            elsewhere.join(", "),
            map.processes()
        );
    }
    Ok(())
}

/// This machine's host name.
fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Whether `host` names this machine (`here`), with or without its domain.
fn is_local(host: &str, here: &str) -> bool {
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_ascii_lowercase();
    host == "localhost" || host.eq_ignore_ascii_case(here) || short(host) == short(here)
}

/// Parses a process's command line and checks its world against the plan (launch checks a
/// child's here, so that a mistake is reported once, not per process).
fn parse_command(args: &[String]) -> Result<Cli> {
    let mut cli =
        Cli::try_parse_from(std::iter::once("memra-run".to_string()).chain(args.iter().cloned()))
            .map_err(|e| {
            let text = e.to_string();
            anyhow!(
                "the command after `--` is not a memra-run subcommand: {}",
                text.trim_start_matches("error: ").trim_end()
            )
        })?;
    if matches!(cli.command, super::Command::Serve { .. }) {
        bail!("the command after `--` is serve, which runs every rank in one process; run `memra-run serve PLAN` without launch");
    }
    match cli.command.plan_and_run() {
        Some((plan, run)) => run.check_world(plan)?,
        None => bail!("the command after `--` is a launch itself; give the subcommand each process runs (generate, chat, perplexity, gate, compare, bench)"),
    }
    Ok(cli)
}

/// Starts process `p` with `args`; its stderr lines go through with a prefix, and with
/// `announce` the rendezvous address it prints is sent there.
fn spawn(
    exe: &Path,
    p: u32,
    device: u32,
    args: &[String],
    stdin: bool,
    announce: Option<Sender<String>>,
) -> Result<Running> {
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .envs(MULTICAST_OFF)
        .stdin(if stdin {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start process {p} ({})", exe.display()))?;
    eprintln!(
        "launch: process {p} (device {device}) started, pid {}",
        child.id()
    );
    let stderr = child.stderr.take().expect("invariant: stderr is piped");
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let keep = tail.clone();
    let thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if let (Some(tx), Some(address)) = (&announce, line.strip_prefix(LISTENING)) {
                let _ = tx.send(address.to_string());
            }
            eprintln!("process {p}: {line}");
            let mut t = keep.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    });
    Ok(Running {
        process: p,
        device,
        child,
        stderr: Some(thread),
        tail,
    })
}

/// Ends every child still running, waits for all, and reports: success when every child
/// succeeded, otherwise each child that failed on its own with its last stderr lines, then
/// those that stopped because of it and those launch ended.
fn end(mut children: Vec<Running>) -> Result<ExitCode> {
    let mut failed: Vec<(u32, ExitStatus)> = Vec::new();
    let mut victims = Vec::new();
    let mut ended = Vec::new();
    for c in &mut children {
        match c.child.try_wait()? {
            Some(status) if status.code() == Some(i32::from(PEER_FAILED)) => {
                victims.push(c.process.to_string());
            }
            Some(status) if !status.success() => failed.push((c.process, status)),
            Some(_) => {}
            None => {
                // Only children of this launch are ended, by their handle.
                let _ = c.child.kill();
                ended.push(c.process.to_string());
            }
        }
    }
    for c in &mut children {
        c.child.wait()?;
        if let Some(t) = c.stderr.take() {
            let _ = t.join();
        }
    }
    if failed.is_empty() && !victims.is_empty() {
        bail!(
            "processes {} stopped because another process failed; launch ended processes {}",
            victims.join(", "),
            ended.join(", ")
        );
    }
    if failed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let mut report = Vec::new();
    for (p, status) in &failed {
        let c = children
            .iter()
            .find(|c| c.process == *p)
            .expect("invariant: a child of this launch");
        let how = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with status {code}"),
            (None, Some(signal)) => format!("was killed by signal {signal}"),
            (None, None) => "ended abnormally".to_string(),
        };
        let tail = c.tail.lock().unwrap_or_else(|e| e.into_inner());
        let lines: Vec<String> = tail.iter().map(|l| format!("  | {l}")).collect();
        report.push(if lines.is_empty() {
            format!("process {p} (device {}) {how}", c.device)
        } else {
            format!(
                "process {p} (device {}) {how}; its last lines on stderr:\n{}",
                c.device,
                lines.join("\n")
            )
        });
    }
    if !victims.is_empty() {
        report.push(format!(
            "processes {} stopped because of it",
            victims.join(", ")
        ));
    }
    if !ended.is_empty() {
        report.push(format!("launch ended processes {}", ended.join(", ")));
    }
    bail!("{}", report.join("\n"))
}
