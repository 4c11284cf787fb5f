//! Tensor infos: name, shape in ggml order, element type and where the bytes live. Sizes are
//! computed with saturating arithmetic so a hand-built info can never panic; infos read from
//! a file were checked for overflow when it was opened.

use crate::GgmlType;

/// One tensor's description from the GGUF tensor-info table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the contiguous row length, so an `[out, in]` matrix
    /// has dims `[in, out]`.
    pub dims: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Total number of values.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }

    /// Total number of bytes of the stored (possibly quantized) data.
    pub fn n_bytes(&self) -> u64 {
        let blocks = self.n_elements() / self.dtype.block_size() as u64;
        blocks.saturating_mul(self.dtype.block_bytes() as u64)
    }

    /// Length of one contiguous row (`dims[0]`; 1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of all dims but the first.
    pub fn rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |n, &d| n.saturating_mul(d))
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> u64 {
        let blocks = self.row_len() / self.dtype.block_size() as u64;
        blocks.saturating_mul(self.dtype.block_bytes() as u64)
    }

    /// The shape as `[a, b]`, for messages.
    pub fn dims_string(&self) -> String {
        let d: Vec<String> = self.dims.iter().map(u64::to_string).collect();
        format!("[{}]", d.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_ggml_order() {
        let t = TensorInfo {
            name: "w".into(),
            dims: vec![512, 3],
            dtype: GgmlType::Q4_K,
            offset: 0,
        };
        assert_eq!(t.n_elements(), 1536);
        assert_eq!(t.row_len(), 512);
        assert_eq!(t.rows(), 3);
        assert_eq!(t.row_bytes(), 288);
        assert_eq!(t.n_bytes(), 864);
        assert_eq!(t.dims_string(), "[512, 3]");
    }

    #[test]
    fn hand_built_overflow_saturates() {
        let t = TensorInfo {
            name: "w".into(),
            dims: vec![u64::MAX, u64::MAX],
            dtype: GgmlType::F32,
            offset: 0,
        };
        assert_eq!(t.n_elements(), u64::MAX);
        assert_eq!(t.n_bytes(), u64::MAX);
    }
}
