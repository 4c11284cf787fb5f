//! The matrix-matrix product of prefill: `Y = X W^T` for a batch of token rows, blocked so
//! that a tile of weight rows is read from memory once and used for every token while it
//! sits in cache. Each (token, row) value is computed by the matvec's operations in the
//! matvec's order (q4_0/q4_1 eight rows at a time from a repacked tile, `q4pack`, for many
//! tokens; q8_0, and q4_0/q4_1 for a few tokens, four rows times four tokens,
//! `q32::rows_tokens`; the rest by the matvec's own row code), so a
//! token's outputs have the bits `matvec` gives it alone: a row's bits do not depend on the
//! batch it rode in.

use memra_gguf::GgmlType;

use super::act::{quantize_q8, quantize_q8k, BlockQ8, BlockQ8K};
use super::q4pack::Packed8;
use super::{check_product, float, kquant, matvec_with, q32, simd_available, Pool, Weight};

/// Weight rows per task: a tile of them stays in the core's cache while every token passes.
const TILE_ROWS: usize = 32;

/// Fewest tokens for which q4_0/q4_1 tiles are repacked: repacking costs about one pass over
/// the weights, which a few tokens (a batched decode step) do not win back, so they take the
/// four-row kernel over the file's layout (same bits either way).
pub(super) const REPACK_MIN_TOKENS: usize = 64;

/// `y[t] = W x[t]` for every token row `t` of `x` (`x.len() / w.cols` rows, `y` row-major
/// with `w.rows` values per token), each row exactly as `matvec` computes it.
///
/// Panics on the sizes `matvec` panics on, per row.
pub fn matmul(pool: &Pool, w: &Weight, x: &[f32], chunks: usize, y: &mut [f32]) {
    matmul_with(pool, w, x, chunks, y, simd_available());
}

/// The activations of every token in the form the weight type multiplies.
enum Rows<'a> {
    F32(Vec<&'a [f32]>),
    Q8(Vec<Vec<BlockQ8>>),
    Q8K(Vec<Vec<BlockQ8K>>),
}

/// `matmul` with the SIMD kernels switched on or off, for the scalar-equals-SIMD tests.
pub(crate) fn matmul_with(
    pool: &Pool,
    w: &Weight,
    x: &[f32],
    chunks: usize,
    y: &mut [f32],
    simd: bool,
) {
    let tokens = x.len() / w.cols.max(1);
    if tokens == 1 {
        return matvec_with(pool, w, x, chunks, y, simd);
    }
    check_product("matmul", w, x.len(), y.len(), tokens, chunks);
    if tokens == 0 {
        return;
    }
    let split = || x.chunks_exact(w.cols);
    let rows = match w.dtype {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Rows::F32(split().collect()),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            let mut q = vec![Vec::new(); tokens];
            pool.split_mut(&mut q, 1, &|t0, qs| {
                for (i, q) in qs.iter_mut().enumerate() {
                    let t = t0 + i;
                    *q = quantize_q8(&x[t * w.cols..(t + 1) * w.cols], simd);
                }
            });
            Rows::Q8(q)
        }
        GgmlType::Q4_K | GgmlType::Q6_K => {
            let mut q = vec![Vec::new(); tokens];
            pool.split_mut(&mut q, 1, &|t0, qs| {
                for (i, q) in qs.iter_mut().enumerate() {
                    let t = t0 + i;
                    *q = quantize_q8k(&x[t * w.cols..(t + 1) * w.cols], simd);
                }
            });
            Rows::Q8K(q)
        }
        other => unreachable!("invariant: {other} weights are rejected by Weight::new"),
    };
    let rb = w.row_bytes();
    let n = w.rows;
    let tiles = n.div_ceil(TILE_ROWS);
    let out = OutPtr(y.as_mut_ptr());
    pool.run(tiles, &|tile| {
        let (r0, r1) = (tile * TILE_ROWS, ((tile + 1) * TILE_ROWS).min(n));
        let wt = &w.data[r0 * rb..r1 * rb];
        // SAFETY: token t's piece is y[t * n + r0 .. t * n + r1]: inside `y` (checked sizes)
        // and disjoint from every other tile's pieces; `run` returns only after all tasks
        let piece = |t: usize| unsafe {
            std::slice::from_raw_parts_mut(out.get().add(t * n + r0), r1 - r0)
        };
        match &rows {
            Rows::F32(xs) => {
                for (t, xt) in xs.iter().enumerate() {
                    float::rows(w.dtype, wt, rb, xt, chunks, piece(t), simd);
                }
            }
            Rows::Q8(xs) => {
                // q4 weights eight rows at a time through the repacked kernel; the rows left
                // over and q8_0 through the matvec's rows
                let q4 = matches!(w.dtype, GgmlType::Q4_0 | GgmlType::Q4_1);
                let packed = if q4 && tokens >= REPACK_MIN_TOKENS {
                    (r1 - r0) / 8 * 8
                } else {
                    0
                };
                for g in (0..packed).step_by(8) {
                    let p = Packed8::new(w.dtype == GgmlType::Q4_1, &wt[g * rb..], rb, xs[0].len());
                    for t in (0..tokens).step_by(2) {
                        let n = (tokens - t).min(2);
                        let two = [xs[t].as_slice(), xs[t + n - 1].as_slice()];
                        let v = p.rows(&two[..n], chunks, simd);
                        for (j, v) in v.iter().enumerate().take(n) {
                            piece(t + j)[g..g + 8].copy_from_slice(v);
                        }
                    }
                }
                let xs: Vec<&[BlockQ8]> = xs.iter().map(Vec::as_slice).collect();
                let mut ys: Vec<&mut [f32]> =
                    (0..tokens).map(|t| &mut piece(t)[packed..]).collect();
                q32::rows_tokens(w.dtype, &wt[packed * rb..], rb, &xs, chunks, &mut ys, simd);
            }
            Rows::Q8K(xs) => {
                for (t, xt) in xs.iter().enumerate() {
                    kquant::rows(w.dtype, wt, rb, xt, chunks, piece(t), simd);
                }
            }
        }
    });
}

/// The output's base pointer, shared by the tile tasks (each writes its own columns).
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint ranges through it while `matmul_with` holds `y` borrowed
unsafe impl Sync for OutPtr {}
impl OutPtr {
    fn get(&self) -> *mut f32 {
        self.0
    }
}
