//! The ggml tensor element types: ids as stored in GGUF, block geometry, and which of them
//! memra can dequantize. Every id ggml currently assigns is recognized by name so that an
//! unsupported model fails with "q5_k is not supported" rather than "unknown type 13".

use crate::layout;

/// A ggml tensor element type, as stored in a GGUF tensor info.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16: the upper half of an f32.
    BF16,
    /// 32 values: one f16 scale and 32 signed bytes.
    Q8_0,
    /// 32 values: one f16 scale and 32 nibbles offset by 8.
    Q4_0,
    /// 32 values: f16 scale, f16 minimum and 32 nibbles.
    Q4_1,
    /// 256-value super-block of 8 sub-blocks with 6-bit scales and minimums.
    Q4_K,
    /// 256-value super-block of 6-bit quants with 16 signed 8-bit scales.
    Q6_K,
    /// 32 values, 5 bits each, symmetric.
    Q5_0,
    /// 32 values, 5 bits each, with a minimum.
    Q5_1,
    /// 32 values, f32 scale and sum, 8 bits each.
    Q8_1,
    /// 2-bit k-quant.
    Q2_K,
    /// 3-bit k-quant.
    Q3_K,
    /// 5-bit k-quant.
    Q5_K,
    /// 8-bit k-quant used for intermediate dot products.
    Q8_K,
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS,
    /// i-quant, 2.31 bits per weight.
    IQ2_XS,
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS,
    /// i-quant, 1.56 bits per weight.
    IQ1_S,
    /// non-linear 4-bit, 32-value blocks.
    IQ4_NL,
    /// i-quant, 3.44 bits per weight.
    IQ3_S,
    /// i-quant, 2.5 bits per weight.
    IQ2_S,
    /// non-linear 4-bit, 256-value super-blocks.
    IQ4_XS,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit IEEE float.
    F64,
    /// i-quant, 1.75 bits per weight.
    IQ1_M,
    /// ternary, 1.69 bits per weight.
    TQ1_0,
    /// ternary, 2.06 bits per weight.
    TQ2_0,
    /// microscaling fp4 with an e8m0 scale.
    MXFP4,
    /// nvidia fp4 with ue4m3 scales.
    NVFP4,
    /// 1-bit, 128-value blocks.
    Q1_0,
}

/// (type, id, name, values per block, bytes per block), in id order.
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "f32", 1, 4),
    (GgmlType::F16, 1, "f16", 1, 2),
    (
        GgmlType::Q4_0,
        2,
        "q4_0",
        layout::q4_0::VALUES,
        layout::q4_0::BYTES,
    ),
    (
        GgmlType::Q4_1,
        3,
        "q4_1",
        layout::q4_1::VALUES,
        layout::q4_1::BYTES,
    ),
    (GgmlType::Q5_0, 6, "q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "q5_1", 32, 24),
    (
        GgmlType::Q8_0,
        8,
        "q8_0",
        layout::q8_0::VALUES,
        layout::q8_0::BYTES,
    ),
    (GgmlType::Q8_1, 9, "q8_1", 32, 40),
    (GgmlType::Q2_K, 10, "q2_k", 256, 84),
    (GgmlType::Q3_K, 11, "q3_k", 256, 110),
    (
        GgmlType::Q4_K,
        12,
        "q4_k",
        layout::q4_k::VALUES,
        layout::q4_k::BYTES,
    ),
    (GgmlType::Q5_K, 13, "q5_k", 256, 176),
    (
        GgmlType::Q6_K,
        14,
        "q6_k",
        layout::q6_k::VALUES,
        layout::q6_k::BYTES,
    ),
    (GgmlType::Q8_K, 15, "q8_k", 256, 292),
    (GgmlType::IQ2_XXS, 16, "iq2_xxs", 256, 66),
    (GgmlType::IQ2_XS, 17, "iq2_xs", 256, 74),
    (GgmlType::IQ3_XXS, 18, "iq3_xxs", 256, 98),
    (GgmlType::IQ1_S, 19, "iq1_s", 256, 50),
    (GgmlType::IQ4_NL, 20, "iq4_nl", 32, 18),
    (GgmlType::IQ3_S, 21, "iq3_s", 256, 110),
    (GgmlType::IQ2_S, 22, "iq2_s", 256, 82),
    (GgmlType::IQ4_XS, 23, "iq4_xs", 256, 136),
    (GgmlType::I8, 24, "i8", 1, 1),
    (GgmlType::I16, 25, "i16", 1, 2),
    (GgmlType::I32, 26, "i32", 1, 4),
    (GgmlType::I64, 27, "i64", 1, 8),
    (GgmlType::F64, 28, "f64", 1, 8),
    (GgmlType::IQ1_M, 29, "iq1_m", 256, 56),
    (GgmlType::BF16, 30, "bf16", 1, 2),
    (GgmlType::TQ1_0, 34, "tq1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "tq2_0", 256, 66),
    (GgmlType::MXFP4, 39, "mxfp4", 32, 17),
    (GgmlType::NVFP4, 40, "nvfp4", 64, 36),
    (GgmlType::Q1_0, 41, "q1_0", 128, 18),
];

/// The types memra dequantizes, in the order error messages list them.
pub const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE
            .iter()
            .find(|e| e.0 == self)
            .expect("invariant: every GgmlType has a table row")
    }

    /// The type with this GGUF id, or `None` for ids ggml never assigned or has removed.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The type with this lowercase name (`q4_k`, `bf16`, ...).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.2 == name).map(|e| e.0)
    }

    /// The GGUF id of this type.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// The lowercase ggml name, as llama.cpp prints it.
    pub fn name(self) -> &'static str {
        self.entry().2
    }

    /// Number of values in one block (1 for plain float and integer types).
    pub fn block_size(self) -> usize {
        self.entry().3
    }

    /// Number of bytes one block occupies.
    pub fn block_bytes(self) -> usize {
        self.entry().4
    }

    /// Whether memra can dequantize (and run) this type.
    pub fn supported(self) -> bool {
        SUPPORTED.contains(&self)
    }

    /// Fails with "q5_k is not supported; supported: f32, f16, ..." unless `supported()`.
    pub fn check_supported(self) -> anyhow::Result<()> {
        if self.supported() {
            return Ok(());
        }
        anyhow::bail!(
            "{} is not supported; supported: {}",
            self.name(),
            supported_names()
        )
    }

    /// Bytes taken by `n` values, or `None` if `n` is not a whole number of blocks or the
    /// size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The supported type names joined by ", ", for error messages.
pub fn supported_names() -> String {
    let names: Vec<&str> = SUPPORTED.iter().map(|t| t.name()).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for e in TABLE {
            assert_eq!(GgmlType::from_id(e.1), Some(e.0));
            assert_eq!(GgmlType::from_name(e.2), Some(e.0));
            assert_eq!(e.0.id(), e.1);
        }
        // removed ids (q4_2, q4_3, the repacked q4_0 variants) are not recognized
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
    }

    #[test]
    fn unsupported_error_lists_supported() {
        let e = GgmlType::Q5_K.check_supported().unwrap_err().to_string();
        assert_eq!(
            e,
            "q5_k is not supported; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k"
        );
        assert!(GgmlType::Q6_K.check_supported().is_ok());
    }

    #[test]
    fn bytes_for_checks_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
    }
}
