//! One process per device on the CPU backend, as a user runs it: `memra-run launch` of the
//! tiny-tp PP-2, TP-2 and PP-2 x TP-2 plans (one rank per process, and two ranks per process)
//! gates every logit bit against the 1-rank plan in both arms; sampled text is the 1-rank
//! run's; an interactive chat (SmolLM2 TP-3) reads stdin once and answers as one process
//! does; a killed child ends the launch, which names it; a plan on other hosts is refused
//! with the multi-host recipe, and the recipe followed by hand on this host works; processes
//! started on different plans refuse each other. Started the way srun, mpirun and torchrun
//! start it (the same command in every process, their variables differing), launch runs the
//! PP-2 x TP-2 plan as one process each, bit for bit; a world that does not fit is refused.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use common::{root, tiny_tp_model, SEEDED};
use memra_executor::dist::launcher::VARIABLES;
use memra_executor::dist::LISTENING;

const REFERENCE: &str = "plans/synthetic/tiny-tp.plan.toml";

/// memra-run with no launcher's variables (a test run under srun would have them).
fn memra_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memra-run"));
    cmd.current_dir(root());
    for name in VARIABLES {
        cmd.env_remove(name);
    }
    cmd
}

fn memra_run(args: &[&str]) -> Output {
    tiny_tp_model();
    memra_cmd().args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `launch PLAN -- gate` against the 1-rank plan.
fn gate_args(plan: &str) -> [&str; 10] {
    [
        "launch",
        plan,
        "--",
        "gate",
        "--reference",
        REFERENCE,
        "-n",
        "8",
        "-t",
        "1",
    ]
}

/// Launches a gate of `plan` against the 1-rank plan and checks its one line of output.
fn launch_gate(plan: &str) {
    let out = memra_run(&gate_args(plan));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    passed(plan, &stdout);
}

/// Checks that `stdout` is the one line of a passed gate of `plan`.
fn passed(plan: &str, stdout: &str) {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "only the readback process prints:\n{stdout}"
    );
    assert!(
        lines[0].starts_with(&format!(
            "gate passed: {plan} matches {REFERENCE} bit for bit"
        )),
        "{stdout}"
    );
    assert!(
        lines[0].contains("(serial + pipelined arms x 1 runs x"),
        "{stdout}"
    );
}

#[test]
fn launched_pp2_is_bit_identical() {
    launch_gate("plans/synthetic/tiny-tp-pp2.plan.toml");
}

#[test]
fn launched_tp2_is_bit_identical() {
    launch_gate("plans/synthetic/tiny-tp-tp2.plan.toml");
}

#[test]
fn launched_pp2_tp2_is_bit_identical() {
    launch_gate("plans/synthetic/tiny-tp-pp2-tp2.plan.toml");
}

#[test]
fn launched_pp2_tp2_with_two_ranks_per_process_is_bit_identical() {
    launch_gate("plans/synthetic/tiny-tp-pp2-tp2-2dev.plan.toml");
}

/// `generate`'s flags for the seeded sampled runs, on `arm`.
fn sampled(arm: &str) -> Vec<&str> {
    let prompt = ["-p", "Once upon a time", "-n", "24"];
    [&prompt[..], &SEEDED, &["--arm", arm]].concat()
}

#[test]
fn launched_sampling_gives_the_one_process_text() {
    let alone = memra_run(&[&["generate", REFERENCE][..], &sampled("serial")].concat());
    assert!(alone.status.success(), "{}", text(&alone.stderr));
    assert!(alone.stdout.len() > 24, "{}", text(&alone.stdout));
    for arm in ["serial", "pipelined"] {
        let plan = "plans/synthetic/tiny-tp-pp2-tp2.plan.toml";
        let out = memra_run(&[&["launch", plan, "--", "generate"][..], &sampled(arm)].concat());
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), text(&alone.stdout), "{arm} arm");
    }
}

/// Lines of a child's stderr as they come.
fn lines_of(child: &mut Child) -> Receiver<String> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits up to `secs` for a line with `prefix`, returning its rest; every line seen is kept.
fn wait_for(rx: &Receiver<String>, prefix: &str, seen: &mut Vec<String>, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(line) = rx.recv_timeout(left) else {
            break;
        };
        seen.push(line.clone());
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.to_string();
        }
    }
    panic!(
        "no line `{prefix}...` within {secs} s; seen:\n{}",
        seen.join("\n")
    );
}

/// Waits up to `secs` for `child` to exit.
fn wait_exit(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not end within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_child_ends_the_launch_naming_it() {
    tiny_tp_model();
    // A bench far longer than the test: only the kill can end it.
    let mut launch = memra_cmd()
        .args([
            "launch",
            "plans/synthetic/tiny-tp-pp2-tp2.plan.toml",
            "--",
            "bench",
            "-n",
            "200",
            "--reps",
            "1000000",
            "-t",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines_of(&mut launch);
    let mut seen = Vec::new();
    let pid = wait_for(
        &rx,
        "launch: process 1 (device 1) started, pid ",
        &mut seen,
        30,
    );
    wait_for(&rx, "launch: process 3 (device 3) started", &mut seen, 30);
    wait_for(&rx, "process 1: loading weights", &mut seen, 30);
    std::thread::sleep(Duration::from_millis(200));
    let killed = Command::new("kill").args(["-9", &pid]).status().unwrap();
    assert!(killed.success());
    let status = wait_exit(&mut launch, 30);
    seen.extend(rx.iter());
    let stderr = seen.join("\n");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: process 1 (device 1) was killed by signal 9"),
        "{stderr}"
    );
    assert!(
        stderr.contains("stopped because of it") || stderr.contains("launch ended processes"),
        "{stderr}"
    );
}

/// Starts process `p` of 2 of `args`, meeting at `rendezvous`.
fn start(args: &[&str], p: u32, rendezvous: &str) -> Child {
    let p = p.to_string();
    let world = [
        "--process",
        &p,
        "--processes",
        "2",
        "--rendezvous",
        rendezvous,
    ];
    memra_cmd()
        .args(args)
        .args(world)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `first` as process 0 and `second` as process 1 by hand; their outputs.
fn by_hand(first: &[&str], second: &[&str]) -> (Output, Output) {
    tiny_tp_model();
    let mut p0 = start(first, 0, "127.0.0.1:0");
    let rx = lines_of(&mut p0);
    let address = wait_for(&rx, LISTENING, &mut Vec::new(), 30);
    let p1 = start(second, 1, &address);
    let mut out0 = p0.wait_with_output().unwrap();
    out0.stderr = rx.iter().collect::<Vec<_>>().join("\n").into_bytes();
    (out0, p1.wait_with_output().unwrap())
}

#[test]
fn other_hosts_are_refused_and_the_recipe_runs_by_hand() {
    let hosts = "plans/synthetic/tiny-tp-pp2-hosts.plan.toml";
    let args = [
        "generate",
        hosts,
        "-p",
        "The capital",
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "1",
    ];
    let out = memra_run(&[&["launch", hosts, "--"][..], &args[..1], &args[2..]].concat());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the plan puts device 0 on host `node-a`, device 1 on host `node-b`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--process P --processes 2 --rendezvous HOST:PORT"),
        "{stderr}"
    );
    let (p0, p1) = by_hand(&args, &args);
    assert!(p0.status.success(), "{}", text(&p0.stderr));
    assert!(p1.status.success(), "{}", text(&p1.stderr));
    // The last stage, on device 1, holds the readback rank: process 1 prints, process 0 not.
    assert_eq!(text(&p0.stdout), "");
    let mut alone = args;
    alone[1] = REFERENCE;
    let want = memra_run(&alone);
    assert!(want.status.success(), "{}", text(&want.stderr));
    assert_eq!(text(&p1.stdout), text(&want.stdout));
}

#[test]
fn processes_on_different_plans_refuse_each_other() {
    let args = |plan| ["bench", plan, "-n", "4", "--reps", "1", "-t", "1"];
    let (p0, p1) = by_hand(
        &args("plans/synthetic/tiny-tp-pp2.plan.toml"),
        &args("plans/synthetic/tiny-tp-pp2-hosts.plan.toml"),
    );
    let stderr = format!("{}\n{}", text(&p0.stderr), text(&p1.stderr));
    assert!(!p0.status.success() && !p1.status.success(), "{stderr}");
    assert!(
        stderr.contains("every process must run the same plan and command"),
        "{stderr}"
    );
}

/// Runs `args` with `stdin` as its input.
fn with_stdin(args: &[&str], stdin: &str) -> Output {
    let mut child = memra_cmd()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_launched_chat_reads_stdin_once_and_answers_as_one_process() {
    common::smollm2("smollm2-tp3");
    let plan = "plans/smollm2-tp3.plan.toml";
    let turns = "What is the capital of France?\nAnd of Italy?\n";
    let chat = ["chat", "-n", "6", "--temp", "0", "-t", "1"];
    let alone = with_stdin(&[&chat[..1], &[plan], &chat[1..]].concat(), turns);
    assert!(alone.status.success(), "{}", text(&alone.stderr));
    assert_eq!(
        text(&alone.stdout).lines().count(),
        2,
        "{}",
        text(&alone.stdout)
    );
    let launched = with_stdin(&[&["launch", plan, "--"][..], &chat].concat(), turns);
    assert!(launched.status.success(), "{}", text(&launched.stderr));
    assert_eq!(text(&launched.stdout), text(&alone.stdout));
}

/// A port free a moment ago, for a launcher's rendezvous.
fn free_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port().to_string()
}

/// Starts `args` once per process of `world` as a launcher would: the same command, the
/// variables `vars(p)` differing; their outputs.
fn as_launcher(
    args: &[&str],
    world: u32,
    vars: impl Fn(u32) -> Vec<(&'static str, String)>,
) -> Vec<Output> {
    tiny_tp_model();
    let children: Vec<Child> = (0..world)
        .map(|p| {
            memra_cmd()
                .args(args)
                .envs(vars(p))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

#[test]
fn started_by_srun_mpirun_or_torchrun_pp2_tp2_is_bit_identical() {
    let plan = "plans/synthetic/tiny-tp-pp2-tp2.plan.toml";
    // each launcher: its variables holding the process (the first is the rank it names), its
    // world size variable, and where it says the rendezvous host is
    let launchers = [
        (
            "slurm",
            &["SLURM_PROCID", "SLURM_LOCALID"][..],
            "SLURM_NTASKS",
            ("SLURM_STEP_NODELIST", "localhost"),
        ),
        (
            "open mpi",
            &[
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "PMIX_RANK",
            ][..],
            "OMPI_COMM_WORLD_SIZE",
            ("MASTER_ADDR", "127.0.0.1"),
        ),
        (
            "torchrun",
            &["RANK", "LOCAL_RANK"][..],
            "WORLD_SIZE",
            ("MASTER_ADDR", "127.0.0.1"),
        ),
    ];
    for (name, ranks, size, host) in launchers {
        let rank = ranks[0];
        let port = free_port();
        let vars = |p: u32| {
            let mut vars: Vec<(&'static str, String)> =
                ranks.iter().map(|&r| (r, p.to_string())).collect();
            vars.push((size, "4".into()));
            vars.push((host.0, host.1.into()));
            vars.push(("MASTER_PORT", port.clone()));
            vars
        };
        let outs = as_launcher(&gate_args(plan), 4, vars);
        let mut printed = Vec::new();
        for (p, out) in outs.iter().enumerate() {
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            assert!(
                out.status.success(),
                "{name}, process {p}:\n{stdout}\n{stderr}"
            );
            let line = format!("launch: {name}: process {p} of 4 ({rank}={p}, ");
            assert!(
                stderr.contains(&line),
                "{name}, process {p}: no `{line}`:\n{stderr}"
            );
            if !stdout.is_empty() {
                printed.push(stdout);
            }
        }
        // only the process holding the readback rank prints
        assert_eq!(printed.len(), 1, "{name}: {printed:?}");
        passed(plan, &printed[0]);
    }
}

#[test]
fn one_launcher_task_starts_the_plans_processes() {
    // `srun -n 1` or a batch script: launch starts the plan's four processes itself
    let plan = "plans/synthetic/tiny-tp-pp2-tp2.plan.toml";
    let outs = as_launcher(&gate_args(plan), 1, |_| {
        vec![("SLURM_PROCID", "0".into()), ("SLURM_NTASKS", "1".into())]
    });
    let (stdout, stderr) = (text(&outs[0].stdout), text(&outs[0].stderr));
    assert!(outs[0].status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("launch: slurm: one process (SLURM_PROCID=0, SLURM_NTASKS=1, no rendezvous for one process); launch starts the plan's 4 processes on this host"),
        "{stderr}"
    );
    assert!(
        stderr.contains("launch: process 3 (device 3) started"),
        "{stderr}"
    );
    passed(plan, &stdout);
}

/// The gate of `plan` run as one process under a launcher that sets `vars`: it exits 1 and its
/// stderr holds `want`.
fn refused_under_launcher(plan: &str, vars: &[(&'static str, &str)], want: &str) {
    let outs = as_launcher(&gate_args(plan), 1, |_| {
        vars.iter().map(|&(k, v)| (k, v.to_string())).collect()
    });
    let stderr = text(&outs[0].stderr);
    assert_eq!(outs[0].status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(want), "{stderr}");
}

#[test]
fn a_launcher_world_that_does_not_fit_the_plan_is_refused_by_name() {
    let plan = "plans/synthetic/tiny-tp-pp2-tp2.plan.toml";
    let slurm = |rank| {
        [
            ("SLURM_PROCID", rank),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "localhost"),
        ]
    };
    refused_under_launcher(
        plan,
        &slurm("0"),
        &format!("error: {plan}: the world has 2 processes (SLURM_NTASKS=2), but the plan's ranks use 4 devices, one process each; start 4 processes (srun -n 4"),
    );
    refused_under_launcher(
        "plans/synthetic/tiny-tp-pp2-hosts.plan.toml",
        &slurm("1"),
        "error: process 1 (SLURM_PROCID=1) runs device 1, which the plan puts on host `node-b`, but this is host `",
    );
    refused_under_launcher(
        plan,
        &[("RANK", "0")],
        "error: RANK is set but WORLD_SIZE is not",
    );
}

#[test]
fn a_plan_whose_boundary_communicators_do_not_fit_is_refused_on_cuda() {
    // tiny-tp PP-2 in 1 GiB per device: 0.5 GiB in one process, 1.7 GiB more launched
    tiny_tp_model();
    let source = std::fs::read_to_string(root().join("plans/synthetic/tiny-tp-pp2.toml"))
        .unwrap()
        .replace("../../models/", &format!("{}/models/", root().display()))
        .replace("memory_gib = 141", "memory_gib = 1");
    let dir = std::env::temp_dir().join(format!("memra-launch-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let placement = dir.join("pp2.toml");
    std::fs::write(&placement, source).unwrap();
    let plan = dir.join("pp2.plan.toml");
    let compiled = memra_compiler::passes::compile(&placement).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&plan, compiled.plan.to_toml()).unwrap();
    let plan = plan.display().to_string();
    let bench = [
        &["bench"][..],
        &common::QUICK_BENCH,
        &["--weights", "synthetic"],
    ]
    .concat();
    let out = memra_run(&[&["launch", &plan, "--"][..], &bench, &["--backend", "cuda"]].concat());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("error: {plan}: device 0 needs 2.21 GiB launched one process per device (0.52 in one process and 1.68 for its boundary communicators) but declares 1.00 GiB; run the plan in one process")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("launch: process 0"),
        "no process starts: {stderr}"
    );
    // the cpu backend has no communicators to hold
    let out = memra_run(&[&["launch", &plan, "--"][..], &bench].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn serve_is_not_launched() {
    let plan = "plans/synthetic/tiny-tp-pp2.plan.toml";
    let out = memra_run(&["launch", plan, "--", "serve"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: the command after `--` is serve, which runs every rank in one process; run `memra-run serve PLAN` without launch"),
        "{stderr}"
    );
}
