//! Matvec rows for the 256-value k-quants (q4_k, q6_k) against 8-bit activations with
//! 16-value sums. Each super-block reduces to exact i32 sums: for q4_k the scaled quant dot
//! `sumi` and the minimum term `summ`, value `(d * d_x) * sumi - (dmin * d_x) * summ`; for
//! q6_k the scaled dot with the offset 32 removed through the activation sums, value
//! `(d * d_x) * isum`. The AVX2 code computes the same integers, so results are identical.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use memra_gguf::layout::{q4_k, q6_k};
use memra_gguf::GgmlType;

use super::act::BlockQ8K;
use super::{f16_at, reduce_row};

/// Computes `y[r]` for the rows whose bytes start `w` (row stride `rb`), one per `y` entry.
pub(crate) fn rows(
    dtype: GgmlType,
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    chunks: usize,
    y: &mut [f32],
    simd: bool,
) {
    let q4 = match dtype {
        GgmlType::Q4_K => true,
        GgmlType::Q6_K => false,
        other => unreachable!("invariant: {other} is not a k-quant"),
    };
    let bb = dtype.block_bytes();
    for (i, y) in y.iter_mut().enumerate() {
        let row = &w[i * rb..(i + 1) * rb];
        *y = reduce_row(x.len(), chunks, |b| {
            let wb = &row[b * bb..(b + 1) * bb];
            let isums = int_sums(q4, wb, &x[b], simd);
            block_value(q4, wb, &x[b], isums)
        });
    }
}

/// The f32 part of a super-block's value, shared by the scalar and the AVX2 path.
fn block_value(q4: bool, wb: &[u8], xb: &BlockQ8K, (isum, summ): (i32, i32)) -> f32 {
    if q4 {
        let a = (f16_at(wb, q4_k::D) * xb.d) * isum as f32;
        let m = (f16_at(wb, q4_k::DMIN) * xb.d) * summ as f32;
        a - m
    } else {
        (f16_at(wb, q6_k::D) * xb.d) * isum as f32
    }
}

/// (scaled quant dot, minimum term): the integer sums of one super-block.
fn int_sums(q4: bool, wb: &[u8], xb: &BlockQ8K, simd: bool) -> (i32, i32) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is set only when AVX2, FMA and F16C were detected
        return unsafe {
            if q4 {
                q4k_avx2(wb, xb)
            } else {
                q6k_avx2(wb, xb)
            }
        };
    }
    let _ = simd;
    if q4 {
        q4k_scalar(wb, xb)
    } else {
        q6k_scalar(wb, xb)
    }
}

/// Scales and minimums of the eight q4_k sub-blocks, and the minimum term they imply.
fn q4k_scales(wb: &[u8], xb: &BlockQ8K) -> ([i32; 8], i32) {
    let mut sc = [0; 8];
    let mut summ = 0;
    for (j, sc) in sc.iter_mut().enumerate() {
        let (s, m) = q4_k::scale_min(j, &wb[q4_k::SCALES]);
        *sc = i32::from(s);
        summ += i32::from(m) * (i32::from(xb.bsums[2 * j]) + i32::from(xb.bsums[2 * j + 1]));
    }
    (sc, summ)
}

fn q4k_scalar(wb: &[u8], xb: &BlockQ8K) -> (i32, i32) {
    let (sc, summ) = q4k_scales(wb, xb);
    let mut sumi = 0;
    for (c, qs) in wb[q4_k::QS].chunks_exact(32).enumerate() {
        let x = &xb.qs[64 * c..64 * c + 64];
        let (mut lo, mut hi) = (0, 0);
        for (l, &q) in qs.iter().enumerate() {
            lo += i32::from(q & 15) * i32::from(x[l]);
            hi += i32::from(q >> 4) * i32::from(x[32 + l]);
        }
        sumi += sc[2 * c] * lo + sc[2 * c + 1] * hi;
    }
    (sumi, summ)
}

/// The 16 q6_k sub-block scales and the offset term `32 * sum(sc * bsum)`.
fn q6k_scales(wb: &[u8], xb: &BlockQ8K) -> ([i32; 16], i32) {
    let mut sc = [0; 16];
    let mut off = 0;
    for (g, sc) in sc.iter_mut().enumerate() {
        *sc = i32::from(wb[q6_k::SCALES.start + g] as i8);
        off += *sc * i32::from(xb.bsums[g]);
    }
    (sc, 32 * off)
}

fn q6k_scalar(wb: &[u8], xb: &BlockQ8K) -> (i32, i32) {
    let (sc, off) = q6k_scales(wb, xb);
    let mut groups = [0i32; 16];
    for (e, q) in q6_k::quants(wb).into_iter().enumerate() {
        groups[e / 16] += i32::from(q) * i32::from(xb.qs[e]);
    }
    let dot: i32 = groups.iter().zip(&sc).map(|(g, s)| g * s).sum();
    (dot - off, 0)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// Two i16 scales, one per 128-bit half, for `_mm256_madd_epi16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scale_pair(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn q4k_avx2(wb: &[u8], xb: &BlockQ8K) -> (i32, i32) {
    let (sc, summ) = q4k_scales(wb, xb);
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_si256();
    let qs = &wb[q4_k::QS];
    for c in 0..4 {
        // SAFETY: `qs` is 128 bytes and `xb.qs` 256, so every 32-byte load is in bounds
        unsafe {
            let q = _mm256_loadu_si256(qs.as_ptr().add(32 * c).cast());
            let xlo = _mm256_load_si256(xb.qs.as_ptr().add(64 * c).cast());
            let xhi = _mm256_load_si256(xb.qs.as_ptr().add(64 * c + 32).cast());
            let lo = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), xlo);
            let hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), xhi);
            let lo = _mm256_madd_epi16(lo, _mm256_set1_epi16(sc[2 * c] as i16));
            let hi = _mm256_madd_epi16(hi, _mm256_set1_epi16(sc[2 * c + 1] as i16));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(lo, hi));
        }
    }
    (hsum_epi32(acc), summ)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn q6k_avx2(wb: &[u8], xb: &BlockQ8K) -> (i32, i32) {
    let (sc, off) = q6k_scales(wb, xb);
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = _mm256_setzero_si256();
    for n in 0..2 {
        // SAFETY: ql is 128 bytes, qh 64, xb.qs 256: all loads below stay inside them
        unsafe {
            let ql = wb.as_ptr().add(q6_k::QL.start + 64 * n);
            let ql0 = _mm256_loadu_si256(ql.cast());
            let ql1 = _mm256_loadu_si256(ql.add(32).cast());
            let qh = _mm256_loadu_si256(wb.as_ptr().add(q6_k::QH.start + 32 * n).cast());
            // the four 32-value rows of this half, as unsigned 6-bit quants
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m2)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0c))),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    _mm256_and_si256(qh, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                ),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let g = 8 * n + 2 * k;
                let x = _mm256_load_si256(xb.qs.as_ptr().add(128 * n + 32 * k).cast());
                let p = _mm256_maddubs_epi16(q, x);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair(sc[g], sc[g + 1])));
            }
        }
    }
    (hsum_epi32(acc) - off, 0)
}
