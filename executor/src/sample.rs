//! Token sampling: greedy argmax, or temperature with optional top-k, top-p and min-p
//! truncation; `Penalties` shapes the logits first (presence, frequency and repetition
//! penalties; the server's requests). The draw for the n-th sampled token is a pure function
//! of (seed, n), so the same seed always gives the same text. Every step of the non-greedy path is specified down to the f32
//! operation (no libm, no fused multiply-add, sums in a fixed order) because the CUDA sampler
//! (kernels/sample.cu) mirrors it and must pick the same token for the same logits and seed.
//! The server samples on the host for either backend, over each sequence's own row of logits,
//! so min-p and the penalties (which the CUDA sampler does not take) keep that: a token
//! depends on its row's logits, the seed, the draw number and the tokens before it only.

use std::collections::{BTreeMap, BTreeSet};

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
    min_p: f32,
    step: u64,
    keys: Vec<u64>,
    weights: Vec<f32>,
}

impl Sampler {
    /// A sampler whose random stream starts at `config.seed`.
    pub fn new(config: SamplerConfig) -> Sampler {
        Sampler {
            config,
            min_p: 0.0,
            step: 0,
            keys: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// Also keeps only the tokens at least `min_p` times as likely as the most likely one
    /// (after the temperature; 0 keeps all, and then the picks are those without it).
    pub fn with_min_p(mut self, min_p: f32) -> Sampler {
        self.min_p = min_p;
        self
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
        let keep = self.candidates(logits);
        candidate_id(self.keys[pick(&self.weights[..keep], draw(self.config.seed, step))])
    }

    /// Speculative sampling of a drafted token `draft` against `logits`: the draft when
    /// accepted, else a token from the rest of the distribution. Greedy, the argmax (the
    /// draft is accepted when it is the argmax). Sampled, the draft is accepted with its
    /// probability p(draft) (a draft proposed with certainty), and on rejection the token
    /// comes from p with the draft removed, renormalized: every token then comes with its
    /// probability under p, as plain sampling gives it. One draw number, two streams.
    pub fn verify(&mut self, logits: &[f32], draft: u32) -> u32 {
        let step = self.step;
        self.step += 1;
        if self.config.is_greedy() {
            return argmax(logits);
        }
        let keep = self.candidates(logits);
        let w = &mut self.weights[..keep];
        let at = self.keys[..keep]
            .iter()
            .position(|&k| candidate_id(k) == draft);
        if let Some(i) = at {
            let total = w.iter().fold(0.0f32, |s, &x| s + x);
            if draw(self.config.seed, step) * total < w[i] {
                return draft;
            }
            w[i] = 0.0;
        }
        let residual = draw(self.config.seed ^ RESIDUAL_STREAM, step);
        candidate_id(self.keys[pick(w, residual)])
    }

    /// Fills `keys` with the candidates of `logits` (most likely first, after top-k) and
    /// `weights` with their unnormalized probabilities; returns how many top-p and min-p keep.
    fn candidates(&mut self, logits: &[f32]) -> usize {
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
        let top = logits[candidate_id(keys[0]) as usize];
        let t = self.config.temperature;
        let w = &mut self.weights;
        w.clear();
        w.extend(
            keys.iter()
                .map(|&key| exp_nonpositive((logits[candidate_id(key) as usize] - top) / t)),
        );
        top_p_prefix(w, self.config.top_p).min(min_p_prefix(w, self.min_p))
    }
}

/// Seeds the draws of a rejected draft's residual apart from the acceptance draws.
const RESIDUAL_STREAM: u64 = 0x5bd1_e995_0000_0001;

/// The token id of a candidate key (`rank_key`).
fn candidate_id(key: u64) -> u32 {
    !(key as u32)
}

/// What an engine's greedy readback (`Readback::Argmax`) gives a row holding a NaN or an
/// infinite logit instead of a token: no token id reaches it.
pub const NOT_FINITE: u32 = u32::MAX;

/// A greedy readback's token for one row of logits: its `argmax`, or `NOT_FINITE` where a
/// logit is NaN or infinite (the device's `argmax_f32` with its flag, kernels/sample.cu).
pub fn greedy(logits: &[f32]) -> u32 {
    if logits.iter().all(|l| l.is_finite()) {
        argmax(logits)
    } else {
        NOT_FINITE
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

/// How many leading weights (sorted, unnormalized, the first one 1: the most likely token's)
/// to keep: those before the first below `min_p`, so at least one; all when `min_p` is 0.
fn min_p_prefix(w: &[f32], min_p: f32) -> usize {
    w.iter().position(|&x| x < min_p).unwrap_or(w.len()).max(1)
}

/// Presence, frequency and repetition penalties, as vLLM applies them (OpenAI's semantics for
/// the first two; llama.cpp's formulas, over the whole sequence rather than its last 64
/// tokens). 0, 0 and 1 leave the logits as they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PenaltyConfig {
    /// Subtracted from the logit of every token generated so far.
    pub presence: f32,
    /// Subtracted from a token's logit once per time it was generated.
    pub frequency: f32,
    /// Divides the positive logits and multiplies the others of every token in the prompt or
    /// generated so far.
    pub repetition: f32,
}

impl PenaltyConfig {
    /// No penalty.
    pub const NONE: PenaltyConfig = PenaltyConfig {
        presence: 0.0,
        frequency: 0.0,
        repetition: 1.0,
    };

    /// Whether the penalties change no logit.
    pub fn is_none(&self) -> bool {
        *self == PenaltyConfig::NONE
    }
}

/// One sequence's penalties: the tokens it has seen and the shaped copy of a step's logits.
#[derive(Debug)]
pub struct Penalties {
    config: PenaltyConfig,
    /// Tokens of the prompt (the repetition penalty's only).
    prompt: BTreeSet<u32>,
    /// Generated tokens and how many times each came.
    generated: BTreeMap<u32, u32>,
    shaped: Vec<f32>,
}

impl Penalties {
    /// The penalties of a sequence that starts with `prompt`.
    pub fn new(config: PenaltyConfig, prompt: &[u32]) -> Penalties {
        let prompt = if config.repetition == 1.0 {
            BTreeSet::new()
        } else {
            prompt.iter().copied().collect()
        };
        Penalties {
            config,
            prompt,
            generated: BTreeMap::new(),
            shaped: Vec::new(),
        }
    }

    /// Counts a generated token.
    pub fn record(&mut self, token: u32) {
        if !self.config.is_none() {
            *self.generated.entry(token).or_insert(0) += 1;
        }
    }

    /// `logits` with the penalties applied: `logits` itself when they change nothing, else a
    /// copy. Each penalized logit goes through the same f32 operations in the same order:
    /// the repetition penalty (`l / r` for `l > 0`, else `l * r`), then `l - f * count`,
    /// then `l - p`; a token's result depends on its own logit and counts only.
    pub fn apply<'a>(&'a mut self, logits: &'a [f32]) -> &'a [f32] {
        let c = self.config;
        if c.is_none() {
            return logits;
        }
        self.shaped.clear();
        self.shaped.extend_from_slice(logits);
        let shaped = &mut self.shaped;
        if c.repetition != 1.0 {
            let seen = self.prompt.iter().chain(self.generated.keys());
            // a token in both is penalized once
            for &id in seen.collect::<BTreeSet<_>>() {
                if let Some(l) = shaped.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / c.repetition
                    } else {
                        *l * c.repetition
                    };
                }
            }
        }
        for (&id, &count) in &self.generated {
            if let Some(l) = shaped.get_mut(id as usize) {
                *l -= c.frequency * count as f32;
                *l -= c.presence;
            }
        }
        shaped
    }
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
    fn min_p_keeps_the_tokens_near_the_best_and_at_0_changes_no_pick() {
        let logits: Vec<f32> = (0..64).map(|i| ((i * 29) % 17) as f32 * 0.25).collect();
        let picks = |min_p: f32| {
            let mut s = Sampler::new(config(1.0, 0, 1.0, 5)).with_min_p(min_p);
            (0..300).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let mut plain = Sampler::new(config(1.0, 0, 1.0, 5));
        assert_eq!(
            picks(0.0),
            (0..300).map(|_| plain.sample(&logits)).collect::<Vec<_>>()
        );
        // the best logit is 4.0 (16 * 0.25); e^-0.5 > 0.5 > e^-0.75: within 0.5 of it stay
        for id in picks(0.5) {
            assert!(logits[id as usize] >= 3.5, "{id}: {}", logits[id as usize]);
        }
        // 1 keeps the best alone: here several ids hold it, and each is picked
        let mut best: Vec<u32> = picks(1.0);
        best.sort_unstable();
        best.dedup();
        let tied: Vec<u32> = (0..64).filter(|&i| logits[i as usize] == 4.0).collect();
        assert_eq!(best, tied);
    }

    #[test]
    fn penalties_follow_vllms_formulas_in_f32() {
        let logits = [2.0f32, -1.0, 0.5, 3.0, 1.0];
        let config = PenaltyConfig {
            presence: 0.5,
            frequency: 0.25,
            repetition: 1.5,
        };
        // token 0 in the prompt, 2 generated twice, 3 once
        let mut p = Penalties::new(config, &[0, 0, 1]);
        for t in [2, 3, 2] {
            p.record(t);
        }
        let shaped = p.apply(&logits).to_vec();
        let want = [
            2.0 / 1.5,
            -1.5,
            0.5 / 1.5 - 0.25 * 2.0 - 0.5,
            3.0 / 1.5 - 0.25 - 0.5,
            1.0,
        ];
        assert_eq!(shaped, want);
        // none: the logits themselves
        let mut none = Penalties::new(PenaltyConfig::NONE, &[0]);
        none.record(1);
        assert!(std::ptr::eq(none.apply(&logits), &logits[..]));
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(config(-1.0, 0, 1.0, 0).validate().is_err());
        assert!(config(1.0, 0, 0.0, 0).validate().is_err());
        assert!(config(0.7, 40, 0.9, 0).validate().is_ok());
    }
}
