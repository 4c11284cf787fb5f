//! Quantization from f32. F16, BF16, Q8_0, Q4_0 and Q4_1 are bit-identical to ggml's
//! `quantize_row_*_ref`; Q4_K and Q6_K use a simple min-max scheme (valid blocks, sane error,
//! but not ggml's iterative scale search) because memra only needs them for synthetic models.

use anyhow::{bail, Result};

use crate::dequant::check_lengths;
use crate::f16::{f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::ggml_type::supported_names;
use crate::layout::{q4_0, q4_1, q4_k, q6_k, q8_0};
use crate::GgmlType;

/// Quantizes `src` (a whole number of blocks) into `out`, which must be exactly the right size.
pub fn quantize(dtype: GgmlType, src: &[f32], out: &mut [u8]) -> Result<()> {
    if !dtype.supported() {
        bail!(
            "cannot quantize to {dtype}; supported: {}",
            supported_names()
        );
    }
    check_lengths(dtype, src.len(), out.len())?;
    let blocks = out
        .chunks_exact_mut(dtype.block_bytes())
        .zip(src.chunks_exact(dtype.block_size()));
    for (b, x) in blocks {
        match dtype {
            GgmlType::F32 => b.copy_from_slice(&x[0].to_le_bytes()),
            GgmlType::F16 => b.copy_from_slice(&f32_to_f16(x[0]).to_le_bytes()),
            GgmlType::BF16 => b.copy_from_slice(&f32_to_bf16(x[0]).to_le_bytes()),
            GgmlType::Q8_0 => block_q8_0(x, b),
            GgmlType::Q4_0 => block_q4_0(x, b),
            GgmlType::Q4_1 => block_q4_1(x, b),
            GgmlType::Q4_K => block_q4_k(x, b),
            GgmlType::Q6_K => block_q6_k(x, b),
            _ => unreachable!("invariant: only supported types get here"),
        }
    }
    Ok(())
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// `1 / d`, or 0 when `d` is 0 (as ggml does).
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn block_q8_0(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    put16(b, q8_0::D, f32_to_f16(d));
    for (q, &v) in b[q8_0::QS].iter_mut().zip(x) {
        // round half away from zero, like roundf
        *q = (v * id).round() as i8 as u8;
    }
}

fn block_q4_0(x: &[f32], b: &mut [u8]) {
    // the value of largest magnitude, first one on ties, keeps its sign
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = inverse(d);
    put16(b, q4_0::D, f32_to_f16(d));
    let (lo, hi) = x.split_at(q4_0::VALUES / 2);
    for ((q, &l), &h) in b[q4_0::QS].iter_mut().zip(lo).zip(hi) {
        let ql = ((l * id + 8.5) as i8).min(15) as u8;
        let qh = ((h * id + 8.5) as i8).min(15) as u8;
        *q = ql | (qh << 4);
    }
}

fn block_q4_1(x: &[f32], b: &mut [u8]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        min = if v < min { v } else { min };
        max = if v > max { v } else { max };
    }
    let d = (max - min) / 15.0;
    let id = inverse(d);
    put16(b, q4_1::D, f32_to_f16(d));
    put16(b, q4_1::M, f32_to_f16(min));
    let (lo, hi) = x.split_at(q4_1::VALUES / 2);
    for ((q, &l), &h) in b[q4_1::QS].iter_mut().zip(lo).zip(hi) {
        let ql = (((l - min) * id + 0.5) as i8).min(15) as u8;
        let qh = (((h - min) * id + 0.5) as i8).min(15) as u8;
        *q = ql | (qh << 4);
    }
}

/// Rounds `d` through f16 and returns (bits, value actually stored).
fn f16_rounded(d: f32) -> (u16, f32) {
    let bits = f32_to_f16(d);
    (bits, f16_to_f32(bits))
}

fn block_q4_k(x: &[f32], b: &mut [u8]) {
    let mut scale = [0f32; 8];
    let mut minv = [0f32; 8];
    for (j, s) in x.chunks_exact(32).enumerate() {
        let lo = s.iter().fold(0f32, |m, &v| m.min(v));
        let hi = s.iter().fold(f32::MIN, |m, &v| m.max(v));
        scale[j] = (hi - lo) / 15.0;
        minv[j] = -lo;
    }
    let (d_bits, d) = f16_rounded(scale.iter().fold(0f32, |m, &v| m.max(v)) / 63.0);
    let (dmin_bits, dmin) = f16_rounded(minv.iter().fold(0f32, |m, &v| m.max(v)) / 63.0);
    put16(b, q4_k::D, d_bits);
    put16(b, q4_k::DMIN, dmin_bits);
    let sc: [u8; 8] = std::array::from_fn(|j| (scale[j] * inverse(d)).round().min(63.0) as u8);
    let m: [u8; 8] = std::array::from_fn(|j| (minv[j] * inverse(dmin)).round().min(63.0) as u8);
    let s = &mut b[q4_k::SCALES];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
    }
    // each sub-block's inverse scale and offset, once
    let id: [f32; 8] = std::array::from_fn(|j| inverse(d * f32::from(sc[j])));
    let off: [f32; 8] = std::array::from_fn(|j| dmin * f32::from(m[j]));
    let q: [u8; 256] =
        std::array::from_fn(|i| ((x[i] + off[i / 32]) * id[i / 32]).round().clamp(0.0, 15.0) as u8);
    for (c, qs) in b[q4_k::QS].chunks_exact_mut(32).enumerate() {
        for (l, byte) in qs.iter_mut().enumerate() {
            *byte = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
        }
    }
}

fn block_q6_k(x: &[f32], b: &mut [u8]) {
    let scale: [f32; 16] = std::array::from_fn(|k| {
        x[16 * k..16 * k + 16]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            / 31.0
    });
    let (d_bits, d) = f16_rounded(scale.iter().fold(0f32, |m, &v| m.max(v)) / 127.0);
    put16(b, q6_k::D, d_bits);
    let sc: [i8; 16] = std::array::from_fn(|k| (scale[k] * inverse(d)).round().min(127.0) as i8);
    for (s, &v) in b[q6_k::SCALES].iter_mut().zip(&sc) {
        *s = v as u8;
    }
    // stored unsigned: q + 32 in 0..64
    let id: [f32; 16] = std::array::from_fn(|k| inverse(d * f32::from(sc[k])));
    let q: [u8; 256] =
        std::array::from_fn(|i| ((x[i] * id[i / 16]).round().clamp(-32.0, 31.0) + 32.0) as u8);
    for n in 0..2 {
        let q = &q[128 * n..128 * n + 128];
        for l in 0..32 {
            let (q1, q2, q3, q4) = (q[l], q[l + 32], q[l + 64], q[l + 96]);
            b[q6_k::QL.start + 64 * n + l] = (q1 & 0x0f) | ((q3 & 0x0f) << 4);
            b[q6_k::QL.start + 64 * n + l + 32] = (q2 & 0x0f) | ((q4 & 0x0f) << 4);
            b[q6_k::QH.start + 32 * n + l] =
                (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequantize;

    /// Deterministic values in (-1, 1) with a few exact zeros and repeats.
    fn values(n: usize) -> Vec<f32> {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if i % 97 == 0 {
                    0.0
                } else {
                    (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                }
            })
            .collect()
    }

    /// Max |x - dequant(quant(x))| relative to the block's max |x|.
    fn round_trip_error(dtype: GgmlType, x: &[f32]) -> f32 {
        let n_bytes = dtype.bytes_for(x.len() as u64).unwrap() as usize;
        let mut b = vec![0u8; n_bytes];
        quantize(dtype, x, &mut b).unwrap();
        let mut y = vec![0f32; x.len()];
        dequantize(dtype, &b, &mut y).unwrap();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        x.iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
            / amax
    }

    #[test]
    fn round_trip_errors_are_bounded_by_the_bit_width() {
        let x = values(1024);
        for (dtype, bound) in [
            (GgmlType::F32, 0.0),
            (GgmlType::F16, 1e-3),
            (GgmlType::BF16, 4e-3),
            (GgmlType::Q8_0, 1.0 / 127.0),
            (GgmlType::Q4_0, 1.0 / 8.0),
            (GgmlType::Q4_1, 1.0 / 15.0),
            (GgmlType::Q4_K, 2.0 / 15.0),
            (GgmlType::Q6_K, 1.0 / 31.0),
        ] {
            let e = round_trip_error(dtype, &x);
            assert!(e <= bound, "{dtype}: error {e} above {bound}");
            assert!(
                dtype == GgmlType::F32 || e > 0.0,
                "{dtype}: suspiciously exact"
            );
        }
    }

    #[test]
    fn zero_blocks_stay_zero() {
        for dtype in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let x = vec![0f32; 256];
            let mut b = vec![0u8; dtype.bytes_for(256).unwrap() as usize];
            quantize(dtype, &x, &mut b).unwrap();
            let mut y = vec![1f32; 256];
            dequantize(dtype, &b, &mut y).unwrap();
            assert!(y.iter().all(|&v| v == 0.0), "{dtype}");
        }
    }

    #[test]
    fn rejects_unsupported_and_bad_lengths() {
        let e = quantize(GgmlType::Q5_0, &[0.0; 32], &mut [0; 22]).unwrap_err();
        assert!(e.to_string().starts_with("cannot quantize to q5_0"));
        let e = quantize(GgmlType::Q8_0, &[0.0; 32], &mut [0; 30]).unwrap_err();
        assert_eq!(e.to_string(), "32 values of q8_0 take 34 bytes, got 30");
    }
}
