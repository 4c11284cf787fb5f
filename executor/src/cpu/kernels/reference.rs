//! The f64 references the matvec kernels are checked against, shared by the CPU unit tests
//! and the CUDA self-test: the dequantized weights dotted with the activations the kernel
//! really multiplies, so that what is left is f32 rounding alone.

use memra_gguf::layout::q4_1;
use memra_gguf::GgmlType;

use super::act::{quantize_q8, quantize_q8k};
use super::f16_at;

/// The activations a matvec of `dtype` weights multiplies: `x` itself for float weights,
/// else its 8-bit blocks dequantized (the f64 references of the kernel's tests dot with these).
pub fn effective_x(dtype: GgmlType, x: &[f32]) -> Vec<f32> {
    match dtype {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => x.to_vec(),
        GgmlType::Q4_K | GgmlType::Q6_K => quantize_q8k(x, false)
            .iter()
            .flat_map(|b| b.qs.map(|q| f32::from(q) * b.d))
            .collect(),
        _ => quantize_q8(x, false)
            .iter()
            .flat_map(|b| b.qs.map(|q| f32::from(q) * b.d))
            .collect(),
    }
}

/// For q4_1 the kernel takes a block's minimum times the activations' stored `s` (f16 of
/// `d * sum`, as in the q8_1 format) where a dot with `effective_x` has `d * sum`: the
/// difference, summed over the blocks of one row (`row_bytes`) against `x`.
fn q4_1_min_term_correction(row_bytes: &[u8], x: &[f32]) -> f64 {
    row_bytes
        .chunks_exact(q4_1::BYTES)
        .zip(quantize_q8(x, false))
        .map(|(block, xb)| {
            f64::from(f16_at(block, q4_1::M))
                * (f64::from(xb.s) - f64::from(xb.d) * f64::from(xb.sum))
        })
        .sum()
}

/// Row `row` (dequantized; `row_bytes` its blocks) of a `dtype` matvec against `x` (`xe` its
/// `effective_x`): the exact f64 value the kernel computes up to f32 rounding, and the sum of
/// |w * x| that scales that rounding.
pub fn matvec_row(
    dtype: GgmlType,
    row: &[f32],
    row_bytes: &[u8],
    x: &[f32],
    xe: &[f32],
) -> (f64, f64) {
    let mut exact: f64 = row
        .iter()
        .zip(xe)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    if dtype == GgmlType::Q4_1 {
        exact += q4_1_min_term_correction(row_bytes, x);
    }
    let abs: f64 = row
        .iter()
        .zip(xe)
        .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
        .sum();
    (exact, abs)
}
