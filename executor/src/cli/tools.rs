//! `memra-run perplexity`, `gate`, `compare` and `bench`. With one process per device every
//! process decodes the same steps and only the one holding the readback rank prints.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use memra_gguf::progress::{Progress, Unit};

use super::speculation::SpeculativeRuns;
use super::{start, RunArgs, Sampling};
use crate::batch_gate::{batch_gate, sequences};
use crate::engine::{open, Arm, Backend, EngineOptions, PromptMode};
use crate::gate::{decode_all, gate_repeated};
use crate::perplexity::perplexity as run_perplexity;
use crate::plan_load::LoadedPlan;
use crate::sample::SamplerConfig;
use crate::session::{Flow, Session};
use crate::text::Tokenizer;

/// `perplexity`: prints the running PPL after each chunk and the final estimate with its ±,
/// in llama-perplexity's format.
pub fn perplexity(
    plan: &Path,
    file: &Path,
    ctx: usize,
    chunks: Option<usize>,
    run: &RunArgs,
) -> Result<ExitCode> {
    let mut loaded = start(plan, run, Sampling::GREEDY)?;
    let max_context = loaded.plan.plan.runtime.max_context as usize;
    if ctx > max_context {
        bail!(
            "--ctx {ctx}: a chunk must fit {}'s runtime.max_context; allowed: 4..={max_context}",
            plan.display()
        );
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let tokens = loaded.tokenizer.encode(&text, true)?;
    // llama.cpp puts BOS first in each chunk exactly when the tokenizer adds one.
    let adds_bos = loaded.tokenizer.encode("", true)?.first().copied();
    let bos = adds_bos.filter(|&b| Some(b) == loaded.tokenizer.bos());
    let n_chunks = chunks.map_or(tokens.len() / ctx.max(1), |c| {
        c.min(tokens.len() / ctx.max(1))
    });
    let prints = loaded.prints;
    if prints {
        eprintln!(
            "{} tokens, {n_chunks} chunks of {ctx}, {} scored per chunk",
            tokens.len(),
            ctx - 1 - ctx / 2
        );
    }
    let progress = if prints {
        Progress::new_beside_stdout(
            "perplexity",
            (n_chunks * ctx) as u64,
            Unit::Items("tokens decoded"),
        )
    } else {
        Progress::silent()
    };
    let total = run_perplexity(&mut loaded.session, &tokens, ctx, bos, chunks, |c, p| {
        if prints {
            print!("[{}]{:.4},", c + 1, p.ppl());
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
        progress.inc(ctx as u64);
    })?;
    if !prints {
        return Ok(ExitCode::SUCCESS);
    }
    println!();
    println!(
        "Final estimate: PPL = {:.4} +/- {:.5}",
        total.ppl(),
        total.uncertainty()
    );
    // After the last stdout line, so a log that merges both streams keeps it on its own line.
    progress.finish();
    Ok(ExitCode::SUCCESS)
}

/// A prompt as text, or as token ids (no tokenizer needed).
pub enum Prompt<'a> {
    /// Text the model's tokenizer encodes.
    Text(&'a str),
    /// Token ids, each below the vocabulary size.
    Tokens(&'a [u32]),
}

impl Prompt<'_> {
    /// The prompt's token ids for the model of `loaded`.
    fn ids(&self, loaded: &LoadedPlan) -> Result<Vec<u32>> {
        match *self {
            Prompt::Text(text) => Tokenizer::from_gguf(loaded.gguf()?)?.encode(text, true),
            Prompt::Tokens(ids) => {
                let vocab = loaded.plan.model.vocab;
                if let Some(id) = ids.iter().find(|&&id| id >= vocab) {
                    bail!("--tokens: token id {id} is not below the vocabulary size {vocab}");
                }
                Ok(ids.to_vec())
            }
        }
    }
}

/// `gate`: exit status 1 and the first mismatch when any logit bit differs; with `repeat`,
/// the number of candidate runs that differed.
pub fn gate(
    plan: &Path,
    reference: &Path,
    prompt: Prompt,
    n: usize,
    repeat: usize,
    run: &RunArgs,
) -> Result<ExitCode> {
    let candidate = run.load(plan)?;
    let reference = run.load(reference)?;
    let ids = prompt.ids(&candidate)?;
    let options = run.options(SamplerConfig::GREEDY);
    let report = gate_repeated(&reference, &candidate, &ids, n, options, repeat)?;
    if !options.holds_readback(&candidate.plan) {
        return Ok(ExitCode::SUCCESS);
    }
    let arms: Vec<&str> = report
        .arms
        .iter()
        .map(|a| match a {
            Arm::Serial => "serial",
            Arm::Pipelined => "pipelined",
        })
        .collect();
    let runs = if report.runs > 1 {
        format!(
            "; {} of {} runs differed",
            report.failed_runs,
            report.runs * report.arms.len()
        )
    } else {
        String::new()
    };
    match report.mismatch {
        Some(m) => {
            println!(
                "gate failed: {} differs from {}: {m}{runs}",
                plan.display(),
                reference.path.display()
            );
            Ok(ExitCode::FAILURE)
        }
        None => {
            println!(
                "gate passed: {} matches {} bit for bit ({} arms x {} runs x {} steps x {} logits){runs}",
                plan.display(),
                reference.path.display(),
                arms.join(" + "),
                report.runs,
                report.steps,
                report.vocab
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How `compare` judges and reports the backend's steps.
#[derive(Clone, Copy)]
pub struct CompareHow {
    /// Largest relative logit error accepted.
    pub tolerance: f64,
    /// Feed the CPU's sequence to the backend.
    pub teacher_forced: bool,
    /// Print each compared step's relative error.
    pub per_step: bool,
    /// `--conditioning`: the relative noise of the CPU's second, perturbed reference run.
    pub conditioning: Option<f32>,
    /// `--quantile`: the quantile of the well-conditioned steps' errors judged (1: the max).
    pub quantile: f64,
}

/// `gate --batch`: the continuous-batching gate (`crate::batch_gate`) of `plan` against
/// `reference`, in both arms.
pub fn gate_batch(plan: &Path, reference: &Path, run: &RunArgs) -> Result<ExitCode> {
    if run.processes.is_some() {
        bail!("--process/--processes/--rendezvous: gate --batch runs every rank in one process");
    }
    let candidate = run.load(plan)?;
    let reference = run.load(reference)?;
    let slots = candidate.plan.runtime.max_sequences as usize;
    let seqs = sequences(candidate.plan.model.vocab, slots, 0);
    let options = run.options(SamplerConfig::GREEDY);
    let arms = [Arm::Serial, Arm::Pipelined];
    let report = batch_gate(&reference, &candidate, &seqs, options, &arms)?;
    for line in &report.activity {
        eprintln!("{line}");
    }
    let widest: Vec<String> = report.widest.iter().map(usize::to_string).collect();
    match report.mismatch {
        Some(m) => {
            println!(
                "batch gate failed: {} together differs from {} alone: {m}",
                plan.display(),
                reference.path.display()
            );
            Ok(ExitCode::FAILURE)
        }
        None => {
            println!(
                "batch gate passed: {} sequences together in {} match their runs alone in {} bit for bit (serial + pipelined, at most {} sequences in one step, {} generated tokens x {} logits; the argmaxes of sequences marked greedy, all or every other, equal theirs)",
                seqs.len(),
                plan.display(),
                reference.path.display(),
                widest.join(" / "),
                report.tokens,
                candidate.plan.model.vocab
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The largest difference of `b` from `a`, relative to the largest magnitude of `a`.
fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let scale = a.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
    let err = a.iter().zip(b).fold(0.0f64, |m, (&x, &y)| {
        m.max((f64::from(x) - f64::from(y)).abs())
    });
    if scale > 0.0 {
        err / scale
    } else {
        err
    }
}

/// `compare`: the plan on the chosen backend against the CPU backend, greedy; fails when the
/// tokens differ or a step's relative logit error is above `tolerance`. With `teacher_forced`
/// the backend is fed the CPU's sequence (prompt, then the CPU's greedy tokens), so all steps
/// compare logits on the same history, and only the error decides.
pub fn compare(
    plan: &Path,
    prompt: &str,
    n: usize,
    how: CompareHow,
    run: &RunArgs,
) -> Result<ExitCode> {
    let CompareHow {
        tolerance,
        teacher_forced,
        per_step,
        conditioning,
        quantile,
    } = how;
    if conditioning.is_some() && !teacher_forced {
        bail!(
            "--conditioning compares the CPU with itself on one history: it needs --teacher-forced"
        );
    }
    let loaded = run.load(plan)?;
    let ids = Tokenizer::from_gguf(loaded.gguf()?)?.encode(prompt, true)?;
    let options = run.options(SamplerConfig::GREEDY);
    let cpu = EngineOptions {
        backend: Backend::Cpu,
        ..options
    };
    let want = decode_all(&loaded, cpu, &ids, n)?;
    if teacher_forced && ids.is_empty() {
        bail!("--teacher-forced needs a prompt of at least one token");
    }
    // teacher-forced, step i's logits come from the sequence up to its input; the CPU's step i
    // fed its prompt token, or its own token of step i - 1 after the prompt
    let fed: Vec<u32> = match teacher_forced {
        true => ids
            .iter()
            .copied()
            .chain(want[ids.len() - 1..want.len() - 1].iter().map(|o| o.token))
            .collect(),
        false => Vec::new(),
    };
    let got = if teacher_forced {
        decode_all(&loaded, options, &fed, 1)?
    } else {
        decode_all(&loaded, options, &ids, n)?
    };
    // steps where the CPU moves past the tolerance under noise of the given size: their
    // errors say nothing about the backend
    let ill: Vec<bool> = match conditioning {
        Some(r) => {
            let noisy = EngineOptions {
                perturb: Some(r),
                ..cpu
            };
            let shaken = decode_all(&loaded, noisy, &fed, 1)?;
            want.iter()
                .zip(&shaken)
                .map(|(a, b)| relative_error(&a.logits, &b.logits) > tolerance)
                .collect()
        }
        None => vec![false; want.len()],
    };
    // greedily, a step's logits are comparable while the tokens fed so far agree: up to and
    // including the first step whose sampled token differs; teacher-forced, every step is
    let diverged = want.iter().zip(&got).position(|(a, b)| a.token != b.token);
    let compared = match diverged {
        Some(d) if !teacher_forced => d + 1,
        _ => want.len().min(got.len()),
    };
    let (mut worst, mut worst_ill) = ((0.0f64, 0usize), None::<(f64, usize)>);
    let mut ill_steps = Vec::new();
    let mut steps = Vec::new();
    let (mut errors, mut judged) = (Vec::with_capacity(compared), Vec::new());
    for (i, (a, b)) in want.iter().zip(&got).take(compared).enumerate() {
        let rel = relative_error(&a.logits, &b.logits);
        errors.push(rel);
        if !ill[i] {
            judged.push(rel);
        }
        if per_step {
            steps.push(format!(
                "step {i}: relative logit error {rel:.3e}, picks {} {}{}",
                a.token,
                b.token,
                if ill[i] { " (ill-conditioned)" } else { "" }
            ));
        }
        if ill[i] {
            ill_steps.push(i);
            if worst_ill.is_none_or(|(w, _)| rel > w || rel.is_nan()) {
                worst_ill = Some((rel, i));
            }
        } else if rel > worst.0 || rel.is_nan() {
            worst = (rel, i);
        }
    }
    let picks = |o: &[crate::engine::StepOutput]| o.iter().map(|s| s.token).collect::<Vec<_>>();
    let tokens = match diverged {
        None => format!("same greedy tokens over {} steps", want.len()),
        Some(_) if teacher_forced => {
            let (w, g) = (picks(&want), picks(&got));
            let differ = w.iter().zip(&g).filter(|(a, b)| a != b).count();
            format!(
                "teacher-forced over {} steps, the backend's pick differs at {differ}",
                want.len()
            )
        }
        Some(d) => format!(
            "tokens differ at step {d} (cpu {}, {} {})",
            want[d].token,
            options.backend.name(),
            got[d].token
        ),
    };
    let tokens_ok = diverged.is_none() || teacher_forced;
    // a comparison that sets most of its steps apart shows nothing: at most a quarter may be
    let few_apart = ill_steps.len() * 4 <= compared;
    // the judged error: the max of the well-conditioned steps, or their --quantile
    judged.sort_by(f64::total_cmp);
    let judged_error = nearest_rank(&judged, quantile).unwrap_or(0.0);
    // a NaN logit error fails whatever the quantile
    let within = !judged.iter().any(|e| e.is_nan()) && judged_error <= tolerance;
    let ok = tokens_ok && few_apart && want.len() == got.len() && within;
    if !options.holds_readback(&loaded.plan) {
        return Ok(ExitCode::SUCCESS);
    }
    steps.iter().for_each(|line| println!("{line}"));
    let apart = match conditioning {
        Some(r) => format!(
            "; ill-conditioned steps {ill_steps:?} apart (the cpu moves past the tolerance under {r:e} relative noise){}{}",
            match worst_ill {
                Some((e, i)) => format!(", max error there {e:.3e} at step {i}"),
                None => String::new(),
            },
            if few_apart {
                String::new()
            } else {
                format!(
                    ", more than a quarter of the {compared} steps (too ill-conditioned to compare)"
                )
            }
        ),
        None => String::new(),
    };
    let judged_line = match quantile < 1.0 {
        true => format!("; {quantile} quantile of the other steps {judged_error:.3e} judged"),
        false => String::new(),
    };
    println!(
        "compare {}: {tokens}; max relative logit error {:.3e} at step {} (tolerance {tolerance:e}; {}){apart}{judged_line}: {}",
        plan.display(),
        worst.0,
        worst.1,
        spread(&errors, tolerance),
        if ok { "ok" } else { "FAILED" }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The spread of the compared steps' relative errors (ill-conditioned ones included): the
/// median, the 95th percentile (nearest rank) and how many steps are past `tolerance`.
fn spread(errors: &[f64], tolerance: f64) -> String {
    let mut sorted = errors.to_vec();
    sorted.sort_by(f64::total_cmp);
    let past = errors
        .iter()
        .filter(|&&e| e > tolerance || e.is_nan())
        .count();
    match (nearest_rank(&sorted, 0.5), nearest_rank(&sorted, 0.95)) {
        (Some(median), Some(p95)) => format!(
            "median {median:.1e}, p95 {p95:.1e}, {past} of {} steps past it",
            errors.len()
        ),
        _ => "no step compared".to_string(),
    }
}

/// The `q` quantile (nearest rank) of the ascending `sorted`; `None` when it is empty.
fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
}

/// The copy bandwidth of the device of the plan's first rank.
fn cuda_copy_bandwidth(plan: &memra_compiler::plan::Plan) -> Result<f64> {
    let ordinal = plan.ranks.first().map_or(0, |r| r.device) as usize;
    let dev = crate::cuda::CudaDevice::open(ordinal)?;
    let stream = dev.new_stream()?;
    dev.copy_bandwidth(&stream)
}

/// Mean and sample standard deviation.
pub(super) fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let mean = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let var = xs.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (xs.len().max(2) - 1) as f64;
    (mean, var.sqrt())
}

/// What `bench` measures, alone or with `--batch`: `plan` run as `run` says, a prompt of
/// `prompt` tokens then `n` generated, over `reps` timed repetitions after one warm-up, the
/// result as one JSON object (`json`) or a line.
pub struct Bench<'a> {
    pub plan: &'a Path,
    pub prompt: usize,
    pub n: usize,
    pub reps: usize,
    pub json: bool,
    pub run: &'a RunArgs,
    /// A text file whose tokens are the prompt, instead of `prompt` synthetic tokens.
    pub text: Option<&'a Path>,
    /// On a speculative plan: drafts replayed from the plain continuation, at most this many
    /// per step, instead of the plan's draft source.
    pub draft_replay: Option<usize>,
}

impl Bench<'_> {
    /// The prompt: the tokens of `text` when given, else `prompt` tokens (at least one)
    /// spread over the vocabulary.
    fn prompt_tokens(&self, loaded: &LoadedPlan) -> Result<Vec<u32>> {
        if let Some(file) = self.text {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let ids = Tokenizer::from_gguf(loaded.gguf()?)?.encode(&text, true)?;
            if ids.is_empty() {
                bail!("--text {}: the file has no tokens", file.display());
            }
            return Ok(ids);
        }
        let vocab = u64::from(loaded.plan.model.vocab.max(1));
        Ok((0..self.prompt.max(1) as u64)
            .map(|i| ((1 + i * 7919) % vocab) as u32)
            .collect())
    }

    /// The plan, refused when the prompt (at least one token) and the generated tokens would
    /// not fit one sequence of its context.
    pub(super) fn load(&self) -> Result<LoadedPlan> {
        let loaded = self.run.load(self.plan)?;
        let (plan, prompt, n) = (self.plan, self.prompt, self.n);
        let max_context = loaded.plan.runtime.max_context as usize;
        // the last generated token is sampled, never embedded
        let positions = prompt.max(1).saturating_add(n) - 1;
        if positions > max_context {
            bail!(
                "--prompt {prompt} and -n {n}: a sequence would take {positions} positions, more than {}'s runtime.max_context {max_context}; allowed: --prompt plus -n at most {}",
                plan.display(),
                max_context + 1
            );
        }
        Ok(loaded)
    }
}

/// The backend as a bench result names it: `cpu N threads` or `cuda`.
pub(super) fn backend_words(options: &EngineOptions) -> String {
    match options.backend {
        Backend::Cpu => format!("cpu {} threads", options.threads),
        Backend::Cuda => "cuda".to_string(),
    }
}

/// `bench`: prefill and decode speed, mean ± sd over `reps` timed runs after one warm-up run.
/// A run feeds a prompt of `prompt` tokens (at least one; spread over the vocabulary, as
/// `llama-bench` uses random ones) and generates `n` (at least 2; `reps` at least 1, both
/// checked by the command line): prefill tok/s is the prompt over the
/// time to first token, decode tok/s the tokens after the first over their time. The weight
/// bytes a token reads give the decode's achieved bandwidth, on CUDA next to the device's
/// measured copy bandwidth.
pub fn bench(bench: &Bench) -> Result<ExitCode> {
    let (plan, n) = (bench.plan, bench.n);
    let loaded = bench.load()?;
    let options = bench.run.options(SamplerConfig::GREEDY);
    let engine = open(&loaded, options)?;
    let prints = options.holds_readback(&loaded.plan);
    super::notice_prompt_mode(&*engine, &loaded.plan, prints);
    let mode = engine.prompt_mode();
    for line in engine.report().into_iter().filter(|_| prints) {
        eprintln!("{line}");
    }
    let runtime = &loaded.plan.runtime;
    let mut session = Session::new(engine, runtime.in_flight, runtime.max_context);
    let ids = bench.prompt_tokens(&loaded)?;
    let (mut rates, mut prefill, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
    let mut speculative = match (loaded.plan.speculative, bench.draft_replay) {
        (Some(sp), replay) => Some(SpeculativeRuns::new(sp, replay)),
        (None, Some(_)) => bail!(
            "--draft-replay: {} has no [speculative] section; compile a placement with one",
            plan.display()
        ),
        (None, None) => None,
    };
    for rep in 0..=bench.reps {
        session.reset();
        // The prompt and the first token, then the other tokens in a run of their own: timing
        // them from the first token's readback measured nothing when the readbacks of a
        // pipelined plan's steps, enqueued ahead, arrived together (-n 2: 0.000 ms/token).
        let start = Instant::now();
        let first = session.run(&ids, 1, ids.len() - 1, |_, _| Ok(Flow::Continue))?;
        let to_first = start.elapsed().as_secs_f64();
        let decode = Instant::now();
        let generated = session.run(&first, n - 1, 0, |_, _| Ok(Flow::Continue))?;
        let secs = decode.elapsed().as_secs_f64();
        let continuation = [&first[..], &generated].concat();
        if let Some(runs) = &mut speculative {
            // the plain runs decode with `run`, which never speculates
            if rep == 0 {
                session = runs.session(session, &ids, &continuation);
            }
            runs.run(&mut session, &ids, &continuation, rep > 0)?;
        }
        // The first repetition warms caches and thread pools and is not counted.
        if rep > 0 {
            rates.push(generated.len() as f64 / secs.max(1e-9));
            prefill.push(ids.len() as f64 / to_first.max(1e-9));
            ttft.push(to_first * 1000.0);
        }
    }
    if !prints {
        return Ok(ExitCode::SUCCESS);
    }
    let (mean, sd) = mean_sd(&rates);
    let (pp, pp_sd) = mean_sd(&prefill);
    let (ttft_ms, _) = mean_sd(&ttft);
    let on = backend_words(&options);
    let chunk = match mode {
        PromptMode::Chunks(rows) => format!("prefill chunks of {rows}"),
        PromptMode::TokenByToken(_) => "token by token".to_string(),
    };
    let p = &loaded.plan;
    let bytes = p.weight_bytes_per_token();
    let gbs = bytes as f64 * mean / 1e9;
    let copy = match options.backend {
        Backend::Cpu => None,
        Backend::Cuda => Some(cuda_copy_bandwidth(p)?),
    };
    // graph capture is the cuda backend's: a cpu run names none
    let capture = match options.backend {
        Backend::Cpu => None,
        Backend::Cuda => Some(format!("{:?}", p.runtime.capture).to_lowercase()),
    };
    if bench.json {
        println!(
            "{{\"plan\": {:?}, \"placement_hash\": {:?}, \"backend\": {:?}, \"capture\": {}, \"prompt_tokens\": {}, \"prompt_mode\": {:?}, \"prefill_tok_s\": {pp:.2}, \"prefill_tok_s_sd\": {pp_sd:.2}, \"ttft_ms\": {ttft_ms:.3}, \"tokens\": {n}, \"reps\": {}, \"tok_s\": {mean:.2}, \"tok_s_sd\": {sd:.2}, \"ms_per_token\": {:.4}, \"weight_bytes_per_token\": {bytes}, \"gb_s\": {gbs:.1}, \"copy_gb_s\": {}, \"share_of_copy\": {}}}",
            plan.display().to_string(),
            p.placement_hash,
            on,
            capture.as_deref().map_or("null".into(), |c| format!("{c:?}")),
            ids.len(),
            chunk,
            rates.len(),
            1000.0 / mean,
            copy.map_or("null".into(), |c| format!("{c:.1}")),
            copy.map_or("null".into(), |c| format!("{:.4}", gbs / c)),
        );
    } else {
        let share = copy.map_or(String::new(), |c| {
            format!(" = {:.1}% of the {c:.0} GB/s device copy", 100.0 * gbs / c)
        });
        // the prompt part only when one was asked for, so the decode line keeps its shape
        let prefill = if bench.prompt > 0 || bench.text.is_some() {
            format!(
                "prompt {} tokens ({chunk}): {pp:.1} ± {pp_sd:.1} tok/s, time to first token {ttft_ms:.1} ms; ",
                ids.len()
            )
        } else {
            String::new()
        };
        let capture = capture.map_or(String::new(), |c| format!(", capture {c}"));
        println!(
            "{}: {on}{capture}, placement {}, {prefill}{n} tokens x {} reps: {mean:.1} ± {sd:.1} tok/s ({:.3} ms/token), {:.1} MB/token, {gbs:.1} GB/s{share}",
            plan.display(),
            p.placement_hash,
            rates.len(),
            1000.0 / mean,
            bytes as f64 / 1e6,
        );
    }
    if let Some(runs) = &speculative {
        let k = p.speculative.map_or(0, |s| s.tokens);
        println!("{}", runs.measured().report(bench.json, k, mean));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn spread_gives_the_median_p95_and_the_steps_past_the_tolerance() {
        let errors: Vec<f64> = (1..=20).map(|i| f64::from(i) * 1e-3).collect();
        assert_eq!(
            spread(&errors, 0.015),
            "median 1.0e-2, p95 1.9e-2, 5 of 20 steps past it"
        );
        assert_eq!(
            spread(&[f64::NAN, 0.0], 1.0),
            "median 0.0e0, p95 NaN, 1 of 2 steps past it"
        );
        assert_eq!(spread(&[], 1.0), "no step compared");
    }
}
