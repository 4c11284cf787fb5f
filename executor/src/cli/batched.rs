//! `memra-run bench --batch B`: aggregate decode speed of B sequences decoded together
//! (continuous batching, `crate::batch`): every repetition starts B sequences of a
//! `--prompt`-token prompt each at once and decodes `-n` greedy tokens of each.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Result};

use super::tools::{backend_words, mean_sd, Bench};
use crate::batch::{window, Batch};
use crate::engine::open;
use crate::sample::SamplerConfig;

/// What one timed repetition measured.
struct Rep {
    /// Until every sequence had its first token.
    ttft_ms: f64,
    /// Tokens generated after that, over their time.
    tok_s: f64,
    /// Each sequence's time per token after that.
    ms_per_token: f64,
}

/// `bench --batch`: `batch` sequences of `prompt` tokens (at least one) generating `n` each,
/// `reps` timed repetitions after one warm-up. Each repetition's prompts differ from the
/// last ones from their first token on, so no slot reuses a cached prefix.
pub fn bench_batch(bench: &Bench, batch: usize) -> Result<ExitCode> {
    let plan = bench.plan;
    if bench.run.processes.is_some() {
        bail!("--process/--processes/--rendezvous: bench --batch runs every rank in one process");
    }
    let loaded = bench.load()?;
    let slots = loaded.plan.runtime.max_sequences as usize;
    if batch > slots {
        bail!(
            "--batch {batch}: {} decodes 1..={slots} sequences together (its runtime.max_sequences); compile the placement with max_sequences = {batch} or more",
            plan.display()
        );
    }
    let options = bench.run.options(SamplerConfig::GREEDY);
    let engine = open(&loaded, options)?;
    for line in engine.report() {
        eprintln!("{line}");
    }
    let window = window(&loaded.plan, options.arm);
    let mut engine = Batch::new(engine, slots, window);
    let n = bench.n.max(2);
    let (prompt, vocab) = (
        bench.prompt.max(1),
        u64::from(loaded.plan.model.vocab.max(1)),
    );
    let mut measured = Vec::new();
    for rep in 0..=bench.reps.max(1) {
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|s| {
                let first = (rep * batch + s) as u64 * (prompt as u64 + 1);
                (0..prompt as u64)
                    .map(|i| ((1 + (first + i) * 7919) % vocab) as u32)
                    .collect()
            })
            .collect();
        let m = decode_together(&mut engine, &prompts, n)?;
        // The first repetition warms caches and thread pools and is not counted.
        if rep > 0 {
            measured.push(m);
        }
    }
    for line in engine.activity() {
        eprintln!("{line}");
    }
    let (tok_s, tok_s_sd) = mean_sd(&measured.iter().map(|m| m.tok_s).collect::<Vec<_>>());
    let (ttft_ms, _) = mean_sd(&measured.iter().map(|m| m.ttft_ms).collect::<Vec<_>>());
    let (ms_per_token, _) = mean_sd(&measured.iter().map(|m| m.ms_per_token).collect::<Vec<_>>());
    let on = backend_words(&options);
    let p = &loaded.plan;
    if bench.json {
        println!(
            "{{\"plan\": {:?}, \"placement_hash\": {:?}, \"backend\": {on:?}, \"batch\": {batch}, \"prompt_tokens\": {prompt}, \"ttft_ms\": {ttft_ms:.3}, \"tokens\": {n}, \"reps\": {}, \"tok_s\": {tok_s:.2}, \"tok_s_sd\": {tok_s_sd:.2}, \"tok_s_per_sequence\": {:.2}, \"ms_per_token\": {ms_per_token:.4}}}",
            plan.display().to_string(),
            p.placement_hash,
            measured.len(),
            tok_s / batch as f64,
        );
    } else {
        println!(
            "{}: {on}, placement {}, batch {batch}, prompt {prompt} tokens each: time to every first token {ttft_ms:.1} ms; {n} tokens x {batch} sequences x {} reps: {tok_s:.1} ± {tok_s_sd:.1} tok/s aggregate, {:.1} tok/s per sequence ({ms_per_token:.3} ms/token)",
            plan.display(),
            p.placement_hash,
            measured.len(),
            tok_s / batch as f64,
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts every prompt at once and decodes `n` greedy tokens of each.
fn decode_together(batch: &mut Batch, prompts: &[Vec<u32>], n: usize) -> Result<Rep> {
    let start = Instant::now();
    let mut slots = Vec::with_capacity(prompts.len());
    for p in prompts {
        match batch.join(p)? {
            Some(slot) => {
                batch.greedy(slot)?;
                slots.push(slot);
            }
            None => bail!("no free sequence slot for sequence {}", slots.len()),
        }
    }
    let mut generated = vec![0usize; batch.slots()];
    let mut started: Option<Instant> = None;
    let mut after = 0usize;
    while batch.used() > 0 {
        let stepped = batch.step()?;
        if started.is_some() {
            after += stepped.done.len();
        }
        for d in &stepped.done {
            generated[d.slot] += 1;
            if generated[d.slot] == n {
                batch.leave(d.slot)?;
            } else {
                batch.feed(d.slot, stepped.argmax(d)?)?;
            }
        }
        if started.is_none() && slots.iter().all(|&s| generated[s] > 0) {
            started = Some(Instant::now());
        }
    }
    let started = started.expect("invariant: every sequence generated a token");
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let per_sequence = after as f64 / prompts.len() as f64;
    Ok(Rep {
        ttft_ms: (started - start).as_secs_f64() * 1000.0,
        tok_s: after as f64 / secs,
        ms_per_token: secs * 1000.0 / per_sequence.max(1.0),
    })
}
