//! Activation quantization for the integer dot products: the f32 input vector of a quantized
//! matvec is cut into 8-bit blocks (32 values for the q4_0/q4_1/q8_0 weights, 256 with
//! 16-value sums for the k-quants), as llama.cpp does, so that each weight block reduces to an
//! exact integer sum. The 32-value blocks keep `d` and `d * sum` as the f16 values the q8_1
//! block format stores (as llama.cpp does: perplexity then matches it to 0.01% instead of
//! 0.14%), and quants round half to even in both the scalar and the AVX2 code so that both
//! produce the same bytes.

use memra_gguf::f16::{f16_to_f32, f32_to_f16};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// 32 activations: `x[i] ~ d * qs[i]`; `sum` is the sum of `qs`, `s = d * sum`.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct BlockQ8 {
    /// The 32 quants.
    pub qs: [i8; 32],
    /// Scale.
    pub d: f32,
    /// `d * sum` as f32, the term a weight block's minimum multiplies.
    pub s: f32,
    /// Exact sum of `qs`.
    pub sum: i32,
}

/// 256 activations: `x[i] ~ d * qs[i]`; `bsums[j]` is the sum of `qs[16j..16j + 16]`.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct BlockQ8K {
    /// The 256 quants.
    pub qs: [i8; 256],
    /// Sums of each group of 16 quants.
    pub bsums: [i16; 16],
    /// Scale.
    pub d: f32,
}

/// Quantizes `x` (a multiple of 32 long) into 32-value blocks.
pub fn quantize_q8(x: &[f32], simd: bool) -> Vec<BlockQ8> {
    x.chunks_exact(32)
        .map(|c| {
            let mut b = BlockQ8 {
                qs: [0; 32],
                d: 0.0,
                s: 0.0,
                sum: 0,
            };
            let id = scale(c, &mut b.d);
            round_into(c, id, &mut b.qs, simd);
            b.sum = b.qs.iter().map(|&q| i32::from(q)).sum();
            // The q8_1 block format stores d and d * sum as f16: keep those values.
            b.s = half(b.d * b.sum as f32);
            b.d = half(b.d);
            b
        })
        .collect()
}

/// Quantizes `x` (a multiple of 256 long) into 256-value blocks.
pub fn quantize_q8k(x: &[f32], simd: bool) -> Vec<BlockQ8K> {
    x.chunks_exact(256)
        .map(|c| {
            let mut b = BlockQ8K {
                qs: [0; 256],
                bsums: [0; 16],
                d: 0.0,
            };
            let id = scale(c, &mut b.d);
            round_into(c, id, &mut b.qs, simd);
            for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
                *s = g.iter().map(|&q| i16::from(q)).sum();
            }
            b
        })
        .collect()
}

/// `x` rounded to the nearest f16 value.
fn half(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Sets `d = amax / 127` and returns the inverse scale `127 / amax` (0 for an all-zero block).
fn scale(x: &[f32], d: &mut f32) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    *d = amax / 127.0;
    if amax != 0.0 {
        127.0 / amax
    } else {
        0.0
    }
}

fn round_into(x: &[f32], id: f32, qs: &mut [i8], simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: callers pass `simd` only after detecting AVX2 (see `Isa`)
        return unsafe { round_into_avx2(x, id, qs) };
    }
    let _ = simd;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn round_into_avx2(x: &[f32], id: f32, qs: &mut [i8]) {
    let idv = _mm256_set1_ps(id);
    for (xs, q) in x.chunks_exact(8).zip(qs.chunks_exact_mut(8)) {
        // SAFETY: `xs` holds 8 floats; the store writes the 8 low bytes into `q`, 8 long
        unsafe {
            let v = _mm256_mul_ps(_mm256_loadu_ps(xs.as_ptr()), idv);
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            let i = _mm256_cvtps_epi32(r);
            let w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256::<1>(i));
            let b = _mm_packs_epi16(w, w);
            _mm_storel_epi64(q.as_mut_ptr().cast(), b);
        }
    }
}
