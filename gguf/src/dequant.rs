//! Reference dequantization to f32, bit-identical to ggml's `dequantize_row_*` (and the `gguf`
//! Python package): every product and sum is evaluated in f32 in the same order, and Rust
//! never contracts `a * b + c` into an FMA, so results match to the last bit.

use anyhow::{bail, Result};

use crate::f16::{bf16_to_f32, f16_to_f32};
use crate::layout::{q4_0, q4_1, q4_k, q6_k, q8_0};
use crate::GgmlType;

/// Dequantizes `bytes`, which hold exactly `out.len()` values of `dtype`, into `out`.
///
/// Works on any whole number of blocks, so a range of rows can be dequantized by passing
/// their bytes (see `GgufFile::tensor_rows`).
pub fn dequantize(dtype: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    dtype.check_supported()?;
    check_lengths(dtype, out.len(), bytes.len())?;
    match dtype {
        GgmlType::F32 => each_block(bytes, out, dtype, |b, y| {
            y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }),
        GgmlType::F16 => each_block(bytes, out, dtype, |b, y| y[0] = f16_to_f32(le16(b, 0))),
        GgmlType::BF16 => each_block(bytes, out, dtype, |b, y| y[0] = bf16_to_f32(le16(b, 0))),
        GgmlType::Q8_0 => each_block(bytes, out, dtype, block_q8_0),
        GgmlType::Q4_0 => each_block(bytes, out, dtype, block_q4_0),
        GgmlType::Q4_1 => each_block(bytes, out, dtype, block_q4_1),
        GgmlType::Q4_K => each_block(bytes, out, dtype, block_q4_k),
        GgmlType::Q6_K => each_block(bytes, out, dtype, block_q6_k),
        _ => unreachable!("invariant: check_supported admitted only the types above"),
    }
    Ok(())
}

/// Fails unless `n_values` is a whole number of `dtype` blocks taking exactly `n_bytes`.
pub(crate) fn check_lengths(dtype: GgmlType, n_values: usize, n_bytes: usize) -> Result<()> {
    let bs = dtype.block_size();
    if !n_values.is_multiple_of(bs) {
        bail!("{n_values} values is not a multiple of the {dtype} block size {bs}");
    }
    let need = n_values / bs * dtype.block_bytes();
    if n_bytes != need {
        bail!("{n_values} values of {dtype} take {need} bytes, got {n_bytes}");
    }
    Ok(())
}

/// Reads a little-endian u16 at `at`.
pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn each_block(bytes: &[u8], out: &mut [f32], dtype: GgmlType, f: impl Fn(&[u8], &mut [f32])) {
    let blocks = bytes.chunks_exact(dtype.block_bytes());
    for (b, y) in blocks.zip(out.chunks_exact_mut(dtype.block_size())) {
        f(b, y);
    }
}

fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_to_f32(le16(b, q8_0::D));
    for (y, &q) in y.iter_mut().zip(&b[q8_0::QS]) {
        *y = f32::from(q as i8) * d;
    }
}

fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_to_f32(le16(b, q4_0::D));
    let (lo, hi) = y.split_at_mut(q4_0::VALUES / 2);
    for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[q4_0::QS]) {
        *l = f32::from((q & 0x0f) as i8 - 8) * d;
        *h = f32::from((q >> 4) as i8 - 8) * d;
    }
}

fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_to_f32(le16(b, q4_1::D));
    let m = f16_to_f32(le16(b, q4_1::M));
    let (lo, hi) = y.split_at_mut(q4_1::VALUES / 2);
    for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[q4_1::QS]) {
        *l = f32::from(q & 0x0f) * d + m;
        *h = f32::from(q >> 4) * d + m;
    }
}

fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_to_f32(le16(b, q4_k::D));
    let dmin = f16_to_f32(le16(b, q4_k::DMIN));
    let scales = &b[q4_k::SCALES];
    for (c, (qs, y)) in b[q4_k::QS]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc_lo, m_lo) = q4_k::scale_min(2 * c, scales);
        let (sc_hi, m_hi) = q4_k::scale_min(2 * c + 1, scales);
        let (d_lo, min_lo) = (d * f32::from(sc_lo), dmin * f32::from(m_lo));
        let (d_hi, min_hi) = (d * f32::from(sc_hi), dmin * f32::from(m_hi));
        let (lo, hi) = y.split_at_mut(32);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(qs) {
            *l = d_lo * f32::from(q & 0x0f) - min_lo;
            *h = d_hi * f32::from(q >> 4) - min_hi;
        }
    }
}

fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_to_f32(le16(b, q6_k::D));
    let scales = &b[q6_k::SCALES];
    for (e, q) in q6_k::quants(b).into_iter().enumerate() {
        let sc = f32::from(scales[e / 16] as i8);
        y[e] = d * sc * f32::from(q as i8 - 32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_wrong_lengths_and_types() {
        let mut out = [0f32; 32];
        let e = dequantize(GgmlType::Q8_0, &[0; 33], &mut out).unwrap_err();
        assert_eq!(e.to_string(), "32 values of q8_0 take 34 bytes, got 33");
        let e = dequantize(GgmlType::Q4_K, &[0; 144], &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "32 values is not a multiple of the q4_k block size 256"
        );
        let e = dequantize(GgmlType::Q5_K, &[], &mut []).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("q5_k is not supported; supported: f32"));
    }

    #[test]
    fn q4_0_packs_low_nibbles_first() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&0x4000u16.to_le_bytes()); // d = 2.0
        b[2] = 0xf0; // value 0: 0 - 8, value 16: 15 - 8
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut y).unwrap();
        assert_eq!(y[0], -16.0);
        assert_eq!(y[16], 14.0);
        assert_eq!(y[1], -16.0);
    }
}
