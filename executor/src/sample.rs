//! Token sampling: greedy argmax, or temperature with optional top-k and top-p truncation,
//! drawn from a seeded generator so the same seed always gives the same text.

use anyhow::{bail, Result};
use memra_gguf::rng::Rng;

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
}

/// A sampler with its random state; one per sequence.
#[derive(Debug)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Rng,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler whose random stream starts at `config.seed`.
    pub fn new(config: SamplerConfig) -> Sampler {
        Sampler {
            config,
            rng: Rng::new(config.seed),
            candidates: Vec::new(),
        }
    }

    /// Picks the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let greedy = self.config.temperature == 0.0 || self.config.top_k == 1;
        if greedy {
            return argmax(logits);
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        // Descending logit, then ascending id, so ties resolve the same on every run.
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if self.config.top_k > 0 && self.config.top_k < c.len() {
            c.select_nth_unstable_by(self.config.top_k - 1, order);
            c.truncate(self.config.top_k);
        }
        c.sort_unstable_by(order);
        let t = f64::from(self.config.temperature);
        let top = f64::from(c[0].1);
        let mut probs: Vec<f64> = c
            .iter()
            .map(|&(_, l)| ((f64::from(l) - top) / t).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let mut keep = probs.len();
        if self.config.top_p < 1.0 {
            let mut sum = 0.0;
            for (i, p) in probs.iter().enumerate() {
                sum += p;
                if sum >= f64::from(self.config.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        let mass: f64 = probs[..keep].iter().sum();
        let mut u = unit(&mut self.rng) * mass;
        for (i, p) in probs[..keep].iter().enumerate() {
            if u < *p {
                return c[i].0;
            }
            u -= p;
        }
        c[keep - 1].0
    }
}

/// Index of the largest logit; the lowest index among equals.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// A uniform draw in [0, 1) with 53 random bits.
fn unit(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn bad_settings_are_refused() {
        assert!(config(-1.0, 0, 1.0, 0).validate().is_err());
        assert!(config(1.0, 0, 0.0, 0).validate().is_err());
        assert!(config(0.7, 40, 0.9, 0).validate().is_ok());
    }
}
