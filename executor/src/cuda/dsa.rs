//! The DSA indexer with k-pool compression (glm5-next) on a CUDA device: typed launches of
//! kernels/dsa.cu, with the math of the CPU backend's `cpu/kernels/dsa.rs` (`layer_norm` and
//! `IndexerCache::write` in `dsa_write`, `IndexerCache::select` with ggml's tie order in
//! `dsa_score` then `dsa_select`). The selected cells feed `mla_attention`'s sparse form. The
//! position is read from device memory, so the launches are capturable. An indexer cache
//! holds, per position, the normed key then the pool gate, and one pooled key per complete
//! pool; the indexer runs whole on every rank (its tensors are replicated), so every plan
//! selects the same cells. `DsaState` holds a rank's indexer caches, one per DSA layer (zero
//! at load, written in place: capturable), and runs the `dsa_select` segment.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::{CudaStream, DeviceSlice, LaunchConfig};
use memra_compiler::plan::Plan;

use super::batched::{RowProducts, RowsAt};
use super::device::{CudaDevice, DeviceBuffer, PLAIN_DYNAMIC_SHARED};
use super::matvec::Norm;
use super::span::Span;
use super::weights::{full_chunks, grid, int, upload_matrix, DeviceWeight, LayerLoad};
use crate::layer_weights::IndexerWeights as HostIndexer;

/// The widest indexer key the kernels take (DSA_MAX_DIM in kernels/dsa.cu).
pub const MAX_INDEXER_DIM: usize = 1024;
/// The largest pool the kernels take (DSA_MAX_POOL in kernels/dsa.cu).
pub const MAX_POOL: usize = 64;
/// Threads of `dsa_select_f32`'s block (DSA_SELECT_THREADS in kernels/dsa.cu).
const SELECT_THREADS: usize = 256;

/// The shape of one layer's indexer and its cache.
#[derive(Clone, Copy)]
pub(super) struct IndexerShape {
    /// Values of a key (and of a gate, and of one query head).
    pub dim: usize,
    /// Query heads.
    pub heads: usize,
    /// Tokens per pool.
    pub kpool: usize,
    /// Positions the cache holds.
    pub capacity: usize,
}

impl IndexerShape {
    /// Values of the per-position rows (key then gate).
    pub fn rows_len(self) -> usize {
        2 * self.dim * self.capacity
    }

    /// Values of the pooled keys.
    pub fn pooled_len(self) -> usize {
        self.dim * (self.capacity / self.kpool)
    }

    /// Entries of the longest padded score row (llama.cpp's, at the last position).
    pub fn scores_len(self) -> usize {
        (self.capacity / self.kpool + 1).div_ceil(64).max(1) * 64
    }
}

/// The indexer inputs of `dsa_write` besides the cache, for every token row of a step.
pub(super) struct IndexerKey {
    /// The raw keys (`indexer.attn_k` output), `dim` values a row.
    pub key: Span<f32>,
    /// The key norm's weight and bias, and its epsilon (`model.dsa.norm_eps`).
    pub norm: (Span<f32>, Span<f32>, f32),
    /// The pool gates (`indexer.gate` output), `dim` values a row.
    pub gate: Span<f32>,
    /// The position terms, `kpool` rows of `dim`.
    pub ape: Span<f32>,
}

/// The selections of a step's token rows: per row, the cell count then the positions, rows
/// `stride` values apart (the plan's `DsaSummary::selection_values`, what a boundary row
/// carries).
pub(super) struct Cells {
    pub span: Span<i32>,
    pub stride: usize,
}

impl Cells {
    /// The first `rows` rows.
    pub fn rows(&self, rows: usize) -> Cells {
        Cells {
            span: self.span.sub(0, rows * self.stride),
            stride: self.stride,
        }
    }
}

/// A block per token row of `x` threads.
fn rows_config(rows: usize, x: usize, smem: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, rows as u32, 1),
        block_dim: (x as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    }
}

impl CudaDevice {
    /// The token rows at `pos[r]` into an indexer cache (`rows`, `pooled`): their layer-normed
    /// keys and their gates, and the pooled key of each pool a row completes (one launch for
    /// a step of one row; a second, once every row is written, for a step of several).
    /// With `slots` (a batched step), row `r` goes into sequence slot `slots[r]`'s cache,
    /// slot after slot in `rows` and `pooled`.
    pub(super) fn dsa_write(
        &self,
        s: &CudaStream,
        k: &IndexerKey,
        (rows, pooled): (&Span<f32>, &Span<f32>),
        (pos, slots): (&Span<u32>, Option<&DsaSlots>),
        sh: IndexerShape,
    ) -> Result<()> {
        let IndexerShape { dim, kpool, .. } = sh;
        let n = pos.len();
        let sequences = slots.map_or(1, |x| x.sequences);
        assert!(
            (1..=MAX_INDEXER_DIM).contains(&dim)
                && (2..=MAX_POOL).contains(&kpool)
                && n > 0
                && [k.key.len(), k.gate.len()] == [n * dim; 2]
                && [k.norm.0.len(), k.norm.1.len()] == [dim; 2]
                && k.ape.len() == kpool * dim
                && rows.len() == sequences * sh.rows_len()
                && pooled.len() == sequences * sh.pooled_len()
                && slots.is_none_or(|x| x.slots.len() >= n),
            "dsa_write: {n} rows of keys of {dim}, pools of {kpool}: key {}, gate {}, ape {}, rows {}, pooled {}",
            k.key.len(),
            k.gate.len(),
            k.ape.len(),
            rows.len(),
            pooled.len()
        );
        let (kp, wp, bp, gp, ap) = (
            k.key.addr(),
            k.norm.0.addr(),
            k.norm.1.addr(),
            k.gate.addr(),
            k.ape.addr(),
        );
        let (rp, pp, posp, eps) = (rows.addr(), pooled.addr(), pos.addr(), k.norm.2);
        let (id, kpi, cap) = (int(dim), int(kpool), int(sh.capacity));
        let (sp, rows_len, pooled_len) = DsaSlots::args(slots, sh);
        let pool_now = i32::from(n == 1);
        let cfg = rows_config(n, dim.next_multiple_of(32), 0);
        self.launch(s, "dsa_write_f32", cfg, |a| {
            a.arg(&kp).arg(&wp).arg(&bp).arg(&eps).arg(&gp).arg(&ap);
            a.arg(&rp).arg(&pp).arg(&posp).arg(&id).arg(&kpi).arg(&cap);
            a.arg(&pool_now).arg(&sp).arg(&rows_len).arg(&pooled_len);
        })?;
        if n == 1 {
            return Ok(());
        }
        self.launch(s, "dsa_pool_f32", cfg, |a| {
            a.arg(&ap)
                .arg(&rp)
                .arg(&pp)
                .arg(&posp)
                .arg(&id)
                .arg(&kpi)
                .arg(&cap);
            a.arg(&sp).arg(&rows_len).arg(&pooled_len);
        })
    }

    /// The scores of the pools complete at each row's position `pos[r]` into row `r` of
    /// `scores` (padded rows of `sh.scores_len()`, -inf past them): `sum_h w_h relu(q_h .
    /// pool)` with the row's raw head weights `w` times `w_scale`.
    /// With `slots` (a batched step), row `r` reads sequence slot `slots[r]`'s pools.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dsa_score(
        &self,
        s: &CudaStream,
        q: &Span<f32>,
        w: &Span<f32>,
        w_scale: f32,
        pooled: &Span<f32>,
        (pos, slots): (&Span<u32>, Option<&DsaSlots>),
        sh: IndexerShape,
        scores: &Span<f32>,
    ) -> Result<()> {
        let (n, stride) = (pos.len(), sh.scores_len());
        let sequences = slots.map_or(1, |x| x.sequences);
        assert!(
            n > 0
                && q.len() == n * sh.heads * sh.dim
                && w.len() == n * sh.heads
                && pooled.len() == sequences * sh.pooled_len()
                && slots.is_none_or(|x| x.slots.len() >= n)
                && scores.len() >= n * stride,
            "dsa_score: {n} rows of {} heads of {}: q {}, w {}, pooled {}, scores {}",
            sh.heads,
            sh.dim,
            q.len(),
            w.len(),
            pooled.len(),
            scores.len()
        );
        let (qp, wp, pp, posp, sp) = (q.addr(), w.addr(), pooled.addr(), pos.addr(), scores.addr());
        let (id, ih, kp, ss) = (int(sh.dim), int(sh.heads), int(sh.kpool), int(stride));
        let (slp, _, pooled_len) = DsaSlots::args(slots, sh);
        // a warp per entry of the padded row, a grid row per token row
        let mut cfg = grid(stride * 32, 128);
        cfg.grid_dim.1 = n as u32;
        self.launch(s, "dsa_score_f32", cfg, |a| {
            a.arg(&qp).arg(&wp).arg(&w_scale).arg(&pp).arg(&posp);
            a.arg(&id).arg(&ih).arg(&kp).arg(&sp).arg(&ss);
            a.arg(&slp).arg(&pooled_len);
        })
    }

    /// The cells each token row at `pos[r]` attends to, from row `r` of `dsa_score`'s rows:
    /// the best `top_k / kpool` pools' members (ggml's choice among equal scores), then with
    /// `select_tail` the incomplete pool's tokens; into row `r` of `cells`.
    pub(super) fn dsa_select(
        &self,
        s: &CudaStream,
        scores: &Span<f32>,
        pos: &Span<u32>,
        sh: IndexerShape,
        (top_k, select_tail): (usize, bool),
        cells: &Cells,
    ) -> Result<()> {
        let n = pos.len();
        let tail = if select_tail { sh.kpool - 1 } else { 0 };
        assert!(
            n > 0
                && scores.len() >= n * sh.scores_len()
                && cells.span.len() >= n * cells.stride
                && cells.stride > (top_k + tail).min(sh.capacity),
            "dsa_select: {n} rows, {} positions in pools of {}: scores {}, cells {} in rows of {}",
            sh.capacity,
            sh.kpool,
            scores.len(),
            cells.span.len(),
            cells.stride
        );
        // shared memory: the padded row at the capacity as (score, index) entries, rounded up
        // to a power of two, for the parallel sort where it fits; else only the heap's entries
        // (the kernel then always runs the heap, over the row in place: the same cells)
        let heap = 8 * (top_k / sh.kpool).min(sh.scores_len());
        let sort_len = sh.scores_len().next_power_of_two();
        let sort_fits = 8 * sort_len <= self.max_shared_per_block()?;
        let smem = if sort_fits {
            heap.max(8 * sort_len)
        } else {
            heap
        };
        if smem > PLAIN_DYNAMIC_SHARED {
            // fails, naming the bytes, where even the heap does not fit
            self.allow_dynamic_shared("dsa_select_f32", 0, smem)
                .with_context(|| format!("dsa_select: a heap of {} pools", top_k / sh.kpool))?;
        }
        let (sp, posp, cp) = (scores.addr(), pos.addr(), cells.span.addr());
        let (kp, top, tail) = (int(sh.kpool), int(top_k), i32::from(select_tail));
        let sort_len = if sort_fits { int(sort_len) } else { 0 };
        let (ss, cs) = (int(sh.scores_len()), int(cells.stride));
        self.launch(
            s,
            "dsa_select_f32",
            rows_config(n, SELECT_THREADS, smem),
            |a| {
                a.arg(&sp).arg(&posp).arg(&kp).arg(&top).arg(&tail);
                a.arg(&sort_len).arg(&cp).arg(&ss).arg(&cs);
            },
        )
    }
}

/// The rows of a batched step in sequence slots, for the indexer kernels: row `r` belongs to
/// slot `slots[r]` (or is a pad row, `PAD_SLOT`), whose cache follows the previous slot's,
/// `sequences` slots in all.
pub(super) struct DsaSlots<'a> {
    pub slots: &'a Span<u32>,
    pub sequences: usize,
}

impl DsaSlots<'_> {
    /// The kernels' `slots`, `rows_len` and `pooled_len` arguments (a null address without
    /// slots).
    fn args(slots: Option<&DsaSlots>, sh: IndexerShape) -> (u64, i64, i64) {
        let len = |n: usize| i64::try_from(n).expect("invariant: cache offsets fit in i64");
        slots.map_or((0, 0, 0), |x| {
            (x.slots.addr(), len(sh.rows_len()), len(sh.pooled_len()))
        })
    }
}

/// One DSA layer's indexer on the device (`layer_weights::IndexerWeights`, checked there).
pub(super) struct IndexerWeights {
    pub q_b: DeviceWeight,
    pub k: DeviceWeight,
    k_norm: (DeviceBuffer<f32>, DeviceBuffer<f32>),
    pub gate: DeviceWeight,
    ape: DeviceBuffer<f32>,
    pub proj: DeviceWeight,
}

impl IndexerWeights {
    /// Takes layer `l`'s indexer tensors out of `w` and uploads them.
    pub fn take(ld: &mut LayerLoad) -> Result<IndexerWeights> {
        let (plan, l, dev, s) = (ld.plan, ld.l, ld.dev, ld.s);
        let w = &mut *ld.w;
        let h = HostIndexer::take(plan, l, w)?;
        let up = |m| upload_matrix(dev, s, m);
        Ok(IndexerWeights {
            q_b: up(h.q_b)?,
            k: up(h.k)?,
            k_norm: (dev.upload(s, &h.k_norm.0)?, dev.upload(s, &h.k_norm.1)?),
            gate: up(h.gate)?,
            ape: dev.upload(s, &h.ape)?,
            proj: up(h.proj)?,
        })
    }
}

/// A rank's indexer buffers for steps of up to `rows` token rows and one indexer cache (rows,
/// pooled keys) per DSA layer.
pub(super) struct DsaState {
    xn: DeviceBuffer<f32>,
    key: DeviceBuffer<f32>,
    gate: DeviceBuffer<f32>,
    q: DeviceBuffer<f32>,
    w: DeviceBuffer<f32>,
    scores: DeviceBuffer<f32>,
    /// The last selection of each token row (read by `mla_core`), rows `stride` apart.
    cells: DeviceBuffer<i32>,
    stride: usize,
    /// By the rank's layer index; `None` for other layers.
    caches: Vec<Option<(DeviceBuffer<f32>, DeviceBuffer<f32>)>>,
    /// Sequence slots, each with its own caches.
    sequences: usize,
    shape: IndexerShape,
    top_k: usize,
    norm_eps: f32,
}

/// One step's indexer inputs over its token rows: what the indexer's products write.
pub(super) struct IndexerRows {
    pub key: Span<f32>,
    pub gate: Span<f32>,
    /// The raw head weights (`indexer.proj` output).
    pub w: Span<f32>,
    /// The query heads (`indexer.attn_q_b` output).
    pub q: Span<f32>,
}

impl DsaState {
    /// The state of a rank whose layers have an indexer where `layers` says so, for steps of
    /// up to `rows` token rows; made when one does or when the rank otherwise holds a
    /// selection (`sparse`: a shared-indexer layer, or a boundary that carries the
    /// selection); `d` is the model's embedding width.
    pub fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        plan: &Plan,
        (d, rows): (usize, usize),
        layers: &[bool],
        sparse: bool,
    ) -> Result<Option<DsaState>> {
        if !layers.contains(&true) && !sparse {
            return Ok(None);
        }
        let dsa = plan
            .model
            .dsa
            .as_ref()
            .ok_or_else(|| anyhow!("DSA layers without model.dsa in the plan"))?;
        let shape = IndexerShape {
            dim: dsa.head_dim as usize,
            heads: dsa.heads as usize,
            kpool: dsa.kpool as usize,
            capacity: plan.runtime.max_context as usize,
        };
        if shape.dim > MAX_INDEXER_DIM || !(2..=MAX_POOL).contains(&shape.kpool) {
            bail!("model.dsa: indexer keys of {} values in pools of {}; the cuda backend takes keys of up to {MAX_INDEXER_DIM} values and pools of 2 to {MAX_POOL}", shape.dim, shape.kpool);
        }
        if !dsa.select_tail {
            bail!("model.dsa.select_tail = false runs on the cpu backend only (the first tokens may select no cell, which the cpu refuses per position)");
        }
        // a cache per sequence slot, slot after slot
        let sequences = plan.runtime.max_sequences.max(1) as usize;
        let mut caches = Vec::new();
        for &has in layers {
            caches.push(match has {
                true => Some((
                    dev.alloc(s, sequences * shape.rows_len())?,
                    dev.alloc(s, sequences * shape.pooled_len())?,
                )),
                false => None,
            });
        }
        let stride = dsa.selection_values(plan.runtime.max_context) as usize;
        let rows = rows.max(1);
        Ok(Some(DsaState {
            xn: dev.alloc(s, d)?,
            key: dev.alloc(s, rows * shape.dim)?,
            gate: dev.alloc(s, rows * shape.dim)?,
            q: dev.alloc(s, rows * shape.heads * shape.dim)?,
            w: dev.alloc(s, rows * shape.heads)?,
            scores: dev.alloc(s, rows * shape.scores_len())?,
            cells: dev.alloc(s, rows * stride)?,
            stride,
            caches,
            sequences,
            shape,
            top_k: dsa.top_k as usize,
            norm_eps: dsa.norm_eps as f32,
        }))
    }

    /// The indexer products' outputs of a step of `rows` token rows.
    pub fn rows(&self, rows: usize) -> Result<IndexerRows> {
        let sh = self.shape;
        if rows * sh.dim > self.key.len() {
            bail!(
                "a DSA step of {rows} token rows; this rank holds {}",
                self.key.len() / sh.dim
            );
        }
        Ok(IndexerRows {
            key: Span::of(&self.key).sub(0, rows * sh.dim),
            gate: Span::of(&self.gate).sub(0, rows * sh.dim),
            w: Span::of(&self.w).sub(0, rows * sh.heads),
            q: Span::of(&self.q).sub(0, rows * sh.heads * sh.dim),
        })
    }

    /// `dsa_select` of layer `layer` for one token (the CPU's `segments::dsa_select`): the
    /// indexer's key, gate and head weights from the normed input (`norm` of `x`), its query
    /// from the normed q-LoRA activations `q_a`, then [`Self::select_rows`].
    #[allow(clippy::too_many_arguments)]
    pub fn select(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        ix: &IndexerWeights,
        norm: Norm,
        x: &Span<f32>,
        q_a: &Span<f32>,
        layer: usize,
        pos: &Span<u32>,
    ) -> Result<()> {
        let r = self.rows(1)?;
        let ws = [&ix.k, &ix.gate, &ix.proj];
        let ys = [r.key.clone(), r.gate.clone(), r.w.clone()];
        let chunks = full_chunks(&ix.k);
        if ws
            .iter()
            .all(|m| m.dtype == ix.k.dtype && full_chunks(m) == chunks)
        {
            dev.matvec_many(s, &ws, x, Some(norm), chunks, &ys)?;
        } else {
            let xn = Span::of(&self.xn).sub(0, x.len());
            dev.rms_norm(s, x, norm.weight, norm.eps, &mut xn.clone())?;
            for (m, y) in ws.iter().zip(&ys) {
                dev.matvec(s, m, &xn, full_chunks(m), &mut y.clone())?;
            }
        }
        dev.matvec(s, &ix.q_b, q_a, full_chunks(&ix.q_b), &mut r.q.clone())?;
        self.select_rows(dev, s, ix, layer, (&pos.sub(0, 1), None))
    }

    /// `dsa_select` of layer `layer` over a batched step's rows (each in its sequence slot,
    /// `at`): the indexer's products over the rows with the one-row decode's bits from the
    /// normed input (`norm` of `x`, into `xn` where a product needs it) and the normed q-LoRA
    /// rows `q_a`, then [`Self::select_rows`] over the rows' own slots.
    pub fn select_batched(
        &self,
        p: RowProducts,
        (ix, layer): (&IndexerWeights, usize),
        norm: Norm,
        x: (&Span<f32>, &Span<f32>),
        q_a: &Span<f32>,
        at: RowsAt,
    ) -> Result<()> {
        let r = self.rows(at.pos.len())?;
        // as the one-row `select`
        p.normed(
            &[&ix.k, &ix.gate, &ix.proj],
            x,
            norm,
            &[&r.key, &r.gate, &r.w],
        )?;
        p.plain(&ix.q_b, q_a, &r.q)?;
        let slots = DsaSlots {
            slots: at.slots,
            sequences: self.sequences,
        };
        self.select_rows(p.dev, p.s, ix, layer, (at.pos, Some(&slots)))
    }

    /// The indexer of layer `layer` over the token rows at `positions` (one per row), whose
    /// products are in [`Self::rows`]: every row's key and gate into the cache, the pools the
    /// rows complete, then each row's scores and selected cells, as its decode step would
    /// from the same products. With `slots` (a batched step), each row in its own slot's
    /// cache; else in the first slot's.
    pub fn select_rows(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        ix: &IndexerWeights,
        layer: usize,
        (positions, slots): (&Span<u32>, Option<&DsaSlots>),
    ) -> Result<()> {
        let n = positions.len();
        let sh = self.shape;
        let (rows, pooled) = self.caches[layer]
            .as_ref()
            .map(|(r, p)| (Span::of(r), Span::of(p)))
            .ok_or_else(|| anyhow!("dsa_select on a layer without an indexer cache"))?;
        let (rows, pooled) = match slots {
            Some(_) => (rows, pooled),
            None => (rows.sub(0, sh.rows_len()), pooled.sub(0, sh.pooled_len())),
        };
        let r = self.rows(n)?;
        let k = IndexerKey {
            key: r.key,
            norm: (
                Span::of(&ix.k_norm.0),
                Span::of(&ix.k_norm.1),
                self.norm_eps,
            ),
            gate: r.gate,
            ape: Span::of(&ix.ape),
        };
        dev.dsa_write(s, &k, (&rows, &pooled), (positions, slots), sh)?;
        let w_scale = 1.0 / ((sh.dim * sh.heads) as f32).sqrt();
        let scores = Span::of(&self.scores);
        let at = (positions, slots);
        dev.dsa_score(s, &r.q, &r.w, w_scale, &pooled, at, sh, &scores)?;
        dev.dsa_select(
            s,
            &scores,
            positions,
            sh,
            (self.top_k, true),
            &self.cells().rows(n),
        )
    }

    /// The last selection of each token row (or what a boundary brought).
    pub fn cells(&self) -> Cells {
        Cells {
            span: Span::of(&self.cells),
            stride: self.stride,
        }
    }

    /// The selections of the first `rows` token rows as bytes: what a boundary's slot carries
    /// after the residual rows (`Boundary::selection` values a row), for the copies into and
    /// out of a slot.
    pub fn selection_bytes(&self, rows: usize, values: usize) -> Result<Span<u8>> {
        if values != self.stride || rows * values > self.cells.len() {
            bail!(
                "a boundary carries {rows} rows of {values} selection values; this rank holds {} rows of {}",
                self.cells.len() / self.stride,
                self.stride
            );
        }
        Ok(Span::of(&self.cells).sub(0, rows * values).cast())
    }
}
