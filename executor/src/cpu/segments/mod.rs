//! The layer segments of the CPU backend, one function per segment kind, each over one
//! layer's weights and the rank's activations (one or more token rows; the GQA and dense FFN
//! segments batch the rows of a prefill step, each row computed as alone; so do the MLA and
//! MoE segments, the MoE rows grouped by expert, and KDA's products, its convolutions and
//! delta rule running row after row over the row's slot state): GQA (`attn_pre`,
//! `attn_core`), the output projection, the dense FFN and the three MoE segments here; MLA
//! (`mla_pre`, `mla_core`) and DSA (`dsa_select`) in `mla.rs`, KDA (`kda_pre`, `kda_core`) in
//! `kda.rs`, mHC (`hc_pre`) in `../mhc.rs`. With mHC streams the residual lives in `Activations::hc` and `x` holds the
//! running sublayer's input; finishing a sublayer spreads its output over the streams. A segment
//! that ends in a partial sum leaves it in `Activations::partial` with what it holds
//! (`Pending`), so the group's all-reduce, or the segment itself on a lone rank, finishes it
//! the same way everywhere (`finish`).

use anyhow::{bail, Result};
use memra_compiler::plan::reduction_chunks;

use super::kernels::{
    self, combine_into, rms_norm, rope_part, silu_mul, silu_mul_clamped, IndexerCache, KdaState,
    KvCache, LatentCache, Pool, Rotation, Router, Weight,
};
use super::layer::{Gated, GqaWeights, MoeWeights};
use super::mhc::HcState;
use crate::engine::RowAt;
use crate::geometry::RankGeometry;
use crate::weights::{Matrix, Stack};

mod kda;
mod mla;

pub(super) use kda::{kda_core, kda_pre};
pub(super) use mla::{dsa_select, mla_core, mla_pre};

/// What the pending partial sum holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Pending {
    /// A partial of the residual update (attention output, dense FFN).
    #[default]
    Hidden,
    /// `k` weighted expert rows, then the shared experts' partial row when `shared`.
    Experts { k: usize, shared: bool },
}

/// Activations of one rank, `rows` token rows of each; vectors grow to what a segment needs
/// on first use.
#[derive(Default)]
pub(super) struct Activations {
    /// Token rows of the step (1 for decode).
    pub rows: usize,
    pub x: Vec<f32>,
    pub xn: Vec<f32>,
    pub q: Vec<f32>,
    /// GQA's key and value; MLA's `attn_q_a` and `attn_kv_a_mqa` outputs.
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub att: Vec<f32>,
    pub partial: Vec<f32>,
    pub pending: Pending,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// MLA: the q-LoRA rank's activations, the token's cache row, queries and outputs in
    /// latent space.
    pub q_a: Vec<f32>,
    pub kv_row: Vec<f32>,
    pub q_lat: Vec<f32>,
    pub lat: Vec<f32>,
    /// KDA: a projection before its convolution (then the output gate), the low-rank gates'
    /// inner activations, the decay per channel and beta per head.
    pub kda_x: Vec<f32>,
    pub kda_low: Vec<f32>,
    pub kda_g: Vec<f32>,
    pub kda_beta: Vec<f32>,
    /// MoE: router logits and the selected experts with their weights, `top_k` per row.
    pub logits_e: Vec<f32>,
    pub route: Vec<(usize, f32)>,
    /// This rank's vocab slice of the logits of `logits_rows` rows, and the gathered logits
    /// on a group's first rank.
    pub logits: Vec<f32>,
    pub logits_rows: usize,
    pub full_logits: Option<Vec<f32>>,
    /// mHC: the residual's streams and the running sublayer's mixing weights.
    pub hc: Option<HcState>,
    /// DSA: the indexer's queries, head weights, key and gate of every row, and the cells
    /// each row's softmax runs over (row r's end at `cell_ends[r]`).
    pub idx_q: Vec<f32>,
    pub idx_w: Vec<f32>,
    pub idx_k: Vec<f32>,
    pub idx_g: Vec<f32>,
    pub cells: Vec<usize>,
    pub cell_ends: Vec<usize>,
}

/// A layer's state that the next token reads, one per sequence slot. No slot is ever
/// cleared: a row reads only its own slot's positions up to its own, all written by its own
/// sequence, and a KDA state restarts when a sequence starts at position 0.
pub(super) enum Cache {
    Kv(Vec<KvCache>),
    /// MLA's latent rows, and DSA's indexer rows beside them (none without an indexer).
    Latent(Vec<LatentCache>, Vec<IndexerCache>),
    /// A KDA layer's windows and recurrent states, and the plan's context length (the state
    /// itself does not grow).
    Kda(Vec<KdaState>, usize),
}

impl Cache {
    /// Positions each slot holds.
    pub fn capacity(&self) -> usize {
        match self {
            Cache::Kv(c) => c.first().map_or(0, KvCache::capacity),
            Cache::Latent(c, _) => c.first().map_or(0, LatentCache::capacity),
            Cache::Kda(_, capacity) => *capacity,
        }
    }

    /// Sequence slots.
    pub fn slots(&self) -> usize {
        match self {
            Cache::Kv(c) => c.len(),
            Cache::Latent(c, _) => c.len(),
            Cache::Kda(c, _) => c.len(),
        }
    }
}

/// What every segment reads besides its weights.
pub(super) struct Ctx<'a> {
    pub pool: &'a Pool,
    pub geo: &'a RankGeometry,
    /// Slot and position of every row of the step.
    pub at: &'a [RowAt],
}

impl Ctx<'_> {
    fn rotation(&self) -> Rotation {
        Rotation {
            theta: self.geo.theta,
            style: self.geo.rope,
            yarn: self.geo.yarn,
        }
    }
}

/// Query rows per attention task: each cached row is widened once per task.
const ATTENTION_ROWS: usize = 8;

/// `v` with length `n` (its buffer is kept between tokens).
pub(super) fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    v
}

pub(super) fn view(m: &Matrix) -> Weight<'_> {
    Weight {
        dtype: m.dtype,
        data: &m.data,
        rows: m.rows,
        cols: m.cols,
    }
}

/// Matrix `index` of the whole tensor from a stack this rank holds.
fn stacked(s: &Stack, index: usize) -> Option<Weight<'_>> {
    s.matrix(index).map(|data| Weight {
        dtype: s.dtype,
        data,
        rows: s.rows,
        cols: s.cols,
    })
}

/// Gathers part `cols` of every row (rows of `stride` values) of `src` into `dst`, rows of
/// `cols.len()` values.
fn gather(src: &[f32], stride: usize, cols: std::ops::Range<usize>, dst: &mut Vec<f32>) {
    dst.clear();
    for row in src.chunks_exact(stride) {
        dst.extend_from_slice(&row[cols.clone()]);
    }
}

/// Scatters the rows of `src` (rows of `cols.len()` values) into part `cols` of every row of
/// `dst` (rows of `stride` values).
fn scatter(src: &[f32], dst: &mut [f32], stride: usize, cols: std::ops::Range<usize>) {
    // an empty part (a nope-only MLA's rope part) has nothing to scatter
    if cols.is_empty() {
        return;
    }
    for (s, row) in src
        .chunks_exact(cols.len())
        .zip(dst.chunks_exact_mut(stride))
    {
        row[cols.clone()].copy_from_slice(s);
    }
}

/// A product whose K is the full input, for every token row of `x`: every row computed as on
/// one rank.
pub(super) fn full_k(pool: &Pool, w: &Weight, x: &[f32], y: &mut [f32]) {
    let chunks = reduction_chunks(w.cols as u64, w.dtype.block_size() as u64) as usize;
    kernels::matmul(pool, w, x, chunks, y);
}

/// A product over this rank's share of K, for every token row of `x`: the canonical subtree
/// when `chunks` is given.
fn row_parallel(pool: &Pool, m: &Matrix, x: &[f32], chunks: Option<usize>, y: &mut [f32]) {
    let w = view(m);
    let chunks = chunks
        .unwrap_or_else(|| reduction_chunks(w.cols as u64, w.dtype.block_size() as u64) as usize);
    kernels::matmul(pool, &w, x, chunks.max(1), y);
}

/// RMS norm of every row of `x` (rows of `w.len()` values) into `out`.
pub(super) fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    for (x, o) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        rms_norm(x, w, eps, o);
    }
}

/// RMS norm of each `hd`-long head of `v` with the shared weight `w` (qwen3's q/k norms).
fn per_head_norm(v: &mut [f32], w: &[f32], eps: f32, hd: usize) {
    let mut out = vec![0.0; hd];
    for head in v.chunks_exact_mut(hd) {
        rms_norm(head, w, eps, &mut out);
        head.copy_from_slice(&out);
    }
}

/// GQA: norm, q/k/v (+biases, q/k norms), rope; each row at its own position.
pub(super) fn gqa_pre(c: &Ctx, norm: &[f32], g: &GqaWeights, a: &mut Activations) {
    let t = a.rows;
    norm_rows(&a.x, norm, c.geo.eps, &mut a.xn);
    full_k(c.pool, &view(&g.q), &a.xn, sized(&mut a.q, t * g.q.rows));
    full_k(c.pool, &view(&g.k), &a.xn, sized(&mut a.k, t * g.k.rows));
    full_k(c.pool, &view(&g.v), &a.xn, sized(&mut a.v, t * g.v.rows));
    if let Some([bq, bk, bv]) = &g.biases {
        for (v, b) in [(&mut a.q, bq), (&mut a.k, bk), (&mut a.v, bv)] {
            v.chunks_exact_mut(b.len())
                .for_each(|row| kernels::add(row, b));
        }
    }
    let hd = c.geo.head_dim;
    if let Some([nq, nk]) = &g.qk_norm {
        per_head_norm(&mut a.q, nq, c.geo.eps, hd);
        per_head_norm(&mut a.k, nk, c.geo.eps, hd);
    }
    let r = c.rotation();
    for (v, width) in [(&mut a.q, g.q.rows), (&mut a.k, g.k.rows)] {
        for (i, row) in v.chunks_exact_mut(width).enumerate() {
            rope_part(row, hd, 0..hd, c.at[i].pos, &r);
        }
    }
}

/// GQA: cache writes of every row into its slot, then each row's attention over its slot's
/// cache up to its own position (causal), rows spread over the pool's threads; consecutive
/// rows of one sequence share each cached row's widening.
pub(super) fn gqa_core(c: &Ctx, kv: &mut [KvCache], q_width: usize, a: &mut Activations) {
    let kw = a.k.len() / a.rows;
    for ((k, v), at) in a.k.chunks_exact(kw).zip(a.v.chunks_exact(kw)).zip(c.at) {
        kv[at.slot].write(at.pos, k, v);
    }
    let heads = q_width / c.geo.head_dim;
    let att = sized(&mut a.att, a.q.len());
    let (q, kv, at) = (&a.q, &*kv, c.at);
    c.pool
        .split_mut(att, q_width * ATTENTION_ROWS, &|off, piece| {
            let first = off / q_width;
            let rows = &at[first..first + piece.len() / q_width];
            for run in runs(rows) {
                let start = rows[run.start];
                let (from, to) = (run.start * q_width, run.end * q_width);
                kernels::attention_rows(
                    &q[off + from..off + to],
                    &kv[start.slot],
                    heads,
                    start.pos,
                    &mut piece[from..to],
                );
            }
        });
}

/// The runs of `rows` that are consecutive positions of one slot, as row ranges.
fn runs(rows: &[RowAt]) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, at) in rows.iter().enumerate() {
        match out.last_mut() {
            Some(run) if rows[i - 1].slot == at.slot && rows[i - 1].pos + 1 == at.pos => {
                run.end = i + 1
            }
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// The attention output projection over this rank's heads.
pub(super) fn attn_out(c: &Ctx, o: &Matrix, a: &mut Activations) {
    let chunks = c.geo.row_chunks.map(|r| r.0);
    let d = a.x.len();
    row_parallel(c.pool, o, &a.att, chunks, sized(&mut a.partial, d));
    a.pending = Pending::Hidden;
    if !c.geo.attn_reduced {
        finish(a);
    }
}

/// `silu(gate . x) * (up . x)` into `a.gate`, then the down projection (`chunks`) into `out`,
/// for every row of `a.xn`.
fn gated(c: &Ctx, g: &Gated, chunks: Option<usize>, a: &mut Activations, out: &mut [f32]) {
    let t = a.xn.len() / g.gate.cols;
    full_k(
        c.pool,
        &view(&g.gate),
        &a.xn,
        sized(&mut a.gate, t * g.gate.rows),
    );
    full_k(c.pool, &view(&g.up), &a.xn, sized(&mut a.up, t * g.up.rows));
    swiglu(&mut a.gate, &a.up, g.clamp);
    row_parallel(c.pool, &g.down, &a.gate, chunks, out);
}

/// `silu(gate) * up`, clamped when the FFN has a limit.
fn swiglu(gate: &mut [f32], up: &[f32], clamp: Option<f32>) {
    match clamp {
        Some(l) => silu_mul_clamped(gate, up, l),
        None => silu_mul(gate, up),
    }
}

/// A dense FFN: norm, gated product, down projection (this rank's columns).
pub(super) fn dense_ffn(c: &Ctx, norm: &[f32], g: &Gated, a: &mut Activations) {
    norm_rows(&a.x, norm, c.geo.eps, &mut a.xn);
    let mut out = std::mem::take(&mut a.partial);
    out.resize(a.x.len(), 0.0);
    gated(c, g, c.geo.row_chunks.map(|r| r.1), a, &mut out);
    a.partial = out;
    a.pending = Pending::Hidden;
    if c.geo.tp_degree == 1 {
        finish(a);
    }
}

/// MoE: norm, router logits (whole on every rank, so every rank picks the same experts),
/// then each row's route: `top_k` (expert, weight) pairs per row, one row after another.
pub(super) fn moe_router(
    c: &Ctx,
    norm: &[f32],
    e: &MoeWeights,
    router: &Router,
    a: &mut Activations,
) {
    let t = a.rows.max(1);
    let n = e.router.rows;
    norm_rows(&a.x, norm, c.geo.eps, &mut a.xn);
    full_k(
        c.pool,
        &view(&e.router),
        &a.xn,
        sized(&mut a.logits_e, t * n),
    );
    a.route.clear();
    for logits in a.logits_e.chunks_exact(n) {
        let route = router.route(logits, e.bias.as_deref());
        a.route.extend(route);
    }
}

/// MoE: per row, one weighted row per selected expert this rank holds, `-0.0` for the
/// others (see `kernels::moe`); finished at once on a lone rank without shared experts. The
/// rows are grouped by expert, so each expert's matrices are read once for the step; each
/// row's product is the one it would have alone.
pub(super) fn moe_experts(c: &Ctx, e: &MoeWeights, a: &mut Activations) -> Result<()> {
    let t = a.rows.max(1);
    let d = a.x.len() / t;
    let k = a.route.len() / t;
    let shared = e.shared.is_some();
    let per = (k + usize::from(shared)) * d;
    let mut rows = std::mem::take(&mut a.partial);
    rows.resize(t * per, 0.0);
    let route = std::mem::take(&mut a.route);
    // (expert, [(row of the step, slot of the row, weight)]), experts in ascending order
    let mut by_expert: std::collections::BTreeMap<usize, Vec<(usize, usize, f32)>> =
        Default::default();
    for (i, &(expert, weight)) in route.iter().enumerate() {
        by_expert
            .entry(expert)
            .or_default()
            .push((i / k, i % k, weight));
    }
    let (mut xin, mut out) = (Vec::new(), Vec::new());
    for (expert, uses) in by_expert {
        let (Some(gate), Some(up), Some(down)) = (
            stacked(&e.gate, expert),
            stacked(&e.up, expert),
            stacked(&e.down, expert),
        ) else {
            if (e.gate.first..e.gate.first + e.gate.count).contains(&expert) {
                bail!("expert {expert} is held for gate but not for up and down");
            }
            for &(row, slot, _) in &uses {
                rows[row * per + slot * d..][..d].fill(-0.0);
            }
            continue;
        };
        let n = uses.len();
        xin.clear();
        for &(row, ..) in &uses {
            xin.extend_from_slice(&a.xn[row * d..(row + 1) * d]);
        }
        full_k(c.pool, &gate, &xin, sized(&mut a.gate, n * gate.rows));
        full_k(c.pool, &up, &xin, sized(&mut a.up, n * up.rows));
        swiglu(&mut a.gate, &a.up, e.clamp);
        full_k(c.pool, &down, &a.gate, sized(&mut out, n * d));
        for (o, &(row, slot, weight)) in out.chunks_exact(d).zip(&uses) {
            let dst = &mut rows[row * per + slot * d..][..d];
            dst.iter_mut()
                .zip(o)
                .for_each(|(dst, &v)| *dst = v * weight);
        }
    }
    a.route = route;
    a.partial = rows;
    a.pending = Pending::Experts { k, shared };
    if c.geo.tp_degree == 1 && !shared {
        finish(a);
    }
    Ok(())
}

/// MoE: the shared experts, split like a dense FFN, into the last row of each row's expert
/// rows.
pub(super) fn moe_shared(c: &Ctx, e: &MoeWeights, a: &mut Activations) -> Result<()> {
    let (Some(g), Pending::Experts { k, shared: true }) = (&e.shared, a.pending) else {
        bail!("moe_shared without shared experts after moe_experts");
    };
    let t = a.rows.max(1);
    let d = a.x.len() / t;
    let mut rows = std::mem::take(&mut a.partial);
    if t == 1 {
        gated(c, g, c.geo.row_chunks.map(|r| r.1), a, &mut rows[k * d..]);
    } else {
        let mut out = vec![0.0; t * d];
        gated(c, g, c.geo.row_chunks.map(|r| r.1), a, &mut out);
        scatter(&out, &mut rows, (k + 1) * d, k * d..(k + 1) * d);
    }
    a.partial = rows;
    if c.geo.tp_degree == 1 {
        finish(a);
    }
    Ok(())
}

/// Adds the finished pending sum (`a.partial`, or the group's reduced copy of it) to the
/// residual stream.
pub(super) fn finish(a: &mut Activations) {
    let sum = std::mem::take(&mut a.partial);
    finish_with(a, &sum);
    a.partial = sum;
}

/// `finish` with the group's reduced sum: added to the residual, or with mHC streams the
/// sublayer's output (the combined experts) spread over the streams.
pub(super) fn finish_with(a: &mut Activations, sum: &[f32]) {
    if a.hc.is_none() {
        match a.pending {
            Pending::Hidden => kernels::add(&mut a.x, sum),
            Pending::Experts { k, shared } => {
                let d = a.x.len() / a.rows.max(1);
                let per = (k + usize::from(shared)) * d;
                for (sum, x) in sum.chunks_exact(per).zip(a.x.chunks_exact_mut(d)) {
                    combine_into(sum, k, shared, x);
                }
            }
        }
        return;
    };
    super::mhc::finish_streams(a, sum);
}
