//! Conversions between f32 and the 16-bit float formats GGUF stores (IEEE half, bfloat16) on
//! raw bits, through the `half` crate: widening is exact, narrowing rounds to nearest, ties to
//! even, bit-exact with ggml's reference conversions.

use half::{bf16, f16};

/// Widens IEEE half bits to f32, exactly; a NaN comes back quiet, as ggml's F16C path does.
pub fn f16_to_f32(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

/// Narrows f32 to IEEE half bits, rounding to nearest even; NaN stays a quiet NaN.
pub fn f32_to_f16(f: f32) -> u16 {
    f16::from_f32(f).to_bits()
}

/// Widens bfloat16 bits to f32 by the shift ggml uses. Hand-written because `half`'s
/// `bf16::to_f32` sets the quiet bit of a signaling NaN, which ggml keeps as stored
/// (`bf16_widening_is_ggmls_shift` shows the difference).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Narrows f32 to bfloat16 bits, rounding to nearest even; NaN becomes a quiet NaN.
pub fn f32_to_bf16(f: f32) -> u16 {
    bf16::from_f32(f).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_half_round_trips() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f32_to_f16(f) & 0x7c00 == 0x7c00 && f32_to_f16(f) & 0x3ff != 0);
            } else {
                assert_eq!(f32_to_f16(f), h, "half {h:#06x} -> {f}");
            }
        }
    }

    #[test]
    fn narrowing_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and the next half: ties to even (1.0)
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // 1 + 3 * 2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9: rounds up to even
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        // smallest subnormal is 2^-24; 2^-25 is the tie to zero, a bit above rounds up
        assert_eq!(f32_to_f16(f32::powi(2.0, -25)), 0);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25) * 1.0001), 1);
        assert_eq!(f32_to_f16(-f32::powi(2.0, -24) * 1.5), 0x8002);
        assert_eq!(f32_to_f16(1e-10), 0);
    }

    #[test]
    fn bf16_rounds_and_quiets() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_to_f32(0xc000), -2.0);
    }

    #[test]
    fn bf16_widening_is_ggmls_shift() {
        // ggml_compute_bf16_to_fp32 is `bits << 16` for every input, signaling NaNs included
        for h in [0x7f81, 0xff81, 0x7fbf, 0x0001, 0x7f80] {
            assert_eq!(
                bf16_to_f32(h).to_bits(),
                u32::from(h) << 16,
                "bf16 {h:#06x}"
            );
        }
        assert_ne!(bf16::from_bits(0x7f81).to_f32().to_bits(), 0x7f81_0000);
    }
}
