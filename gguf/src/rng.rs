//! A tiny seeded generator (SplitMix64) for synthetic weights and tests: deterministic across
//! platforms and thread counts, because every chunk of every tensor gets its own stream.

/// SplitMix64 state.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent stream for (`seed`, `a`, `b`), e.g. (seed, tensor index, chunk index).
    pub fn stream(seed: u64, a: u64, b: u64) -> Rng {
        let mut r = Rng(seed ^ 0x6a09_e667_f3bc_c908);
        let x = r.next_u64() ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut r = Rng(x);
        Rng(r.next_u64() ^ b.wrapping_mul(0xbf58_476d_1ce4_e5b9))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), on a grid of 2^-23.
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / 8_388_608.0) - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_and_repeat() {
        let a: Vec<u64> = (0..4).map(|_| Rng::stream(1, 2, 3).next_u64()).collect();
        assert!(a.iter().all(|&x| x == a[0]));
        assert_ne!(
            Rng::stream(1, 2, 3).next_u64(),
            Rng::stream(1, 3, 2).next_u64()
        );
        let mut r = Rng::new(7);
        let mean = (0..10_000).map(|_| r.uniform() as f64).sum::<f64>() / 10_000.0;
        assert!(mean.abs() < 0.03, "mean {mean}");
    }
}
