//! The q4_0/q4_1 matrix-matrix kernel of prefill: eight weight rows repacked so that one
//! 32-byte vector holds four consecutive quants of each of the eight rows. A token's four
//! activation quants, broadcast, then multiply all eight rows at once and the sums stay in
//! the row's own lane: a block's eight exact integer sums need no horizontal reduction, which
//! is what makes the matvec's row-at-a-time form slow for many tokens. The f32 operations per
//! (row, token) are `q32`'s, in the same order, so every value keeps the matvec's bits.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use memra_gguf::layout::{q4_0, q4_1};

use super::act::BlockQ8;
use super::{f16_at, Tree};

/// Eight rows of q4 blocks, repacked: per block, eight 32-byte groups (quants `4g..4g + 4` of
/// rows 0..8), then the rows' scales and minimums as f32.
pub(crate) struct Packed8 {
    quants: Vec<[u8; 32]>,
    d: Vec<[f32; 8]>,
    m: Vec<[f32; 8]>,
    q4_1: bool,
}

impl Packed8 {
    /// Repacks rows `0..8` of `w` (row stride `rb`, `blocks` blocks per row).
    pub(crate) fn new(q4_1: bool, w: &[u8], rb: usize, blocks: usize) -> Packed8 {
        let (bb, qs_at) = if q4_1 {
            (q4_1::BYTES, q4_1::QS.start)
        } else {
            (q4_0::BYTES, q4_0::QS.start)
        };
        let mut p = Packed8 {
            quants: vec![[0; 32]; 8 * blocks],
            d: vec![[0.0; 8]; blocks],
            m: vec![[0.0; 8]; blocks],
            q4_1,
        };
        for b in 0..blocks {
            for row in 0..8 {
                let block = &w[row * rb + b * bb..row * rb + (b + 1) * bb];
                p.d[b][row] = f16_at(block, 0);
                if q4_1 {
                    p.m[b][row] = f16_at(block, q4_1::M);
                }
                let qs = &block[qs_at..qs_at + 16];
                for k in 0..32 {
                    // element k: low nibbles hold 0..16, high nibbles 16..32
                    let q = if k < 16 { qs[k] & 15 } else { qs[k - 16] >> 4 };
                    p.quants[8 * b + k / 4][4 * row + k % 4] = q;
                }
            }
        }
        p
    }

    /// The eight rows' values for one token's activations `x`, reduced in `chunks` chunks as
    /// `q32::rows` reduces them.
    pub(crate) fn rows(&self, x: &[BlockQ8], chunks: usize, simd: bool) -> [f32; 8] {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is set only when AVX2, FMA and F16C were detected
            return unsafe { self.rows_avx2(x, chunks) };
        }
        let _ = simd;
        self.rows_scalar(x, chunks)
    }

    /// The scalar definition (also what machines without AVX2 run).
    fn rows_scalar(&self, x: &[BlockQ8], chunks: usize) -> [f32; 8] {
        let per = x.len() / chunks;
        let mut tree = Tree::<8>::new();
        for c in 0..chunks {
            let mut acc = [0f32; 8];
            for (b, xb) in x.iter().enumerate().skip(c * per).take(per) {
                for (row, acc) in acc.iter_mut().enumerate() {
                    let mut isum = 0i32;
                    for k in 0..32 {
                        let q = self.quants[8 * b + k / 4][4 * row + k % 4];
                        isum += i32::from(q) * i32::from(xb.qs[k]);
                    }
                    if !self.q4_1 {
                        isum -= 8 * xb.sum;
                    }
                    let mut v = (self.d[b][row] * xb.d) * isum as f32;
                    if self.q4_1 {
                        v += self.m[b][row] * xb.s;
                    }
                    *acc += v;
                }
            }
            tree.push(acc);
        }
        tree.finish()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows_avx2(&self, x: &[BlockQ8], chunks: usize) -> [f32; 8] {
        assert!(
            self.d.len() == x.len() && self.quants.len() == 8 * x.len(),
            "invariant: activations of the packed width"
        );
        let per = x.len() / chunks;
        let mut tree = Tree::<8>::new();
        for c in 0..chunks {
            let mut acc = _mm256_setzero_ps();
            for (b, xb) in x.iter().enumerate().skip(c * per).take(per) {
                // SAFETY: `quants` holds 8 groups of 32 bytes per block and `xb.qs` 32 bytes,
                // checked above; `d` and `m` hold 8 floats per block
                unsafe {
                    let q = self.quants.as_ptr().add(8 * b).cast::<u8>();
                    // a pair of products is at most 2 * 15 * 127, eight pairs fit an i16 lane
                    let mut pairs = _mm256_setzero_si256();
                    for g in 0..8 {
                        let w = _mm256_loadu_si256(q.add(32 * g).cast());
                        let xq = _mm256_set1_epi32(
                            xb.qs.as_ptr().add(4 * g).cast::<i32>().read_unaligned(),
                        );
                        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w, xq));
                    }
                    let mut isum = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
                    if !self.q4_1 {
                        isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * xb.sum));
                    }
                    let d = _mm256_loadu_ps(self.d[b].as_ptr());
                    let dd = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
                    let mut v = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum));
                    if self.q4_1 {
                        let m = _mm256_loadu_ps(self.m[b].as_ptr());
                        v = _mm256_add_ps(v, _mm256_mul_ps(m, _mm256_set1_ps(xb.s)));
                    }
                    acc = _mm256_add_ps(acc, v);
                }
            }
            let mut part = [0f32; 8];
            // SAFETY: `part` holds eight floats
            unsafe { _mm256_storeu_ps(part.as_mut_ptr(), acc) };
            tree.push(part);
        }
        tree.finish()
    }
}
