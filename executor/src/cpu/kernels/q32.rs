//! Matvec rows for the 32-value block quants (q4_0, q4_1, q8_0) against 8-bit activations.
//! Per block the weight-times-activation quants reduce to an exact i32 `isum`; the block's
//! value is then `(d_w * d_x) * isum` (plus `m_w * s_x` for q4_1), and blocks accumulate
//! in order in f32. The AVX2 code runs four rows at once, sharing each activation block, and
//! performs exactly those f32 operations lane-wise, so it matches the scalar code bit for bit.
//! `rows_tokens` serves the matrix-matrix product: four rows times four tokens per pass,
//! each weight block unpacked once for all of them, and every (row, token) value computed by the
//! same operations as `rows`, so a token's row has the same bits in a batch as alone.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use memra_gguf::layout::{q4_0, q4_1, q8_0};
use memra_gguf::GgmlType;

use super::act::BlockQ8;
use super::{f16_at, reduce_row, Tree};

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;

/// `$f::<K>(args)` for the kind K of the 32-value block quant `$dtype`.
macro_rules! by_q32_dtype {
    ($dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            GgmlType::Q4_0 => $f::<Q4_0>($($arg),*),
            GgmlType::Q4_1 => $f::<Q4_1>($($arg),*),
            GgmlType::Q8_0 => $f::<Q8_0>($($arg),*),
            other => unreachable!("invariant: {other} is not a 32-value block quant"),
        }
    };
}

/// Computes `y[r]` for the rows whose bytes start `w` (row stride `rb`), one per `y` entry.
pub(crate) fn rows(
    dtype: GgmlType,
    w: &[u8],
    rb: usize,
    x: &[BlockQ8],
    chunks: usize,
    y: &mut [f32],
    simd: bool,
) {
    by_q32_dtype!(dtype, rows_k(w, rb, x, chunks, y, simd))
}

const fn block_bytes(k: u8) -> usize {
    match k {
        Q4_0 => q4_0::BYTES,
        Q4_1 => q4_1::BYTES,
        _ => q8_0::BYTES,
    }
}

fn rows_k<const K: u8>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8],
    chunks: usize,
    y: &mut [f32],
    simd: bool,
) {
    let mut r = 0;
    #[cfg(target_arch = "x86_64")]
    if simd {
        while r + 4 <= y.len() {
            let rows = &w[r * rb..(r + 4) * rb];
            // SAFETY: `simd` is set only when AVX2, FMA and F16C were detected
            let v = unsafe { rows4_avx2::<K>(rows, rb, x, chunks) };
            y[r..r + 4].copy_from_slice(&v);
            r += 4;
        }
    }
    let _ = simd;
    for (i, y) in y.iter_mut().enumerate().skip(r) {
        let row = &w[i * rb..(i + 1) * rb];
        *y = reduce_row(x.len(), chunks, |b| {
            block_value::<K>(&row[b * block_bytes(K)..], &x[b])
        });
    }
}

/// `rows` for several tokens' activations at once, token `t`'s values into `y[t]`: the same
/// bits as one `rows` call per token. Tokens go four at a time through the four-row kernel,
/// then two, then one.
pub(crate) fn rows_tokens(
    dtype: GgmlType,
    w: &[u8],
    rb: usize,
    x: &[&[BlockQ8]],
    chunks: usize,
    y: &mut [&mut [f32]],
    simd: bool,
) {
    by_q32_dtype!(dtype, tokens_k(w, rb, x, chunks, y, simd))
}

fn tokens_k<const K: u8>(
    w: &[u8],
    rb: usize,
    x: &[&[BlockQ8]],
    chunks: usize,
    y: &mut [&mut [f32]],
    simd: bool,
) {
    let mut t = 0;
    #[cfg(target_arch = "x86_64")]
    if simd {
        let rows = y.first().map_or(0, |y| y.len()) / 4 * 4;
        // the tokens in groups of four (then two): each group of four weight rows is read
        // from memory once and passes every group while it sits in cache
        let mut groups = Vec::new();
        while t + 2 <= x.len() {
            let p = if t + 4 <= x.len() { 2 } else { 1 };
            groups.push((t, p));
            t += 2 * p;
        }
        for r in (0..rows).step_by(4) {
            let w4 = &w[r * rb..(r + 4) * rb];
            for &(t, p) in &groups {
                // SAFETY: `simd` is set only when AVX2, FMA and F16C were detected
                let v = unsafe {
                    if p == 2 {
                        rows4xp_avx2::<K, 2>(w4, rb, &x[t..t + 4], chunks)
                    } else {
                        let [a] = rows4xp_avx2::<K, 1>(w4, rb, &x[t..t + 2], chunks);
                        [a, [0.0; 8]]
                    }
                };
                for (j, v) in v.iter().enumerate().take(p) {
                    y[t + 2 * j][r..r + 4].copy_from_slice(&v[..4]);
                    y[t + 2 * j + 1][r..r + 4].copy_from_slice(&v[4..]);
                }
            }
        }
        for j in 0..t {
            rows_k::<K>(&w[rows * rb..], rb, x[j], chunks, &mut y[j][rows..], simd);
        }
    }
    for j in t..x.len() {
        rows_k::<K>(w, rb, x[j], chunks, y[j], simd);
    }
}

/// The scalar definition of one block's contribution.
fn block_value<const K: u8>(wb: &[u8], xb: &BlockQ8) -> f32 {
    let isum: i32 = match K {
        Q8_0 => wb[q8_0::QS]
            .iter()
            .zip(&xb.qs)
            .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
            .sum(),
        _ => {
            let qs = &wb[if K == Q4_0 { q4_0::QS } else { q4_1::QS }];
            let (lo, hi) = xb.qs.split_at(16);
            let dot: i32 = qs
                .iter()
                .zip(lo.iter().zip(hi))
                .map(|(&q, (&l, &h))| {
                    i32::from(q & 15) * i32::from(l) + i32::from(q >> 4) * i32::from(h)
                })
                .sum();
            // q4_0 quants are offset by 8: subtract it through the activation sum, exactly
            if K == Q4_0 {
                dot - 8 * xb.sum
            } else {
                dot
            }
        }
    };
    let v = (f16_at(wb, 0) * xb.d) * isum as f32;
    if K == Q4_1 {
        v + f16_at(wb, q4_1::M) * xb.s
    } else {
        v
    }
}

/// Four rows at once; returns their values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows4_avx2<const K: u8>(w: &[u8], rb: usize, x: &[BlockQ8], chunks: usize) -> [f32; 4] {
    let bb = block_bytes(K);
    assert!(
        w.len() >= 4 * rb && rb >= x.len() * bb,
        "invariant: four whole rows"
    );
    let base = w.as_ptr();
    let per = x.len() / chunks;
    let mut tree = Tree::<4>::new();
    for c in 0..chunks {
        let mut acc = _mm_setzero_ps();
        for (b, xb) in x.iter().enumerate().skip(c * per).take(per) {
            // SAFETY: each row is `rb >= x.len() * bb` bytes long, so block `b` of rows 0..4
            // lies inside `w`; `xb.qs` is 32-byte aligned by `BlockQ8`'s repr
            unsafe {
                let p = [0, 1, 2, 3].map(|i| base.add(i * rb + b * bb));
                let xq = _mm256_load_si256(xb.qs.as_ptr().cast());
                // the next four rows' block: the hardware prefetcher alone leaves a core
                // well short of memory bandwidth on these short interleaved streams
                for p in p {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * rb).cast());
                }
                let dots = p.map(|p| block_dot::<K>(p, xq));
                let mut isum = hsum4_epi32(dots);
                if K == Q4_0 {
                    isum = _mm_sub_epi32(isum, _mm_set1_epi32(8 * xb.sum));
                }
                let (d, m) = scales::<K>(p);
                let dd = _mm_mul_ps(d, _mm_set1_ps(xb.d));
                let mut v = _mm_mul_ps(dd, _mm_cvtepi32_ps(isum));
                if K == Q4_1 {
                    v = _mm_add_ps(v, _mm_mul_ps(m, _mm_set1_ps(xb.s)));
                }
                acc = _mm_add_ps(acc, v);
            }
        }
        let mut part = [0f32; 4];
        // SAFETY: `part` holds four floats
        unsafe { _mm_storeu_ps(part.as_mut_ptr(), acc) };
        tree.push(part);
    }
    tree.finish()
}

/// Four rows times `2 * P` tokens; in result `j`, lanes 0..4 are token `2j`'s rows and 4..8
/// token `2j + 1`'s. Each lane runs the f32 operations of `rows4_avx2`'s lane for its (row,
/// token), in the same order; the `P` accumulators are independent chains.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows4xp_avx2<const K: u8, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[&[BlockQ8]],
    chunks: usize,
) -> [[f32; 8]; P] {
    let bb = block_bytes(K);
    let nb = x[0].len();
    assert!(
        w.len() >= 4 * rb && rb >= nb * bb && x.len() == 2 * P && x.iter().all(|x| x.len() == nb),
        "invariant: four whole rows, 2P tokens of one width"
    );
    let base = w.as_ptr();
    let per = nb / chunks;
    let mut trees = [(); P].map(|()| Tree::<8>::new());
    for c in 0..chunks {
        let mut acc = [_mm256_setzero_ps(); P];
        for (b, _) in x[0].iter().enumerate().skip(c * per).take(per) {
            // SAFETY: each row is `rb >= nb * bb` bytes long, so block `b` of rows 0..4 lies
            // inside `w`; the activation quants are 32-byte aligned by `BlockQ8`'s repr
            unsafe {
                let p = [0, 1, 2, 3].map(|i| base.add(i * rb + b * bb));
                let wv = p.map(|p| weight_quants::<K>(p));
                let (d, m) = scales::<K>(p);
                let (d, m) = (_mm256_set_m128(d, d), _mm256_set_m128(m, m));
                for (j, acc) in acc.iter_mut().enumerate() {
                    let (xa, xb) = (&x[2 * j][b], &x[2 * j + 1][b]);
                    let qa = _mm256_load_si256(xa.qs.as_ptr().cast());
                    let qb = _mm256_load_si256(xb.qs.as_ptr().cast());
                    let dots = [
                        quant_dot::<K>(wv[0], qa),
                        quant_dot::<K>(wv[1], qa),
                        quant_dot::<K>(wv[2], qa),
                        quant_dot::<K>(wv[3], qa),
                        quant_dot::<K>(wv[0], qb),
                        quant_dot::<K>(wv[1], qb),
                        quant_dot::<K>(wv[2], qb),
                        quant_dot::<K>(wv[3], qb),
                    ];
                    let mut isum = hsum8_epi32(dots);
                    if K == Q4_0 {
                        let off = _mm256_set_m128i(
                            _mm_set1_epi32(8 * xb.sum),
                            _mm_set1_epi32(8 * xa.sum),
                        );
                        isum = _mm256_sub_epi32(isum, off);
                    }
                    let xd = _mm256_set_m128(_mm_set1_ps(xb.d), _mm_set1_ps(xa.d));
                    let mut v = _mm256_mul_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(isum));
                    if K == Q4_1 {
                        let xs = _mm256_set_m128(_mm_set1_ps(xb.s), _mm_set1_ps(xa.s));
                        v = _mm256_add_ps(v, _mm256_mul_ps(m, xs));
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

/// A weight block's quants as 32 bytes: q4's nibbles (low half first), q8's signed values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weight_quants<const K: u8>(p: *const u8) -> __m256i {
    if K == Q8_0 {
        unsafe { _mm256_loadu_si256(p.add(q8_0::QS.start).cast()) }
    } else {
        let at = if K == Q4_0 {
            q4_0::QS.start
        } else {
            q4_1::QS.start
        };
        let q = unsafe { _mm_loadu_si128(p.add(at).cast()) };
        let both = _mm256_set_m128i(_mm_srli_epi16::<4>(q), q);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
    }
}

/// `block_dot` on quants `weight_quants` already unpacked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quant_dot<const K: u8>(wq: __m256i, xq: __m256i) -> __m256i {
    let pairs = if K == Q8_0 {
        _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq))
    } else {
        _mm256_maddubs_epi16(wq, xq)
    };
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// The lane sums of eight vectors, in their order (exact integer arithmetic).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum8_epi32(v: [__m256i; 8]) -> __m256i {
    let a = _mm256_hadd_epi32(v[0], v[1]);
    let b = _mm256_hadd_epi32(v[2], v[3]);
    let c = _mm256_hadd_epi32(v[4], v[5]);
    let d = _mm256_hadd_epi32(v[6], v[7]);
    // per 128-bit half: the four vectors' sums over that half
    let e = _mm256_hadd_epi32(a, b);
    let f = _mm256_hadd_epi32(c, d);
    let lo = _mm256_permute2x128_si256::<0x20>(e, f);
    let hi = _mm256_permute2x128_si256::<0x31>(e, f);
    _mm256_add_epi32(lo, hi)
}

/// Eight i32 lanes whose sum is the block's weight-quant times activation-quant dot
/// (without the q4_0 offset).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_dot<const K: u8>(p: *const u8, xq: __m256i) -> __m256i {
    quant_dot::<K>(unsafe { weight_quants::<K>(p) }, xq)
}

/// The four rows' lane sums, as one vector (exact integer arithmetic).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum4_epi32(v: [__m256i; 4]) -> __m128i {
    let a = _mm256_hadd_epi32(v[0], v[1]);
    let b = _mm256_hadd_epi32(v[2], v[3]);
    let h = _mm256_hadd_epi32(a, b);
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// The f16 scales (and, for q4_1, minimums) of the four rows' current blocks, widened.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn scales<const K: u8>(p: [*const u8; 4]) -> (__m128, __m128) {
    // d and m are adjacent f16s at the block start: read both as one u32 per row
    let r = p.map(|p| unsafe { p.cast::<i32>().read_unaligned() });
    let h = _mm_setr_epi32(r[0], r[1], r[2], r[3]);
    if K == Q4_1 {
        let f = _mm256_cvtph_ps(h);
        let split = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        (
            _mm256_castps256_ps128(split),
            _mm256_extractf128_ps::<1>(split),
        )
    } else {
        // keep the low f16 of each u32 (for q8_0/q4_0 the high half is the first quants)
        let lo = _mm_shuffle_epi8(
            h,
            _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1),
        );
        (_mm_cvtph_ps(lo), _mm_setzero_ps())
    }
}
