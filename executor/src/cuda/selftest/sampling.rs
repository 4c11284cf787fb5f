//! The device sampler against the CPU one: for each setting (temperature, top-k, top-p, seed)
//! a stream of random logit vectors goes through `crate::sample::Sampler` and through
//! `sample_f32` with its device step counter, eagerly and as a replayed CUDA graph; the tokens
//! must be identical. Half the vectors are coarsely rounded so that many logits tie (the order
//! then falls to the ids) and some carry -inf (masked tokens).

use anyhow::Result;
use memra_gguf::rng::Rng;

use super::{random, Ctx};
use crate::cuda::capture;
use crate::sample::{Sampler, SamplerConfig};

/// Logit vectors per setting and vocabulary size.
const VECTORS: usize = 200;

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    let settings = [
        (0.8, 40, 0.95, 7),
        (1.0, 256, 1.0, 1),
        (0.5, 5, 0.5, 123),
        (1.5, 100, 0.9, 99),
        (3.0, 256, 0.999, u64::MAX - 4),
        (0.05, 2, 1.0, 0),
    ];
    for n in [49_157, 1_000, 100] {
        let vectors = logit_vectors(&mut cx.rng, n);
        for setting in settings {
            eager(cx, &config(setting), &vectors)?;
        }
    }
    let vectors = logit_vectors(&mut cx.rng, 32_000);
    replayed(cx, &config(settings[0]), &vectors)
}

fn config((temperature, top_k, top_p, seed): (f32, usize, f32, u64)) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p,
        seed,
    }
}

/// `VECTORS` logit vectors of length `n`: every other one rounded to multiples of 0.5 (ties),
/// every fifth with a few -inf entries.
fn logit_vectors(rng: &mut Rng, n: usize) -> Vec<Vec<f32>> {
    (0..VECTORS)
        .map(|v| {
            let mut x = random(rng, n, 8.0);
            if v % 2 == 1 {
                x.iter_mut().for_each(|l| *l = (*l * 2.0).round() / 2.0);
            }
            if v % 5 == 0 {
                for j in 0..n.min(7) {
                    x[(j * 7919) % n] = f32::NEG_INFINITY;
                }
            }
            x
        })
        .collect()
}

/// The CPU sampler's tokens for `vectors`, in order (draw numbers 0, 1, ...).
fn cpu_tokens(config: &SamplerConfig, vectors: &[Vec<f32>]) -> Vec<u32> {
    let mut s = Sampler::new(*config);
    vectors.iter().map(|x| s.sample(x)).collect()
}

fn describe(config: &SamplerConfig, n: usize, got: &[u32], want: &[u32]) -> (String, usize) {
    let bad: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
    let mut case = format!(
        "n={n} t={} k={} p={} seed={}",
        config.temperature, config.top_k, config.top_p, config.seed
    );
    if let Some(&i) = bad.first() {
        case += &format!(" (vector {i}: got {}, want {})", got[i], want[i]);
    }
    (case, bad.len())
}

fn eager(cx: &mut Ctx, config: &SamplerConfig, vectors: &[Vec<f32>]) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let n = vectors[0].len();
    let mut step = dev.alloc::<u64>(s, 1)?;
    let mut token = dev.alloc::<u32>(s, 1)?;
    let mut got = Vec::new();
    for x in vectors {
        dev.sample(s, &dev.upload(s, x)?, config, &mut step, &mut token)?;
        got.push(dev.download(s, &token)?[0]);
    }
    let (case, bad) = describe(config, n, &got, &cpu_tokens(config, vectors));
    cx.report.exact("sample_f32", case, bad);
    Ok(())
}

/// One captured launch replayed per vector: the step counter must advance on every replay.
fn replayed(cx: &mut Ctx, config: &SamplerConfig, vectors: &[Vec<f32>]) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let n = vectors[0].len();
    let mut x = dev.alloc::<f32>(s, n)?;
    let mut step = dev.alloc::<u64>(s, 1)?;
    let mut token = dev.alloc::<u32>(s, 1)?;
    s.synchronize()?;
    let graph = match capture(s, || dev.sample(s, &x, config, &mut step, &mut token)) {
        Ok(g) => g,
        Err(e) => {
            println!("sample_f32 capture failed: {e}");
            cx.report
                .exact("sample_f32", "graph capture".to_string(), 1);
            return Ok(());
        }
    };
    let mut got = Vec::new();
    for v in vectors {
        dev.write(s, v, &mut x)?;
        graph.replay()?;
        got.push(dev.download(s, &token)?[0]);
    }
    let (case, bad) = describe(config, n, &got, &cpu_tokens(config, vectors));
    cx.report
        .exact("sample_f32", format!("graph replay {case}"), bad);
    Ok(())
}
