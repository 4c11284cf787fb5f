//! Matvec rows for float weights (f32, f16, bf16) against f32 activations. A chunk of K is
//! reduced in 32 lanes: lane `l` accumulates elements `l, l + 32, ...` of the chunk's whole
//! 32-element groups with a separate multiply and add (no FMA, so the scalar fallback can
//! match), the lanes are summed in a fixed tree, then the chunk's remaining elements are
//! added in order. The AVX2 code holds the 32 lanes in four registers.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use memra_gguf::f16::{bf16_to_f32, f16_to_f32};
use memra_gguf::GgmlType;

use super::Tree;

/// Computes `y[r]` for the rows whose bytes start `w` (row stride `rb`), one per `y` entry.
pub(crate) fn rows(
    dtype: GgmlType,
    w: &[u8],
    rb: usize,
    x: &[f32],
    chunks: usize,
    y: &mut [f32],
    simd: bool,
) {
    let per = x.len() / chunks;
    for (i, y) in y.iter_mut().enumerate() {
        let row = &w[i * rb..(i + 1) * rb];
        let mut tree = Tree::<1>::new();
        for c in 0..chunks {
            let xs = &x[c * per..(c + 1) * per];
            let es = dtype.block_bytes();
            let ws = &row[c * per * es..(c + 1) * per * es];
            tree.push([chunk(dtype, ws, xs, simd)]);
        }
        *y = tree.finish()[0];
    }
}

fn value(dtype: GgmlType, w: &[u8], i: usize) -> f32 {
    match dtype {
        GgmlType::F32 => f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]),
        GgmlType::F16 => f16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])),
        _ => bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])),
    }
}

/// One chunk's partial: `ws` holds the weights of `xs.len()` elements.
fn chunk(dtype: GgmlType, ws: &[u8], xs: &[f32], simd: bool) -> f32 {
    let full = xs.len() / 32 * 32;
    let mut lanes = [0f32; 8];
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is set only when AVX2, FMA and F16C were detected
        lanes = unsafe { lanes_avx2(dtype, ws, &xs[..full]) };
    }
    if !simd {
        let mut acc = [0f32; 32];
        for (g, xg) in xs[..full].chunks_exact(32).enumerate() {
            for (l, (a, &x)) in acc.iter_mut().zip(xg).enumerate() {
                *a += value(dtype, ws, 32 * g + l) * x;
            }
        }
        for (i, lane) in lanes.iter_mut().enumerate() {
            *lane = (acc[i] + acc[8 + i]) + (acc[16 + i] + acc[24 + i]);
        }
    }
    let u = [0, 1, 2, 3].map(|i| lanes[i] + lanes[i + 4]);
    let mut s = (u[0] + u[2]) + (u[1] + u[3]);
    for (i, &x) in xs.iter().enumerate().skip(full) {
        s += value(dtype, ws, i) * x;
    }
    s
}

/// The eight lanes `(a0 + a1) + (a2 + a3)` of the four 8-lane accumulators over `xs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn lanes_avx2(dtype: GgmlType, ws: &[u8], xs: &[f32]) -> [f32; 8] {
    let es = dtype.block_bytes();
    assert!(
        ws.len() >= xs.len() * es,
        "invariant: one weight per activation"
    );
    let mut acc = [_mm256_setzero_ps(); 4];
    for g in 0..xs.len() / 32 {
        for (r, acc) in acc.iter_mut().enumerate() {
            let i = 32 * g + 8 * r;
            // SAFETY: elements i..i + 8 are inside `xs` and, by the assert, inside `ws`
            unsafe {
                let p = ws.as_ptr().add(i * es);
                let w = match dtype {
                    GgmlType::F32 => _mm256_loadu_ps(p.cast()),
                    GgmlType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                    _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                        _mm_loadu_si128(p.cast()),
                    ))),
                };
                let x = _mm256_loadu_ps(xs.as_ptr().add(i));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(w, x));
            }
        }
    }
    let t = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut out = [0f32; 8];
    // SAFETY: `out` holds eight floats
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), t) };
    out
}
