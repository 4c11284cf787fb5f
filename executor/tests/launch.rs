//! One process per device on the CPU backend, as a user runs it: `memra-run launch` of the
//! tiny-tp PP-2, TP-2 and PP-2 x TP-2 plans (one rank per process, and two ranks per process)
//! gates every logit bit against the 1-rank plan in both arms; sampled text is the 1-rank
//! run's; an interactive chat (SmolLM2 TP-3) reads stdin once and answers as one process
//! does; a killed child ends the launch, which names it; a plan on other hosts is refused
//! with the multi-host recipe, and the recipe followed by hand on this host works; processes
//! started on different plans refuse each other.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use common::{root, tiny_tp_model, SEEDED};
use memra_executor::dist::LISTENING;

const REFERENCE: &str = "plans/synthetic/tiny-tp.plan.toml";

fn memra_run(args: &[&str]) -> Output {
    tiny_tp_model();
    Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Launches a gate of `plan` against the 1-rank plan and checks its one line of output.
fn launch_gate(plan: &str) {
    let out = memra_run(&[
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
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
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
    let mut launch = Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
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
    Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
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
