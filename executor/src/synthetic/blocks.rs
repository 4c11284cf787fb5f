//! The quantized blocks of synthetic weights (`super`'s second definition): block `b` of a
//! tensor drawn field by field from the words `word(key, b * words..)`, no quantizer; each
//! format's formula is on its `Blocks` method. kernels/synth.cu draws the same bytes on a
//! device from `Blocks`' per-tensor fields.

use anyhow::{bail, Result};
use memra_gguf::f16::f16_to_f32;
use memra_gguf::layout::{q4_0, q4_1, q4_k, q6_k, q8_0};
use memra_gguf::GgmlType;

use super::Spread;

/// wyrand at counter `index` of stream `key` (`wyrand`'s state after `index` steps from
/// `key`, mixed by one 64x64 to 128-bit product): 64 random bits, about twice as cheap as
/// `hash`, for the bits of quantized blocks, which are mostly random quants.
fn word(key: u64, index: u64) -> u64 {
    let state = key.wrapping_add(index.wrapping_mul(0xa076_1d64_78bd_642f));
    let product = u128::from(state) * u128::from(state ^ 0xe703_7ed1_a0b4_28db);
    (product >> 64) as u64 ^ product as u64
}

/// The smallest normal f16, 2^-14: scales are kept at or above it where the spread allows.
const F16_MIN_NORMAL: f32 = 1.0 / 16384.0;

/// The largest integer code, at most `nominal` and at least 1, whose super-scale
/// `half / (levels * code)` is still a normal f16: small spreads take small codes rather
/// than subnormal scales (only a spread below `levels * 2^-14` gets a subnormal one).
fn top_code(half: f32, levels: f32, nominal: u8) -> u8 {
    (half / (levels * F16_MIN_NORMAL)).clamp(1.0, f32::from(nominal)) as u8
}

/// Code `top - span + 1 + (r * span >> bits)`: one of the `span` codes up to `top`, from the
/// `bits` low bits `r` of a hash word.
fn code(top: u8, span: u8, r: u64, bits: u32) -> u8 {
    let offset = ((r & ((1 << bits) - 1)) * u64::from(span)) >> bits;
    top + 1 - span + offset as u8
}

/// How the blocks of one quantized tensor are drawn. The f16 fields are computed from the
/// spread alone, so they are the same in every block; the integer codes (quants, sub-block
/// scales, signs) come from the block's own words `word(key, block * words..)`, so a block's
/// bytes are a function of (seed, tensor name, block index) and no quantizer runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Blocks {
    pub dtype: GgmlType,
    /// The f16 super-scale `d`.
    pub d: u16,
    /// The second f16 field: q4_1's minimum `m`, q4_k's `dmin`.
    pub m: u16,
    /// The largest sub-block scale code (q8_0: the largest quant).
    pub top: u8,
    /// How many codes up to `top` the sub-block scales take.
    pub span: u8,
}

impl Blocks {
    /// The blocks of a `dtype` tensor spread as `spread`, or an error for a format that cannot
    /// carry the spread (a center needs a minimum: q4_1 and q4_k).
    pub fn new(dtype: GgmlType, spread: Spread) -> Result<Blocks> {
        let Spread { center, half } = spread;
        let f16 = memra_gguf::f16::f32_to_f16;
        let centered = center == 0.0;
        let (d, m, top, span) = match dtype {
            GgmlType::Q8_0 => {
                let top = top_code(half, 1.0, 127);
                (half / f32::from(top), 0.0, top, 1)
            }
            GgmlType::Q4_0 => (half / 8.0, 0.0, 0, 1),
            GgmlType::Q4_1 => {
                let d = f16_to_f32(f16(half / 8.0));
                (d, center - 7.5 * d, 0, 1)
            }
            GgmlType::Q4_K => {
                let top = top_code(half, 8.0, 63);
                let span = if centered { (top + 1) / 16 } else { 1 }.max(1);
                let d = f16_to_f32(f16(half / (8.0 * f32::from(top))));
                (d, 7.5 * d - center / f32::from(top), top, span)
            }
            GgmlType::Q6_K => {
                let top = top_code(half, 32.0, 127);
                let span = ((top + 1) / 16).max(1);
                (half / (32.0 * f32::from(top)), 0.0, top, span)
            }
            other => bail!("synthetic weights draw no {other} blocks"),
        };
        if !centered && !matches!(dtype, GgmlType::Q4_1 | GgmlType::Q4_K) {
            bail!("a {dtype} matrix cannot carry values centered on {center}: only q4_1 and q4_k blocks have a minimum");
        }
        let (d, m) = (f16(d), f16(m));
        let (d_value, m_value) = (f16_to_f32(d), f16_to_f32(m));
        if !d_value.is_finite() || d_value == 0.0 || !m_value.is_finite() {
            bail!("{dtype} blocks spread over {center} +- {half} need f16 scales out of range");
        }
        Ok(Blocks {
            dtype,
            d,
            m,
            top,
            span,
        })
    }

    /// Words one block takes.
    fn words(&self) -> u64 {
        match self.dtype {
            GgmlType::Q8_0 => 4,
            GgmlType::Q4_0 => 3,
            GgmlType::Q4_1 => 2,
            GgmlType::Q4_K => 17,
            GgmlType::Q6_K => 26,
            _ => unreachable!("invariant: Blocks::new admits only the formats above"),
        }
    }

    /// Block `block` (its index in the whole tensor's row-major blocks) of stream `key`.
    pub fn draw(&self, key: u64, block: u64, out: &mut [u8]) {
        let mut counter = block * self.words();
        let mut next = || {
            counter += 1;
            word(key, counter - 1)
        };
        match self.dtype {
            GgmlType::Q8_0 => self.q8_0(&mut next, out),
            GgmlType::Q4_0 => self.q4_0(&mut next, out),
            GgmlType::Q4_1 => self.q4_1(&mut next, out),
            GgmlType::Q4_K => self.q4_k(&mut next, out),
            GgmlType::Q6_K => self.q6_k(&mut next, out),
            _ => unreachable!("invariant: Blocks::new admits only the formats above"),
        }
    }

    /// q8_0: value `d * q`, `d = half / top` (`top` = 127 unless that makes `d` subnormal),
    /// quants `q` in `-top..=top` from the block's 4 words.
    fn q8_0(&self, next: &mut impl FnMut() -> u64, out: &mut [u8]) {
        out[q8_0::D..q8_0::D + 2].copy_from_slice(&self.d.to_le_bytes());
        // each byte `b` of a word to level `b * levels / 256` of `0..levels`, then to the
        // quant `level - top`, eight bytes at a time: the products of the even and of the odd
        // bytes fit their 16-bit lanes, and the bytes add `-top` without carrying
        const LANES: u64 = 0x00ff_00ff_00ff_00ff;
        const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        let levels = 2 * u64::from(self.top) + 1;
        let minus_top = 0x0101_0101_0101_0101 * u64::from(self.top.wrapping_neg());
        for chunk in out[q8_0::QS].chunks_exact_mut(8) {
            let word = next();
            let even = (((word & LANES) * levels) >> 8) & LANES;
            let odd = (((word >> 8) & LANES) * levels) & !LANES;
            let level = even | odd;
            let q = ((level & LOW7) + (minus_top & LOW7)) ^ ((level ^ minus_top) & HIGH);
            chunk.copy_from_slice(&q.to_le_bytes());
        }
    }

    /// q4_0: value `±d * (q - 8)`, `d = half / 8`, the 32 nibbles `q` the bits of 2 words;
    /// the sign of `d` from a third word's low bit, as ggml's own quantizer stores `d =
    /// max / -8` of either sign, so the values are centered over the blocks.
    fn q4_0(&self, next: &mut impl FnMut() -> u64, out: &mut [u8]) {
        for chunk in out[q4_0::QS].chunks_exact_mut(8) {
            chunk.copy_from_slice(&next().to_le_bytes());
        }
        let d = self.d | (((next() & 1) as u16) << 15);
        out[q4_0::D..q4_0::D + 2].copy_from_slice(&d.to_le_bytes());
    }

    /// q4_1: value `d * q + m`, `d = half / 8`, `m = center - 7.5 * d`, the 32 nibbles `q` the
    /// bits of 2 words: centered levels `center + d * (q - 7.5)`.
    fn q4_1(&self, next: &mut impl FnMut() -> u64, out: &mut [u8]) {
        out[q4_1::D..q4_1::D + 2].copy_from_slice(&self.d.to_le_bytes());
        out[q4_1::M..q4_1::M + 2].copy_from_slice(&self.m.to_le_bytes());
        for chunk in out[q4_1::QS].chunks_exact_mut(8) {
            chunk.copy_from_slice(&next().to_le_bytes());
        }
    }

    /// q4_k: value `d * sc * q - dmin * m` with min codes `m` equal to the scale codes `sc`
    /// and `dmin = 7.5 * d - center / top`, that is `d * sc * (q - 7.5) + center * sc / top`:
    /// `d = half / (8 * top)` (`top` = 63 unless that makes `d` subnormal), each sub-block's
    /// `sc` one of the top `span` codes (a 16th of them) from a byte of the first word (all
    /// `top` when the center is not 0, so the offset is the center), the nibbles `q` the
    /// bits of 16 more words.
    fn q4_k(&self, next: &mut impl FnMut() -> u64, out: &mut [u8]) {
        out[q4_k::D..q4_k::D + 2].copy_from_slice(&self.d.to_le_bytes());
        out[q4_k::DMIN..q4_k::DMIN + 2].copy_from_slice(&self.m.to_le_bytes());
        let word = next();
        let codes: [u8; 8] = std::array::from_fn(|j| code(self.top, self.span, word >> (8 * j), 8));
        out[q4_k::SCALES].copy_from_slice(&pack_q4_k_scales(&codes, &codes));
        for chunk in out[q4_k::QS].chunks_exact_mut(8) {
            chunk.copy_from_slice(&next().to_le_bytes());
        }
    }

    /// q6_k: value `d * sc * (q - 32)`, `d = half / (32 * top)` (`top` = 127 unless that makes
    /// `d` subnormal), each of the 16 scales `sc` one of the top `span` codes (a 16th of
    /// them) with a random sign, from a byte of 2 words (ggml's quantizer stores scales of
    /// either sign, which centers the values), the 6-bit quants `q` (their `ql` and `qh`
    /// bits) the bits of 24 more words.
    fn q6_k(&self, next: &mut impl FnMut() -> u64, out: &mut [u8]) {
        for chunk in out[q6_k::QL.start..q6_k::QH.end].chunks_exact_mut(8) {
            chunk.copy_from_slice(&next().to_le_bytes());
        }
        for chunk in out[q6_k::SCALES].chunks_exact_mut(8) {
            let word = next();
            for (sc, byte) in chunk.iter_mut().zip(word.to_le_bytes()) {
                let magnitude = code(self.top, self.span, u64::from(byte), 7);
                // negated (two's complement) where the byte's top bit is set
                let negate = 0u8.wrapping_sub(byte >> 7);
                *sc = (magnitude ^ negate).wrapping_sub(negate);
            }
        }
        out[q6_k::D..q6_k::D + 2].copy_from_slice(&self.d.to_le_bytes());
    }
}

/// The 12 packed bytes of q4_k's eight 6-bit scales and minimums, the inverse of
/// `memra_gguf::layout::q4_k::scale_min`.
fn pack_q4_k_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::hash;

    #[test]
    fn q4_k_scales_pack_as_ggml_unpacks_them() {
        let sc: [u8; 8] = std::array::from_fn(|j| (hash(1, j as u64) & 63) as u8);
        let m: [u8; 8] = std::array::from_fn(|j| (hash(2, j as u64) & 63) as u8);
        let packed = pack_q4_k_scales(&sc, &m);
        for j in 0..8 {
            assert_eq!(q4_k::scale_min(j, &packed), (sc[j], m[j]), "sub-block {j}");
        }
    }
}
