//! The MLA mixer of a batched decode step on a CUDA rank (the rows of several sequences, or a
//! speculative verify span), every row with the bits of a one-row decode step at its position
//! in its own sequence slot: the projections are the batched decode products
//! (`batched::batch_product`, the one-row decode's reduction order), the latent norm and the
//! rope of all rows one launch each (`rope_rows`, as a prefill step's), each row's cache row
//! written into its slot before attention, latent attention with a grid row per token row over
//! its slot, and the per-head absorbed products through `attn_k_b` and `attn_v_b` one
//! expert-mode matvec each over (head, row) slots: each slot is the one-row decode's matvec of
//! its head, over the head's slice of its row gathered head-major.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice};

use super::{MlaState, MlaWeights, QueryPath};
use crate::cuda::batched::{RowProducts, RowsAt};
use crate::cuda::device::CudaDevice;
use crate::cuda::dsa::Cells;
use crate::cuda::matvec::{ExpertSel, Norm, MAX_GRID_Y};
use crate::cuda::span::Span;
use crate::cuda::weights::{full_chunks, DeviceStack};

impl MlaState {
    /// `mla_pre` of the `rows` token rows of `x` of a batched step: the attention norm (into
    /// `xn` where a product needs it), the query and latent products, the latent norm and the
    /// rope of every row, each row's cache row written into its slot, and each head's absorbed
    /// query.
    pub fn pre_batched(
        &self,
        p: RowProducts,
        m: &MlaWeights,
        layer: usize,
        norm: Norm,
        (x, xn): (&Span<f32>, &Span<f32>),
        at: RowsAt,
    ) -> Result<()> {
        let (dev, s) = (p.dev, p.s);
        let rows = at.pos.len();
        let (sh, b) = (m.shape(), self.rows_buffers(rows)?);
        let q = Span::of(&b.q).sub(0, rows * sh.q_rows);
        let kv_a = Span::of(&b.kv_a).sub(0, rows * sh.width);
        let (first, first_y) = match &m.q {
            QueryPath::Direct(w) => (w, q.clone()),
            QueryPath::LowRank { a, .. } => (a, Span::of(&b.q_a).sub(0, rows * a.rows)),
        };
        p.normed(&[first, &m.kv_a], (x, xn), norm, &[&first_y, &kv_a])?;
        if let QueryPath::LowRank { norm, b: q_b, .. } = &m.q {
            let q_norm = Norm {
                weight: norm,
                eps: self.eps,
            };
            // normalized in place (the DSA indexer's query input)
            p.normed(&[q_b], (&first_y, &first_y), q_norm, &[&q])?;
        }
        let cache_rows = Span::of(&b.cache_rows).sub(0, rows * sh.width);
        let q_lat = Span::of(&b.q_lat).sub(0, rows * sh.heads * sh.width);
        self.rope_rows(dev, s, m, (&kv_a, &q), (&cache_rows, &q_lat), at.pos)?;
        let cache = self.cache(layer)?;
        let (width, capacity) = (sh.width, self.capacity);
        dev.mla_store_rows(
            s,
            &cache_rows,
            &cache,
            (at.pos, Some(at.slots)),
            (width, capacity),
        )?;
        self.heads_batched(
            dev,
            s,
            &m.k_b,
            (&q, (sh.q_rows, sh.head_q, sh.nope)),
            (&q_lat, (sh.heads * sh.width, sh.width, sh.kvl)),
            rows,
        )
    }

    /// `mla_core` of a batched step's rows: latent attention of each row's absorbed queries
    /// over its slot (a DSA layer's over its row of `cells`), then each head's value into the
    /// rows of `att`.
    #[allow(clippy::too_many_arguments)]
    pub fn core_batched(
        &self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        m: &MlaWeights,
        layer: usize,
        at: RowsAt,
        att: &Span<f32>,
        cells: Option<&Cells>,
    ) -> Result<()> {
        let rows = at.pos.len();
        let sh = m.shape();
        let lat = self.attend_rows(dev, s, m, layer, (at.pos, Some(at.slots)), cells)?;
        let per_lat = sh.heads * sh.kvl;
        self.heads_batched(
            dev,
            s,
            &m.v_b,
            (&lat, (per_lat, sh.kvl, sh.kvl)),
            (att, (sh.heads * sh.v, sh.v, sh.v)),
            rows,
        )
    }

    /// For each head `h` of `stack` and each of the `rows` rows: the head's slice of the row
    /// of `x` (`(row stride, head stride, length)`) times the head's matrix into its slice of
    /// the row of `y`. The slices are gathered head-major, one expert-mode matvec takes slot
    /// `h * rows + r` with head `h`'s matrix (as the one-row decode's launch takes head `h`),
    /// and the products are scattered back.
    fn heads_batched(
        &self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        stack: &DeviceStack,
        (x, x_at): (&Span<f32>, (usize, usize, usize)),
        (y, y_at): (&Span<f32>, (usize, usize, usize)),
        rows: usize,
    ) -> Result<()> {
        let b = self.rows_buffers(rows)?;
        let heads = stack.count;
        if !x_at.2.is_multiple_of(4) {
            bail!(
                "per-head slices of {} values are not 16-byte aligned for the batched matvec",
                x_at.2
            );
        }
        let (heads_in, head_picks) = b.batched.as_ref().ok_or_else(|| {
            anyhow!("a batched MLA step on a rank allocated for prefill steps only")
        })?;
        let w = &stack.weight;
        // launches of at most MAX_GRID_Y (head, row) slots (a joining prompt's chunk of many
        // rows); every slot is computed alone
        let per_launch = (MAX_GRID_Y / heads.max(1)).max(1);
        for r0 in (0..rows).step_by(per_launch) {
            let n = per_launch.min(rows - r0);
            let x = x.sub(r0 * x_at.0, x.len() - r0 * x_at.0);
            let y = y.sub(r0 * y_at.0, y.len() - r0 * y_at.0);
            let gathered = Span::of(heads_in).sub(0, heads * n * x_at.2);
            let out = Span::of(&b.heads_out).sub(0, heads * n * y_at.2);
            dev.mla_heads_gather(s, &x, x_at, (n, heads), &gathered)?;
            let sel = ExpertSel {
                // head h of token row r at r * heads + h, as a router writes its picks
                ids: Span::of(head_picks).addr(),
                weights: 0,
                order: 0,
                slots: n * heads,
                first: stack.first,
                count: stack.count,
                stride: stack.stride,
                x_stride: x_at.2,
                y_stride: y_at.2,
                token_rows: n,
                x_row_stride: 0,
            };
            dev.matvec_experts(s, &[w], &gathered, None, full_chunks(w), &out, None, sel)?;
            dev.mla_heads_f32(s, &out, (n, heads), &y, y_at)?;
        }
        Ok(())
    }
}
