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
                // element k: low nibbles hold 0..16, high nibbles 16..32
                let mut vals = [0u8; 32];
                for (k, &q) in block[qs_at..qs_at + 16].iter().enumerate() {
                    vals[k] = q & 15;
                    vals[k + 16] = q >> 4;
                }
                for (g, four) in vals.chunks_exact(4).enumerate() {
                    p.quants[8 * b + g][4 * row..4 * row + 4].copy_from_slice(four);
                }
            }
        }
        p
    }

    /// The eight rows' values for each token's activations in `x` (one or two tokens),
    /// reduced in `chunks` chunks as `q32::rows` reduces them.
    pub(crate) fn rows(&self, x: &[&[BlockQ8]], chunks: usize, simd: bool) -> [[f32; 8]; 2] {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is set only when AVX2, FMA and F16C were detected
            return unsafe {
                match x {
                    [a, b] => self.rows_avx2::<2>([a, b], chunks),
                    [a] => {
                        let [v] = self.rows_avx2::<1>([a], chunks);
                        [v, [0.0; 8]]
                    }
                    _ => unreachable!("invariant: one or two tokens"),
                }
            };
        }
        let _ = simd;
        let mut out = [[0.0; 8]; 2];
        for (o, x) in out.iter_mut().zip(x) {
            *o = self.rows_scalar(x, chunks);
        }
        out
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

    /// `T` tokens at once, each weight vector loaded once for all of them; the tokens'
    /// accumulators are independent chains.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows_avx2<const T: usize>(&self, x: [&[BlockQ8]; T], chunks: usize) -> [[f32; 8]; T] {
        let nb = self.d.len();
        assert!(
            x.iter().all(|x| x.len() == nb) && self.quants.len() == 8 * nb,
            "invariant: activations of the packed width"
        );
        let per = nb / chunks;
        let mut trees = [(); T].map(|()| Tree::<8>::new());
        for c in 0..chunks {
            let mut acc = [_mm256_setzero_ps(); T];
            for b in c * per..(c + 1) * per {
                // SAFETY: `quants` holds 8 groups of 32 bytes per block and each token's
                // block 32 quant bytes, checked above; `d` and `m` hold 8 floats per block
                unsafe {
                    let q = self.quants.as_ptr().add(8 * b).cast::<u8>();
                    // a pair of products is at most 2 * 15 * 127: eight pairs fit an i16 lane
                    let mut pairs = [_mm256_setzero_si256(); T];
                    for g in 0..8 {
                        let w = _mm256_loadu_si256(q.add(32 * g).cast());
                        for (p, x) in pairs.iter_mut().zip(&x) {
                            let four = x[b].qs.as_ptr().add(4 * g).cast::<i32>().read_unaligned();
                            let xq = _mm256_set1_epi32(four);
                            *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(w, xq));
                        }
                    }
                    let d = _mm256_loadu_ps(self.d[b].as_ptr());
                    let m = _mm256_loadu_ps(self.m[b].as_ptr());
                    for ((acc, p), x) in acc.iter_mut().zip(pairs).zip(&x) {
                        let xb = &x[b];
                        let mut isum = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
                        if !self.q4_1 {
                            isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * xb.sum));
                        }
                        let dd = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
                        let mut v = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum));
                        if self.q4_1 {
                            v = _mm256_add_ps(v, _mm256_mul_ps(m, _mm256_set1_ps(xb.s)));
                        }
                        *acc = _mm256_add_ps(*acc, v);
                    }
                }
            }
            for (tree, acc) in trees.iter_mut().zip(acc) {
                let mut part = [0f32; 8];
                // SAFETY: `part` holds eight floats
                unsafe { _mm256_storeu_ps(part.as_mut_ptr(), acc) };
                tree.push(part);
            }
        }
        trees.map(|t| t.finish())
    }
}
