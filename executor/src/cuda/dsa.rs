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
const SELECT_THREADS: u32 = 256;

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

/// The token's indexer inputs of `dsa_write` besides the cache.
pub(super) struct IndexerKey {
    /// The raw key (`indexer.attn_k` output).
    pub key: Span<f32>,
    /// The key norm's weight and bias, and its epsilon (`model.dsa.norm_eps`).
    pub norm: (Span<f32>, Span<f32>, f32),
    /// The pool gate (`indexer.gate` output).
    pub gate: Span<f32>,
    /// The position terms, `kpool` rows of `dim`.
    pub ape: Span<f32>,
}

impl CudaDevice {
    /// The token at `pos[0]` into an indexer cache (`rows`, `pooled`): its layer-normed key and
    /// its gate, and the pooled key of the pool it completes.
    pub(super) fn dsa_write(
        &self,
        s: &CudaStream,
        k: &IndexerKey,
        (rows, pooled): (&Span<f32>, &Span<f32>),
        pos: &Span<u32>,
        sh: IndexerShape,
    ) -> Result<()> {
        let IndexerShape { dim, kpool, .. } = sh;
        assert!(
            (1..=MAX_INDEXER_DIM).contains(&dim)
                && (2..=MAX_POOL).contains(&kpool)
                && [k.key.len(), k.norm.0.len(), k.norm.1.len(), k.gate.len()] == [dim; 4]
                && k.ape.len() == kpool * dim
                && rows.len() == sh.rows_len()
                && pooled.len() == sh.pooled_len(),
            "dsa_write: keys of {dim}, pools of {kpool}: key {}, ape {}, rows {}, pooled {}",
            k.key.len(),
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
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (dim.next_multiple_of(32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(s, "dsa_write_f32", cfg, |a| {
            a.arg(&kp).arg(&wp).arg(&bp).arg(&eps).arg(&gp).arg(&ap);
            a.arg(&rp).arg(&pp).arg(&posp).arg(&id).arg(&kpi).arg(&cap);
        })
    }

    /// The scores of the pools complete at `pos[0]` into `scores` (the padded row, -inf past
    /// them): `sum_h w_h relu(q_h . pool)` with the raw head weights `w` times `w_scale`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dsa_score(
        &self,
        s: &CudaStream,
        q: &Span<f32>,
        w: &Span<f32>,
        w_scale: f32,
        pooled: &Span<f32>,
        pos: &Span<u32>,
        sh: IndexerShape,
        scores: &Span<f32>,
    ) -> Result<()> {
        assert!(
            q.len() == sh.heads * sh.dim
                && w.len() == sh.heads
                && pooled.len() == sh.pooled_len()
                && scores.len() >= sh.scores_len(),
            "dsa_score: {} heads of {}: q {}, w {}, pooled {}, scores {}",
            sh.heads,
            sh.dim,
            q.len(),
            w.len(),
            pooled.len(),
            scores.len()
        );
        let (qp, wp, pp, posp, sp) = (q.addr(), w.addr(), pooled.addr(), pos.addr(), scores.addr());
        let (id, ih, kp) = (int(sh.dim), int(sh.heads), int(sh.kpool));
        // a warp per entry of the padded row
        self.launch(s, "dsa_score_f32", grid(sh.scores_len() * 32, 128), |a| {
            a.arg(&qp).arg(&wp).arg(&w_scale).arg(&pp).arg(&posp);
            a.arg(&id).arg(&ih).arg(&kp).arg(&sp);
        })
    }

    /// The cells the token at `pos[0]` attends to, from `dsa_score`'s row: the best
    /// `top_k / kpool` pools' members (ggml's choice among equal scores), then with
    /// `select_tail` the incomplete pool's tokens; into `cells` (the count, then the
    /// positions; `capacity + 1` values).
    pub(super) fn dsa_select(
        &self,
        s: &CudaStream,
        scores: &Span<f32>,
        pos: &Span<u32>,
        sh: IndexerShape,
        (top_k, select_tail): (usize, bool),
        cells: &Span<i32>,
    ) -> Result<()> {
        assert!(
            scores.len() >= sh.scores_len() && cells.len() > sh.capacity,
            "dsa_select: {} positions in pools of {}: scores {}, cells {}",
            sh.capacity,
            sh.kpool,
            scores.len(),
            cells.len()
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
        let (sp, posp, cp) = (scores.addr(), pos.addr(), cells.addr());
        let (kp, top, tail) = (int(sh.kpool), int(top_k), i32::from(select_tail));
        let sort_len = if sort_fits { int(sort_len) } else { 0 };
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (SELECT_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        self.launch(s, "dsa_select_f32", cfg, |a| {
            a.arg(&sp).arg(&posp).arg(&kp).arg(&top).arg(&tail);
            a.arg(&sort_len).arg(&cp);
        })
    }
}

/// One DSA layer's indexer on the device (`layer_weights::IndexerWeights`, checked there).
pub(super) struct IndexerWeights {
    q_b: DeviceWeight,
    k: DeviceWeight,
    k_norm: (DeviceBuffer<f32>, DeviceBuffer<f32>),
    gate: DeviceWeight,
    ape: DeviceBuffer<f32>,
    proj: DeviceWeight,
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

/// A rank's indexer buffers and one indexer cache (rows, pooled keys) per DSA layer.
pub(super) struct DsaState {
    xn: DeviceBuffer<f32>,
    key: DeviceBuffer<f32>,
    gate: DeviceBuffer<f32>,
    q: DeviceBuffer<f32>,
    w: DeviceBuffer<f32>,
    scores: DeviceBuffer<f32>,
    /// The last selection: the count, then the positions (read by `mla_core`).
    cells: DeviceBuffer<i32>,
    /// By the rank's layer index; `None` for other layers.
    caches: Vec<Option<(DeviceBuffer<f32>, DeviceBuffer<f32>)>>,
    shape: IndexerShape,
    top_k: usize,
    norm_eps: f32,
}

impl DsaState {
    /// The state of a rank whose layers have an indexer where `layers` says so; made when
    /// one does or when the rank otherwise holds a selection (`sparse`: a shared-indexer
    /// layer, or a boundary that carries the selection); `d` is the model's embedding width.
    pub fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        plan: &Plan,
        d: usize,
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
        let mut caches = Vec::new();
        for &has in layers {
            caches.push(match has {
                true => Some((
                    dev.alloc(s, shape.rows_len())?,
                    dev.alloc(s, shape.pooled_len())?,
                )),
                false => None,
            });
        }
        Ok(Some(DsaState {
            xn: dev.alloc(s, d)?,
            key: dev.alloc(s, shape.dim)?,
            gate: dev.alloc(s, shape.dim)?,
            q: dev.alloc(s, shape.heads * shape.dim)?,
            w: dev.alloc(s, shape.heads)?,
            scores: dev.alloc(s, shape.scores_len())?,
            cells: dev.alloc(s, shape.capacity + 1)?,
            caches,
            shape,
            top_k: dsa.top_k as usize,
            norm_eps: dsa.norm_eps as f32,
        }))
    }

    /// `dsa_select` of layer `layer` (the CPU's `segments::dsa_select`): the indexer's key,
    /// gate and head weights from the normed input (`norm` of `x`), its query from the
    /// normed q-LoRA activations `q_a`, the cache write and the selected cells.
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
        let (rows, pooled) = self.caches[layer]
            .as_ref()
            .map(|(r, p)| (Span::of(r), Span::of(p)))
            .ok_or_else(|| anyhow!("dsa_select on a layer without an indexer cache"))?;
        let (key, gate, w) = (Span::of(&self.key), Span::of(&self.gate), Span::of(&self.w));
        let ws = [&ix.k, &ix.gate, &ix.proj];
        let ys = [key.clone(), gate.clone(), w.clone()];
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
        let q = Span::of(&self.q);
        dev.matvec(s, &ix.q_b, q_a, full_chunks(&ix.q_b), &mut q.clone())?;
        let k = IndexerKey {
            key,
            norm: (
                Span::of(&ix.k_norm.0),
                Span::of(&ix.k_norm.1),
                self.norm_eps,
            ),
            gate,
            ape: Span::of(&ix.ape),
        };
        let sh = self.shape;
        dev.dsa_write(s, &k, (&rows, &pooled), pos, sh)?;
        let w_scale = 1.0 / ((sh.dim * sh.heads) as f32).sqrt();
        let scores = Span::of(&self.scores);
        dev.dsa_score(s, &q, &w, w_scale, &pooled, pos, sh, &scores)?;
        dev.dsa_select(
            s,
            &scores,
            pos,
            sh,
            (self.top_k, true),
            &Span::of(&self.cells),
        )
    }

    /// The cells the last `select` chose (or a boundary brought).
    pub fn cells(&self) -> Span<i32> {
        Span::of(&self.cells)
    }

    /// The first `values` of `cells` as bytes: the count and the cells a boundary row
    /// carries (`Boundary::selection`), for the copies into and out of a slot.
    pub fn selection_bytes(&self, values: usize) -> Result<Span<u8>> {
        if values > self.cells.len() {
            bail!(
                "a boundary carries {values} selection values; this rank holds {}",
                self.cells.len()
            );
        }
        Ok(Span::of(&self.cells).sub(0, values).cast())
    }
}
