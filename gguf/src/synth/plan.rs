//! The tensor list of a synthetic model before any value is drawn: names, GGUF dims, storage
//! types and how values are initialized. Every architecture builds its list from the helpers
//! here, so the scale and dtype rules are the same everywhere: a matrix whose GGUF row (dims[0],
//! the dimension its product contracts) has length n is uniform with standard deviation
//! 1/sqrt(n), divided further for projections that write into the residual stream; norms are
//! near 1 and stored as F32, as llama.cpp's converter stores every 1-d tensor.

use crate::GgmlType;

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Init {
    /// Uniform in [-a, a).
    Uniform(f32),
    /// Uniform in [0.9, 1.1): RMS-norm weights.
    Norm,
    /// Uniform in [center - half, center + half).
    Around { center: f32, half: f32 },
}

/// One tensor to generate.
#[derive(Debug)]
pub(crate) struct Planned {
    pub name: String,
    /// GGUF dims, innermost first (dims[0] is the row length).
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    pub init: Init,
    /// The requested dtype did not fit the row and a wider type was chosen.
    pub fell_back: bool,
}

impl Planned {
    /// Rows of `dims[0]` values: the product of the outer dims (1 for a vector).
    pub fn rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }
}

/// A matrix (2-d or 3-d) in `dtype`, or the fallback type when its rows do not fill `dtype`'s
/// blocks; values uniform with standard deviation 1/sqrt(dims[0])/`extra`.
pub(crate) fn matrix(name: String, dims: &[u64], extra: f32, dtype: GgmlType) -> Planned {
    let stored = fallback(dtype, dims[0]);
    Planned {
        name,
        dims: dims.to_vec(),
        dtype: stored,
        init: Init::Uniform(3f32.sqrt() / (dims[0] as f32).sqrt() / extra),
        fell_back: stored != dtype,
    }
}

/// A tensor kept in F32 whatever the model dtype (routers, biases), uniform in [-a, a).
pub(crate) fn f32_uniform(name: String, dims: &[u64], a: f32) -> Planned {
    Planned {
        name,
        dims: dims.to_vec(),
        dtype: GgmlType::F32,
        init: Init::Uniform(a),
        fell_back: false,
    }
}

/// A tensor kept in F32, uniform in [center - half, center + half) (KDA's decay rates).
pub(crate) fn f32_around(name: String, dims: &[u64], center: f32, half: f32) -> Planned {
    Planned {
        name,
        dims: dims.to_vec(),
        dtype: GgmlType::F32,
        init: Init::Around { center, half },
        fell_back: false,
    }
}

/// An RMS-norm weight vector of `len` values.
pub(crate) fn norm(name: String, len: u64) -> Planned {
    Planned {
        name,
        dims: vec![len],
        dtype: GgmlType::F32,
        init: Init::Norm,
        fell_back: false,
    }
}

/// The token embedding: Q8_0 when the model dtype is block-quantized (as llama.cpp's quantizer
/// keeps it), the model dtype otherwise.
pub(crate) fn token_embd(dim: u64, vocab: u64, dtype: GgmlType) -> Planned {
    let embd = if dtype.block_size() > 1 {
        GgmlType::Q8_0
    } else {
        dtype
    };
    let mut p = matrix("token_embd.weight".into(), &[dim, vocab], 1.0, embd);
    p.fell_back = false;
    p
}

/// `dtype`, or Q8_0 (then F16) when rows of length `row` do not fill its blocks, as
/// llama.cpp's quantizer falls back for such tensors.
pub(crate) fn fallback(dtype: GgmlType, row: u64) -> GgmlType {
    [dtype, GgmlType::Q8_0, GgmlType::F16]
        .into_iter()
        .find(|t| row.is_multiple_of(t.block_size() as u64))
        .expect("invariant: f16 fits every row")
}

/// The tensors of one transformer block `blk.N`, named by their suffix, with matrices in the
/// model's dtype.
pub(crate) struct Block {
    prefix: String,
    dtype: GgmlType,
}

impl Block {
    /// Block `layer` of a model whose matrices are in `dtype`.
    pub fn new(layer: u32, dtype: GgmlType) -> Block {
        Block {
            prefix: format!("blk.{layer}"),
            dtype,
        }
    }

    /// The full tensor name of `suffix`, e.g. `blk.3.exp_probs_b.bias`.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    /// The matrix `blk.N.{name}.weight` (see [`matrix`]).
    pub fn matrix(&self, name: &str, dims: &[u64], extra: f32) -> Planned {
        matrix(
            self.name(&format!("{name}.weight")),
            dims,
            extra,
            self.dtype,
        )
    }

    /// The norm vector `blk.N.{name}.weight`.
    pub fn norm(&self, name: &str, len: u64) -> Planned {
        norm(self.name(&format!("{name}.weight")), len)
    }
}

/// The divisor of residual-writing projections for a model of `layers` blocks.
pub(crate) fn residual(layers: u32) -> f32 {
    (2.0 * layers as f32).sqrt()
}

/// The model's tail: the final norm, then the output projection unless the embedding is tied.
pub(crate) fn output_head(dim: u64, vocab: u64, tied: bool, dtype: GgmlType) -> Vec<Planned> {
    let mut p = vec![norm("output_norm.weight".into(), dim)];
    if !tied {
        p.push(matrix("output.weight".into(), &[dim, vocab], 1.0, dtype));
    }
    p
}
