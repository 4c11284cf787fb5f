//! Token sampling: greedy argmax, or temperature with optional top-k and top-p truncation.
//! The draw for the n-th sampled token is a pure function of (seed, n), so the same seed always
//! gives the same text. Every step of the non-greedy path is specified down to the f32
//! operation (no libm, no fused multiply-add, sums in a fixed order) because the CUDA sampler
//! (kernels/sample.cu) mirrors it and must pick the same token for the same logits and seed.

use anyhow::{bail, Result};

/// How the next token is picked from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; 0 picks the argmax (greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 keeps
    /// all.
    pub top_p: f32,
    /// Seed of the random stream.
    pub seed: u64,
}

impl SamplerConfig {
    /// Argmax decoding, ties broken towards the lowest id (as llama.cpp's greedy sampler).
    pub const GREEDY: SamplerConfig = SamplerConfig {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
    };

    /// Checks the ranges of the settings.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            bail!(
                "--temp must be a finite number >= 0, got {}",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("--top-p must be in (0, 1], got {}", self.top_p);
        }
        Ok(())
    }

    /// Whether the argmax decides (no random draw).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// A sampler with its step counter; one per sequence.
#[derive(Debug)]
pub struct Sampler {
    config: SamplerConfig,
    step: u64,
    keys: Vec<u64>,
    weights: Vec<f32>,
}

impl Sampler {
    /// A sampler whose random stream starts at `config.seed`.
    pub fn new(config: SamplerConfig) -> Sampler {
        Sampler {
            config,
            step: 0,
            keys: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// Moves the random stream past `draws` picks that were never made.
    pub fn skip(&mut self, draws: u64) {
        self.step += draws;
    }

    /// Picks the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let step = self.step;
        self.step += 1;
        if self.config.is_greedy() {
            return argmax(logits);
        }
        let keys = &mut self.keys;
        keys.clear();
        keys.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| rank_key(l, i as u32)),
        );
        let k = match self.config.top_k {
            0 => keys.len(),
            k => k.min(keys.len()),
        };
        // Keys are unique, so the candidates and their order do not depend on the sort.
        if k < keys.len() {
            keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
            keys.truncate(k);
        }
        keys.sort_unstable_by(|a, b| b.cmp(a));
        let id = |key: u64| !(key as u32);
        let top = logits[id(keys[0]) as usize];
        let t = self.config.temperature;
        let w = &mut self.weights;
        w.clear();
        w.extend(
            keys.iter()
                .map(|&key| exp_nonpositive((logits[id(key) as usize] - top) / t)),
        );
        let keep = top_p_prefix(w, self.config.top_p);
        id(keys[pick(&w[..keep], draw(self.config.seed, step))])
    }
}

/// Index of the largest logit; the lowest index among equals; NaN never wins, and 0 when no
/// logit beats -inf (the rule of the device's `argmax_f32`, kernels/sample.cu, which a batch
/// of greedy sequences takes instead). Two passes the compiler vectorizes: the largest value,
/// in 16 lanes, then the first index holding it (a batched step takes this once per sequence
/// over the whole vocabulary).
pub fn argmax(logits: &[f32]) -> u32 {
    let larger = |best: f32, l: f32| if l > best { l } else { best };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = logits.chunks_exact(16);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |best, &l| larger(best, l));
    for chunk in chunks {
        for (lane, &l) in lanes.iter_mut().zip(chunk) {
            *lane = larger(*lane, l);
        }
    }
    let max = lanes.into_iter().fold(tail, larger);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    // `==` takes -0 and +0 as one value, as `>` does
    logits.iter().position(|&l| l == max).unwrap_or(0) as u32
}

/// The candidate order as one integer, larger first: the logit by `f32::total_cmp` in the high
/// half, then the lower id (its complement in the low half); unique per id.
fn rank_key(logit: f32, id: u32) -> u64 {
    let b = logit.to_bits();
    let ordered = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    (u64::from(ordered) << 32) | u64::from(!id)
}

/// The uniform draw in [0, 1) for sampled token number `step`: element `step` of the
/// splitmix64 sequence started at `seed`, top 24 bits, so the f32 is exact.
fn draw(seed: u64, step: u64) -> f32 {
    let mut z = seed.wrapping_add(step.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 * f32::from_bits(0x3380_0000)
}

/// e^x for x <= 0 from correctly rounded f32 operations only (reproducible on any IEEE
/// device): 2^k times a degree-6 polynomial on the reduced argument; 0 below -87 or for NaN.
fn exp_nonpositive(x: f32) -> f32 {
    if x.is_nan() || x < -87.0 {
        return 0.0;
    }
    let k = (x * f32::from_bits(0x3fb8_aa3b) + 0.5).floor();
    let r = (x - k * f32::from_bits(0x3f31_7200)) - k * f32::from_bits(0x35bf_be8e);
    let mut p = f32::from_bits(0x3ab6_0b61);
    for c in [
        0x3c08_8889,
        0x3d2a_aaab,
        0x3e2a_aaab,
        0x3f00_0000,
        0x3f80_0000,
        0x3f80_0000,
    ] {
        p = p * r + f32::from_bits(c);
    }
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// How many leading weights (sorted, unnormalized) to keep: the shortest prefix whose running
/// sum reaches `top_p` times the total; all when `top_p` is 1.
fn top_p_prefix(w: &[f32], top_p: f32) -> usize {
    if top_p >= 1.0 {
        return w.len();
    }
    let cut = top_p * w.iter().fold(0.0f32, |s, &x| s + x);
    let mut acc = 0.0f32;
    for (i, &x) in w.iter().enumerate() {
        acc += x;
        if acc >= cut {
            return i + 1;
        }
    }
    w.len()
}

/// The first index whose running sum exceeds `u` times the sum of `w`; the last if none does.
fn pick(w: &[f32], u: f32) -> usize {
    let target = u * w.iter().fold(0.0f32, |s, &x| s + x);
    let mut acc = 0.0f32;
    for (i, &x) in w.iter().enumerate() {
        acc += x;
        if target < acc {
            return i;
        }
    }
    w.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: a scan from -inf at index 0, taking an index only for a larger logit
    /// (by `>`, so never a NaN, and the first of equals).
    fn argmax_by_scan(logits: &[f32]) -> u32 {
        let (mut best, mut max) = (0, f32::NEG_INFINITY);
        for (i, &l) in logits.iter().enumerate() {
            if l > max {
                (best, max) = (i, l);
            }
        }
        best as u32
    }

    #[test]
    fn argmax_is_the_scans_first_largest_index() {
        let mut rng = memra_gguf::rng::Rng::new(7);
        let special = [f32::NAN, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 2.0];
        for n in [0, 1, 2, 15, 16, 17, 33, 1000, 49152] {
            for trial in 0..20 {
                // coarse values so ties are common; some special values sprinkled in
                let mut v: Vec<f32> = (0..n).map(|_| (rng.next_u64() % 7) as f32 - 3.0).collect();
                for _ in 0..(trial % 4) {
                    if n > 0 {
                        let at = (rng.next_u64() % n as u64) as usize;
                        v[at] = special[(rng.next_u64() % special.len() as u64) as usize];
                    }
                }
                if trial == 7 && n > 0 {
                    v[0] = f32::NAN;
                }
                assert_eq!(argmax(&v), argmax_by_scan(&v), "n {n} trial {trial}: {v:?}");
            }
        }
    }

    fn config(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplerConfig {
        SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed,
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerConfig::GREEDY);
        assert_eq!(s.sample(&[0.5, 2.0, -1.0, 2.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(config(1.0, 0, 1.0, seed));
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn top_k_and_top_p_truncate() {
        let logits = [1.0, 5.0, 4.9, 0.0, 4.8];
        let mut s = Sampler::new(config(1.0, 2, 1.0, 3));
        for _ in 0..200 {
            assert!(matches!(s.sample(&logits), 1 | 2));
        }
        // The top token alone holds more than 5% of the mass.
        let mut s = Sampler::new(config(1.0, 0, 0.05, 3));
        for _ in 0..200 {
            assert_eq!(s.sample(&logits), 1);
        }
    }

    #[test]
    fn the_exponential_is_close_to_libm() {
        for i in 0..87_000 {
            let x = -(i as f32) * 1e-3;
            let (got, want) = (f64::from(exp_nonpositive(x)), f64::from(x).exp());
            assert!((got - want).abs() <= 4e-7 * want, "e^{x}: {got} vs {want}");
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(f32::NAN), 0.0);
    }

    #[test]
    fn draws_are_uniform_enough() {
        let n = 100_000;
        let u: Vec<f32> = (0..n).map(|s| draw(42, s)).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = u.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [0.0, 1.0, 2.0];
        let mut s = Sampler::new(config(1.0, 0, 1.0, 11));
        let mut counts = [0usize; 3];
        let n = 30_000;
        for _ in 0..n {
            counts[s.sample(&logits) as usize] += 1;
        }
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let want = f64::from(logits[i]).exp() / z;
            assert!((c as f64 / n as f64 - want).abs() < 0.01, "{i}: {c}");
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(config(-1.0, 0, 1.0, 0).validate().is_err());
        assert!(config(1.0, 0, 0.0, 0).validate().is_err());
        assert!(config(0.7, 40, 0.9, 0).validate().is_ok());
    }
}
