//! Helpers shared by the end-to-end tests: paths in the repository, the real model (or a
//! clear message telling how to fetch it), the synthetic tiny-tp model, written on first
//! use, and the checks the bit-identity gate tests share.

#![allow(dead_code)] // each test binary uses its own subset

pub mod http;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memra_executor::cpu::{Arm, EngineOptions, ReduceOrder};
use memra_executor::engine::open;
use memra_executor::gate::{gate, Difference, GateReport, Mismatch};
use memra_executor::plan_load::{load, LoadedPlan};
use memra_executor::sample::{Sampler, SamplerConfig};
use memra_executor::session::{Flow, Session};
use memra_executor::speculate::{Drafts, Tally};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The SmolLM2 plan `name` (e.g. `smollm2-pp2`), loaded; fails with the fetch command when
/// the model is missing.
pub fn smollm2(name: &str) -> LoadedPlan {
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        model.exists(),
        "{} is missing; run scripts/fetch-model.sh",
        model.display()
    );
    load(&root().join(format!("plans/{name}.plan.toml")), None).unwrap()
}

/// `memra-run generate`'s sampler and thread flags for seeded runs: two runs with them must
/// print the same text.
pub const SEEDED: [&str; 6] = ["--temp", "0.9", "--seed", "7", "-t", "1"];

/// The shortest timed bench: two tokens, one repetition, one thread.
pub const QUICK_BENCH: [&str; 6] = ["-n", "2", "--reps", "1", "-t", "1"];

static SYNTH: Mutex<()> = Mutex::new(());

/// Path of the synthetic tiny-tp q8_0 model, written (seed 0) when absent.
pub fn tiny_tp_model() -> PathBuf {
    synth_model("tiny-tp", "q8_0", 0, "models/tiny-tp-q8_0.gguf")
}

/// Path of the synthetic tiny-qwen3moe q8_0 model (GQA and routed experts), written (seed 9)
/// when absent.
pub fn tiny_qwen3moe_model() -> PathBuf {
    synth_model("tiny-qwen3moe", "q8_0", 9, "models/tiny-qwen3moe-q8_0.gguf")
}

/// Path of the synthetic tiny-deepseek2 q8_0 model (MLA with a q-LoRA, routed and shared
/// experts), written (seed 9) when absent.
pub fn tiny_deepseek2_model() -> PathBuf {
    synth_model(
        "tiny-deepseek2",
        "q8_0",
        9,
        "models/tiny-deepseek2-q8_0.gguf",
    )
}

/// Path of the synthetic tiny-glm5-next q8_0 model (KDA and DSA layers in mHC streams),
/// written (seed 8, as the gates write it) when absent.
pub fn tiny_glm5_next_model() -> PathBuf {
    synth_model(
        "tiny-glm5-next",
        "q8_0",
        8,
        "models/tiny-glm5-next-q8_0.gguf",
    )
}

/// Path of the synthetic tiny-kimi-linear q8_0 model (KDA and MLA layers), written (seed 16)
/// when absent.
pub fn tiny_kimi_linear_model() -> PathBuf {
    synth_model(
        "tiny-kimi-linear",
        "q8_0",
        16,
        "models/tiny-kimi-linear-q8_0.gguf",
    )
}

/// The synthetic model of memra-synth shape `shape` in `dtype` with `seed` at `rel` (under the
/// repository root), written when absent.
pub fn synth_model(shape: &str, dtype: &str, seed: u64, rel: &str) -> PathBuf {
    let path = root().join(rel);
    let _guard = SYNTH.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Written beside and renamed, so a test binary running at the same time never reads a
        // partial file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let dtype = memra_gguf::GgmlType::from_name(dtype).unwrap();
        let model = memra_gguf::synth::model(shape).unwrap();
        model.write(dtype, seed, &tmp, false).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// The synthetic plan `plans/synthetic/{name}.plan.toml`, loaded.
pub fn tiny_tp(name: &str) -> LoadedPlan {
    tiny_tp_model();
    load(
        &root().join(format!("plans/synthetic/{name}.plan.toml")),
        None,
    )
    .unwrap()
}

/// Greedy decoding on one kernel thread per engine: tests run side by side on CI's two
/// cores, and spinning pools would fight over them.
pub fn options(arm: Arm) -> EngineOptions {
    EngineOptions {
        backend: memra_executor::engine::Backend::Cpu,
        threads: 1,
        arm,
        sampler: SamplerConfig::GREEDY,
        reduce_order: ReduceOrder::Tree,
        perturb: None,
        world: None,
    }
}

/// Compiles the placement `text` (its model path absolute) in a scratch directory and loads
/// the plan: for tests whose model is generated, so no committed plan can name it. Each call
/// has a directory of its own: tests of one binary run side by side and may compile the same
/// `name` at once (one writing the placement while another reads it).
pub fn compile_scratch(name: &str, text: &str) -> LoadedPlan {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("memra-test-{}-{call}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let placement = dir.join("placement.toml");
    std::fs::write(&placement, text).unwrap();
    let compiled =
        memra_compiler::passes::compile(&placement).unwrap_or_else(|e| panic!("{name}: {e}"));
    let plan = dir.join("placement.plan.toml");
    std::fs::write(&plan, compiled.plan.to_toml()).unwrap();
    load(&plan, None).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

/// The committed placement `plans/synthetic/{name}.toml` (its model path made absolute) with
/// `runtime` lines added, compiled in the scratch directory `{prefix}{name}-{runtime}`.
pub fn synthetic_variant(prefix: &str, name: &str, runtime: &str) -> LoadedPlan {
    let text = std::fs::read_to_string(root().join(format!("plans/synthetic/{name}.toml")))
        .unwrap()
        .replace(
            "gguf = \"../../models/",
            &format!("gguf = \"{}/models/", root().display()),
        )
        .replace("[runtime]\n", &format!("[runtime]\n{runtime}\n"));
    let tag = runtime.replace([' ', '=', '\n'], "");
    compile_scratch(&format!("{prefix}{name}-{tag}"), &text)
}

/// Fails unless `plans/synthetic/{name}.plan.toml` is what the compiler makes of its placement
/// today (the compiler's golden test cannot write the synthetic models).
pub fn assert_plan_up_to_date(name: &str) {
    let placement = root().join(format!("plans/synthetic/{name}.toml"));
    let compiled =
        memra_compiler::passes::compile(&placement).unwrap_or_else(|e| panic!("{name}: {e}"));
    let committed = std::fs::read_to_string(placement.with_extension("plan.toml")).unwrap();
    assert!(
        compiled.plan.to_toml() == committed,
        "plans/synthetic/{name}.plan.toml is stale; update it with: memra-compile plans/synthetic/{name}.toml"
    );
}

/// The gate's report for `candidate` against `reference` (serial options, both arms), failing
/// with `label` on any mismatch.
pub fn assert_bit_identical(
    label: &str,
    reference: &LoadedPlan,
    candidate: &LoadedPlan,
    prompt: &[u32],
    generated: usize,
) -> GateReport {
    let report = gate(
        reference,
        candidate,
        prompt,
        generated,
        options(Arm::Serial),
    )
    .unwrap();
    assert_eq!(report.mismatch, None, "{label}");
    report
}

/// The mismatch the gate finds when `candidate` folds its all-reduces in reverse; fails
/// unless there is one and it is a logit.
pub fn reversed_fold_mismatch(
    reference: &LoadedPlan,
    candidate: &LoadedPlan,
    prompt: &[u32],
    generated: usize,
) -> Mismatch {
    let broken = EngineOptions {
        reduce_order: ReduceOrder::ReversedFold,
        perturb: None,
        ..options(Arm::Serial)
    };
    let report = gate(reference, candidate, prompt, generated, broken).unwrap();
    let m = report
        .mismatch
        .expect("the gate must catch a wrong all-reduce order");
    assert!(matches!(m.what, Difference::Logit { .. }), "{m}");
    m
}

/// A running `memra-run serve` of the real SmolLM2 plan decoding up to 8 sequences together
/// (`plans/smollm2-batch8.plan.toml`) on a free port, killed when dropped.
pub struct ServeProcess {
    child: std::process::Child,
    /// The port it listens on.
    pub port: u16,
    /// The line that names the address it listens on.
    pub start_line: String,
    /// Its stderr lines after the listening line: one per request.
    pub log: std::sync::Arc<Mutex<Vec<String>>>,
}

impl ServeProcess {
    /// Starts the server with `threads` kernel threads and returns once it listens (the
    /// engine is open before the port is bound).
    pub fn start(threads: u32) -> ServeProcess {
        ServeProcess::start_with(threads, &[])
    }

    /// As `start`, with more `serve` options.
    pub fn start_with(threads: u32, options: &[&str]) -> ServeProcess {
        ServeProcess::serving("smollm2-batch8", threads, options)
    }

    /// As `start_with`, serving the real SmolLM2 under the plan `plans/NAME.plan.toml`.
    pub fn serving(name: &str, threads: u32, options: &[&str]) -> ServeProcess {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        smollm2(name);
        let threads = threads.to_string();
        let plan = format!("plans/{name}.plan.toml");
        let mut child = Command::new(env!("CARGO_BIN_EXE_memra-run"))
            .current_dir(root())
            .args(["serve", &plan, "--port", "0", "-t", &threads])
            .args(options)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (port, start_line) = loop {
            let line = lines
                .next()
                .expect("the server exited before listening")
                .unwrap();
            if let Some(at) = line.split("http://127.0.0.1:").nth(1) {
                let digits: String = at.chars().take_while(char::is_ascii_digit).collect();
                break (digits.parse().unwrap(), line);
            }
        };
        let log = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        ServeProcess {
            child,
            port,
            start_line,
            log,
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the server `signal` (e.g. `libc::SIGTERM`).
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill only sends a signal to the child this value owns.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// The server's exit status, waiting up to `limit` for it (None: still running).
    pub fn exit_within(&mut self, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Tokens and each generated token's logits of `turns` (each a prompt continuing the
/// history, then `n` generated tokens), greedy, on `plan` with `options`: plainly, or by
/// speculative decoding from `drafts` when given (the speculation gates).
pub fn decode_turns(
    plan: &LoadedPlan,
    options: EngineOptions,
    turns: &[Vec<u32>],
    n: usize,
    drafts: Option<Drafts>,
) -> (Vec<u32>, Vec<Vec<f32>>, Option<Tally>) {
    let engine = open(plan, options).unwrap();
    let rt = &plan.plan.runtime;
    let mut session = Session::new(engine, rt.in_flight, rt.max_context);
    if let Some(d) = drafts {
        let k = plan.plan.speculative.expect("a speculative plan").tokens as usize;
        session = session.speculating(k, d, Sampler::new(SamplerConfig::GREEDY));
    }
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    let mut context = Vec::new();
    for turn in turns {
        context.extend_from_slice(turn);
        let generated = session
            .continue_with(&context, n, |out, generates| {
                if generates {
                    logits.push(out.logits.clone());
                }
                Ok(Flow::Continue)
            })
            .unwrap();
        context.extend_from_slice(&generated);
        tokens.extend(generated);
    }
    (tokens, logits, session.tally())
}

/// Fails unless `got` has `want`'s tokens and every logit's bits.
pub fn assert_same(label: &str, want: &(Vec<u32>, Vec<Vec<f32>>), got: &(Vec<u32>, Vec<Vec<f32>>)) {
    assert_eq!(want.0, got.0, "{label}: tokens");
    assert_eq!(want.1.len(), got.1.len(), "{label}: rows of logits");
    for (t, (w, g)) in want.1.iter().zip(&got.1).enumerate() {
        assert!(!w.is_empty() && w.len() == g.len(), "{label} token {t}");
        let differs = w
            .iter()
            .zip(g)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            differs, None,
            "{label}: token {t}, first logit whose bits differ"
        );
    }
}

/// `sequence` with every third token from its `from`-th on replaced by another one: drafts
/// that are accepted for a while, then rejected.
pub fn garbled(sequence: &[u32], from: usize, vocab: u32) -> Vec<u32> {
    let mut out = sequence.to_vec();
    for (i, t) in out.iter_mut().enumerate().skip(from) {
        if (i - from) % 3 == 2 {
            *t = (*t + 1) % vocab;
        }
    }
    out
}
