//! The DSA indexer with k-pool compression (glm5-next) on a CUDA device: typed launches of
//! kernels/dsa.cu, with the math of the CPU backend's `cpu::kernels::dsa` (`layer_norm` and
//! `IndexerCache::write` in `dsa_write`, `IndexerCache::select` with ggml's tie order in
//! `dsa_score` then `dsa_select`). The selected cells feed `mla_attention`'s sparse form. The
//! position is read from device memory, so the launches are capturable. An indexer cache
//! holds, per position, the normed key then the pool gate, and one pooled key per complete
//! pool. The rank does not hold indexer caches yet (`rank` refuses DSA layers by name); the
//! self-test checks these launches against the CPU kernels.

use anyhow::Result;
use cudarc::driver::{CudaStream, DeviceSlice, LaunchConfig};

use super::device::CudaDevice;
use super::ops::{grid, int};
use super::span::Span;

/// The widest indexer key the kernels take (DSA_MAX_DIM in kernels/dsa.cu).
pub const MAX_INDEXER_DIM: usize = 1024;
/// The largest pool the kernels take (DSA_MAX_POOL in kernels/dsa.cu).
pub const MAX_POOL: usize = 64;

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
        self.launch(s, "dsa_score_f32", grid(sh.scores_len(), 128), |a| {
            a.arg(&qp).arg(&wp).arg(&w_scale).arg(&pp).arg(&posp);
            a.arg(&id).arg(&ih).arg(&kp).arg(&sp);
        })
    }

    /// The cells the token at `pos[0]` attends to, from `dsa_score`'s row: the best
    /// `top_k / kpool` pools' members (ggml's choice among equal scores), then with
    /// `select_tail` the incomplete pool's tokens; into `cells` (the count, then the
    /// positions; `capacity + 1` values). `idx` is scratch of the padded row's length.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dsa_select(
        &self,
        s: &CudaStream,
        scores: &Span<f32>,
        pos: &Span<u32>,
        sh: IndexerShape,
        (top_k, select_tail): (usize, bool),
        idx: &Span<i32>,
        cells: &Span<i32>,
    ) -> Result<()> {
        assert!(
            scores.len() >= sh.scores_len()
                && idx.len() >= sh.scores_len()
                && cells.len() > sh.capacity,
            "dsa_select: {} positions in pools of {}: scores {}, idx {}, cells {}",
            sh.capacity,
            sh.kpool,
            scores.len(),
            idx.len(),
            cells.len()
        );
        let (sp, posp, ip, cp) = (scores.addr(), pos.addr(), idx.addr(), cells.addr());
        let (kp, top, tail) = (int(sh.kpool), int(top_k), i32::from(select_tail));
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(s, "dsa_select_f32", cfg, |a| {
            a.arg(&sp).arg(&posp).arg(&kp).arg(&top).arg(&tail);
            a.arg(&ip).arg(&cp);
        })
    }
}
