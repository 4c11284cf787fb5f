//! The CPU backend's compute kernels on f32 activations: quantized matvecs (AVX2 with a
//! scalar fallback that computes the identical bits), norms, rope (with YaRN), attention over
//! an f32, f16 or bf16 KV cache, MLA over a latent cache (`mla`), MoE routing and the expert
//! combine (`moe`), KDA (`kda`), the DSA indexer (`dsa`), mHC's residual streams (`mhc`), and
//! the element-wise helpers of a decode step.
//!
//! Numerics contract of `matvec` (DESIGN.md "Numerics"): K is cut into `chunks` equal,
//! block-aligned chunks; each chunk is reduced by accumulating its blocks in order in f32,
//! independent of thread count, row count and where the chunk sits; the chunk partials are
//! combined in a balanced binary tree ((c0 + c1) + (c2 + c3)) + ... A tensor-parallel rank
//! holding K/d columns and calling `matvec` with chunks/d chunks therefore gets exactly one
//! subtree of the 1-rank result.
//!
//! `matmul` is the same product for a batch of token rows (prefill): every row of its result
//! has the bits `matvec` gives that token alone; it only shares each weight tile between the
//! tokens while it is in cache.
//!
//! Dot-product strategy: quantized weights (q4_0, q4_1, q8_0, q4_k, q6_k) multiply an 8-bit
//! copy of `x` quantized per block like llama.cpp does (`act`), so each block reduces to an
//! exact integer sum followed by a fixed sequence of f32 operations; float weights (f32, f16,
//! bf16) multiply `x` itself with a fixed lane order. Integer sums make the AVX2 and the
//! scalar code agree bit for bit, whatever the SIMD lane order.

pub(crate) mod act;
mod attention;
mod dsa;
mod elementwise;
mod float;
mod kda;
mod kquant;
mod matmul;
mod mhc;
mod mla;
mod moe;
mod pool;
mod q32;
mod q4pack;
pub(crate) mod reference;
mod rope;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_ops;

use anyhow::{bail, Result};
use memra_gguf::GgmlType;

pub use attention::{attention, attention_rows, KvCache, KvDtype};
pub use dsa::{layer_norm, IndexerCache, Selection};
pub use elementwise::{add, rms_norm, silu_mul, silu_mul_clamped, softmax};
pub use kda::{
    conv_step, decay_gate, decay_gate_bounded, delta_rule, gated_norm, l2_norm_heads, sigmoid,
    DeltaInputs, KdaState,
};
pub use matmul::matmul;
pub use mhc::{hc_collapse, hc_expand, hc_mean, hc_mix, HcAffine, HcMix, MIXES, STREAMS};
pub use mla::{latent_attention, latent_attention_at, LatentCache};
pub use moe::{combine_into, Gating, Router};
pub use pool::Pool;
pub use rope::{rope, rope_part, RopeStyle, Rotation, Yarn};

/// A row-major weight matrix in GGUF row layout: `rows` rows of `cols` values of `dtype`.
#[derive(Clone, Copy, Debug)]
pub struct Weight<'a> {
    /// Element type; one of `memra_gguf::SUPPORTED`.
    pub dtype: GgmlType,
    /// The tensor bytes, `rows * row_bytes()` long.
    pub data: &'a [u8],
    /// Output dimension.
    pub rows: usize,
    /// Reduction dimension (K), a whole number of `dtype` blocks.
    pub cols: usize,
}

impl<'a> Weight<'a> {
    /// A checked weight: supported dtype, whole blocks per row, exactly the right byte count.
    pub fn new(dtype: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Weight<'a>> {
        dtype.check_supported()?;
        let Some(row_bytes) = dtype.bytes_for(cols as u64) else {
            bail!(
                "{cols} columns is not a multiple of the {dtype} block size {}",
                dtype.block_size()
            );
        };
        let need = row_bytes as usize * rows;
        if data.len() != need {
            bail!(
                "a {rows}x{cols} {dtype} weight takes {need} bytes, got {}",
                data.len()
            );
        }
        Ok(Weight {
            dtype,
            data,
            rows,
            cols,
        })
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.block_bytes()
    }
}

/// Whether the AVX2 + FMA + F16C kernels can run on this machine (checked once).
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `y = W x`, with K reduced in `chunks` chunks combined in a balanced tree (see the module
/// doc). Rows are split over the pool's threads; the result does not depend on the split.
///
/// Panics unless `x.len() == w.cols`, `y.len() == w.rows`, `chunks` is a power of two (at
/// most `MAX_CHUNKS`) and each chunk is a whole number of blocks (256 values for q4_k and
/// q6_k, 32 for the other quants): the plan compiler guarantees these.
pub fn matvec(pool: &Pool, w: &Weight, x: &[f32], chunks: usize, y: &mut [f32]) {
    matvec_with(pool, w, x, chunks, y, simd_available());
}

/// `matvec` with the SIMD kernels switched on or off, for the scalar-equals-SIMD tests.
pub(crate) fn matvec_with(
    pool: &Pool,
    w: &Weight,
    x: &[f32],
    chunks: usize,
    y: &mut [f32],
    simd: bool,
) {
    check_product("matvec", w, x.len(), y.len(), 1, chunks);
    let rb = w.row_bytes();
    match w.dtype {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            pool.split_mut(y, 4, &|r0, ys| {
                float::rows(w.dtype, &w.data[r0 * rb..], rb, x, chunks, ys, simd)
            });
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            let xq = act::quantize_q8(x, simd);
            pool.split_mut(y, 4, &|r0, ys| {
                q32::rows(w.dtype, &w.data[r0 * rb..], rb, &xq, chunks, ys, simd)
            });
        }
        GgmlType::Q4_K | GgmlType::Q6_K => {
            let xq = act::quantize_q8k(x, simd);
            pool.split_mut(y, 4, &|r0, ys| {
                kquant::rows(w.dtype, &w.data[r0 * rb..], rb, &xq, chunks, ys, simd)
            });
        }
        other => unreachable!("invariant: {other} weights are rejected by Weight::new"),
    }
}

/// Panics unless `x_len`/`y_len` hold `tokens` rows of `w.cols`/`w.rows` values and `chunks`
/// cuts K into a power of two (at most `MAX_CHUNKS`) of whole blocks.
fn check_product(
    kernel: &str,
    w: &Weight,
    x_len: usize,
    y_len: usize,
    tokens: usize,
    chunks: usize,
) {
    assert_eq!(
        x_len,
        tokens * w.cols,
        "{kernel}: x has {x_len} values for {tokens} rows of {} columns",
        w.cols
    );
    assert_eq!(
        y_len,
        tokens * w.rows,
        "{kernel}: y has {y_len} values for {tokens} rows of {} outputs",
        w.rows
    );
    assert_eq!(
        w.data.len(),
        w.rows * w.row_bytes(),
        "{kernel}: weight byte count"
    );
    assert!(
        chunks.is_power_of_two() && chunks <= MAX_CHUNKS,
        "{kernel}: chunks must be a power of two up to {MAX_CHUNKS}, got {chunks}"
    );
    let block = w.dtype.block_size();
    assert!(
        w.cols.is_multiple_of(chunks * block),
        "{kernel}: {} columns do not split into {chunks} chunks of whole {} blocks",
        w.cols,
        w.dtype
    );
}

/// Dequantizes row `token` of `w` (an embedding table) into `out`, bit-exact with ggml.
///
/// Panics unless `token < w.rows` and `out.len() == w.cols`.
pub fn embed_row(w: &Weight, token: usize, out: &mut [f32]) {
    assert!(
        token < w.rows,
        "embed_row: token {token} is outside the {} rows",
        w.rows
    );
    let rb = w.row_bytes();
    memra_gguf::dequantize(w.dtype, &w.data[token * rb..(token + 1) * rb], out)
        .expect("invariant: Weight::new checked dtype and sizes");
}

/// Most chunks a matvec may use (the depth of `Tree`'s fixed stack).
pub const MAX_CHUNKS: usize = 1 << 16;

/// Combines chunk partials in a balanced binary tree as they arrive, lane-wise over `N` rows.
/// After `count` pushes, slot `l` holds the sum of a finished subtree of 2^l chunks exactly
/// when bit `l` of `count` is set (a binary counter), which yields ((c0 + c1) + (c2 + c3))
/// + ... for a power-of-two count with a few hundred bytes of stack.
pub(crate) struct Tree<const N: usize> {
    /// Slot `l` is initialized exactly while bit `l` of `count` is set; left uninitialized
    /// otherwise, since the kernels build a tree per row and zeroing 17 slots cost more than
    /// reducing a short row.
    slots: [std::mem::MaybeUninit<[f32; N]>; 17],
    count: usize,
}

impl<const N: usize> Tree<N> {
    pub(crate) fn new() -> Self {
        Tree {
            slots: [const { std::mem::MaybeUninit::uninit() }; 17],
            count: 0,
        }
    }

    pub(crate) fn push(&mut self, mut v: [f32; N]) {
        let mut level = 0;
        while self.count >> level & 1 == 1 {
            // SAFETY: bit `level` of `count` is set, so slot `level` holds a finished subtree
            let left = unsafe { self.slots[level].assume_init() };
            for (v, l) in v.iter_mut().zip(left) {
                *v += l;
            }
            level += 1;
        }
        self.slots[level] = std::mem::MaybeUninit::new(v);
        self.count += 1;
    }

    pub(crate) fn finish(&self) -> [f32; N] {
        assert!(
            self.count.is_power_of_two(),
            "invariant: a power-of-two number of chunks was pushed"
        );
        // SAFETY: `count` is a power of two, so its one set bit marks the whole tree's slot
        unsafe { self.slots[self.count.trailing_zeros() as usize].assume_init() }
    }
}

/// Reduces one row: blocks `0..n_blocks` in `chunks` chunks, each accumulated in order from
/// `block(b)`, then tree-combined.
pub(crate) fn reduce_row(
    n_blocks: usize,
    chunks: usize,
    mut block: impl FnMut(usize) -> f32,
) -> f32 {
    let per = n_blocks / chunks;
    let mut tree = Tree::<1>::new();
    for c in 0..chunks {
        let mut acc = 0f32;
        for b in c * per..(c + 1) * per {
            acc += block(b);
        }
        tree.push([acc]);
    }
    tree.finish()[0]
}

/// Reads the little-endian f16 at `b[at..]` as f32.
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    memra_gguf::f16::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// `n` successive `r.uniform()` values: the random vectors of the kernels' tests.
#[cfg(test)]
fn uniform_values(n: usize, r: &mut memra_gguf::rng::Rng) -> Vec<f32> {
    (0..n).map(|_| r.uniform()).collect()
}
