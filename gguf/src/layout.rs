//! Byte layouts of the quantized blocks memra supports, as ggml lays them out in memory and in
//! GGUF files. The CPU and CUDA backends read raw blocks through these constants; all
//! multi-byte fields are little-endian, `f16` fields are IEEE half floats.

/// Values per k-quant super-block.
pub const QK_K: usize = 256;

/// `block_q8_0`: `d: f16`, `qs: [i8; 32]`; value `i` is `d * qs[i]`.
pub mod q8_0 {
    use std::ops::Range;
    /// Values per block.
    pub const VALUES: usize = 32;
    /// Bytes per block.
    pub const BYTES: usize = 34;
    /// Byte offset of the f16 scale.
    pub const D: usize = 0;
    /// The 32 signed quants.
    pub const QS: Range<usize> = 2..34;
}

/// `block_q4_0`: `d: f16`, `qs: [u8; 16]`; value `i < 16` is `d * ((qs[i] & 15) - 8)`,
/// value `i + 16` is `d * ((qs[i] >> 4) - 8)`.
pub mod q4_0 {
    use std::ops::Range;
    /// Values per block.
    pub const VALUES: usize = 32;
    /// Bytes per block.
    pub const BYTES: usize = 18;
    /// Byte offset of the f16 scale.
    pub const D: usize = 0;
    /// The 16 bytes of packed nibbles.
    pub const QS: Range<usize> = 2..18;
}

/// `block_q4_1`: `d: f16`, `m: f16`, `qs: [u8; 16]`; value `i < 16` is
/// `d * (qs[i] & 15) + m`, value `i + 16` is `d * (qs[i] >> 4) + m`.
pub mod q4_1 {
    use std::ops::Range;
    /// Values per block.
    pub const VALUES: usize = 32;
    /// Bytes per block.
    pub const BYTES: usize = 20;
    /// Byte offset of the f16 scale.
    pub const D: usize = 0;
    /// Byte offset of the f16 minimum.
    pub const M: usize = 2;
    /// The 16 bytes of packed nibbles.
    pub const QS: Range<usize> = 4..20;
}

/// `block_q4_K`: `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight 6-bit scales and eight
/// 6-bit minimums), `qs: [u8; 128]`. Each 64-value chunk `c` uses 32 bytes of `qs`: low
/// nibbles are sub-block `2c`, high nibbles sub-block `2c + 1`; value is
/// `d * sc[j] * q - dmin * m[j]`.
pub mod q4_k {
    use std::ops::Range;
    /// Values per super-block.
    pub const VALUES: usize = super::QK_K;
    /// Bytes per super-block.
    pub const BYTES: usize = 144;
    /// Byte offset of the f16 super-scale.
    pub const D: usize = 0;
    /// Byte offset of the f16 super-minimum.
    pub const DMIN: usize = 2;
    /// The packed 6-bit scales and minimums.
    pub const SCALES: Range<usize> = 4..16;
    /// The 128 bytes of packed nibbles.
    pub const QS: Range<usize> = 16..144;

    /// Scale and minimum of sub-block `j` (0..8) from the 12 packed bytes.
    pub fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
        if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        }
    }
}

/// `block_q6_K`: `ql: [u8; 128]` (low 4 bits), `qh: [u8; 64]` (high 2 bits), `scales: [i8;
/// 16]` (one per 16 values), `d: f16`; value is `d * scales[k] * (q - 32)`.
pub mod q6_k {
    use std::ops::Range;
    /// Values per super-block.
    pub const VALUES: usize = super::QK_K;
    /// Bytes per super-block.
    pub const BYTES: usize = 210;
    /// Low 4 bits of each quant.
    pub const QL: Range<usize> = 0..128;
    /// High 2 bits of each quant.
    pub const QH: Range<usize> = 128..192;
    /// The 16 signed 8-bit sub-block scales.
    pub const SCALES: Range<usize> = 192..208;
    /// Byte offset of the f16 super-scale.
    pub const D: usize = 208;

    /// The 256 unsigned 6-bit quants (`q`, 0..64) of block `b`, in value order: each half of
    /// 128 values takes 64 bytes of `ql` and 32 of `qh`.
    pub fn quants(b: &[u8]) -> [u8; VALUES] {
        let mut out = [0u8; VALUES];
        for n in 0..2 {
            let ql = &b[QL][64 * n..64 * n + 64];
            let qh = &b[QH][32 * n..32 * n + 32];
            for l in 0..32 {
                let h = qh[l];
                let q = [
                    (ql[l] & 0x0f) | ((h & 3) << 4),
                    (ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((h >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4),
                ];
                for (k, q) in q.into_iter().enumerate() {
                    out[128 * n + 32 * k + l] = q;
                }
            }
        }
        out
    }
}
