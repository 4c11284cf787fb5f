//! The MLA mixer of a prefill step on a CUDA rank, over every token row of the chunk at once:
//! the query and latent projections as tensor-core GEMMs, the latent norm and the rope of all
//! rows in one launch each, every row's cache row written before attention, the per-head
//! absorbed products through `attn_k_b` and `attn_v_b` as one grouped GEMM each (a group per
//! head: each head's slices of the rows gathered into a block of their own), and latent
//! attention with a grid row per token row, each over its causal prefix (a DSA layer's over
//! the row's selected cells). The products take f16
//! activations, so the rows differ from decode's in the last bits, as dense prefill's do; a
//! head's products and attention depend on that head alone, and each output row on its own
//! row, so every plan that splits the heads gives each head the 1-rank bits.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice};
use memra_compiler::plan::{mla_attend_rows, mla_parts_len};

use super::{MlaState, MlaWeights, QueryPath, Shape};
use crate::cuda::device::{CudaDevice, DeviceBuffer};
use crate::cuda::dsa::Cells;
use crate::cuda::matvec::Norm;
use crate::cuda::rows::{Groups, GEMM_DEPTH};
use crate::cuda::span::Span;
use crate::cuda::weights::DeviceStack;

/// A rank's MLA buffers for prefill and batched decode steps of up to `rows` token rows.
pub(crate) struct MlaRows {
    rows: usize,
    pub(super) q: DeviceBuffer<f32>,
    pub(super) q_a: DeviceBuffer<f32>,
    pub(super) kv_a: DeviceBuffer<f32>,
    /// Each row's cache row in f32: the normalized latent, then the roped key.
    pub(super) cache_rows: DeviceBuffer<f32>,
    pub(super) q_lat: DeviceBuffer<f32>,
    pub(super) lat: DeviceBuffer<f32>,
    /// f16 product inputs: the normed rows, or each head's slices gathered head-major.
    a16: DeviceBuffer<u16>,
    /// On a rank that takes batched decode steps: their per-head product inputs (each head's
    /// slices gathered head-major in f32), and the rank's head ids once per token row
    /// (`r * heads + h`: head `h`), the picks of their per-head products.
    pub(super) batched: Option<(DeviceBuffer<f32>, DeviceBuffer<i32>)>,
    /// The per-head products, head-major.
    pub(super) heads_out: DeviceBuffer<f32>,
    /// Each head's (first row, rows) in the head-major blocks.
    spans: DeviceBuffer<i32>,
    /// Token rows of one latent attention launch, and its partials.
    pub(super) attend_rows: usize,
    pub(super) parts: DeviceBuffer<f32>,
}

impl MlaRows {
    /// The buffers of `rows` token rows (hidden size `d`) for layers of these shapes, whose
    /// heads on this rank are `head_ids`, with those of batched decode steps where
    /// `batched`.
    pub(super) fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        shapes: &[Shape],
        (lora, head_ids, batched): (usize, &[i32], bool),
        (rows, d, capacity): (usize, usize, usize),
    ) -> Result<MlaRows> {
        let most = |f: &dyn Fn(&Shape) -> usize| shapes.iter().map(f).max().unwrap_or(1).max(1);
        let per_row = most(&|x| mla_parts_len(x.heads, x.kvl, capacity));
        let attend_rows = mla_attend_rows(per_row, rows);
        let widest_head = most(&|x| x.heads * x.nope.max(x.kvl));
        let most_head_values = rows * widest_head.max(most(&|x| x.heads * x.v));
        if most_head_values > i32::MAX as usize {
            bail!("an MLA prefill step of {rows} rows holds {most_head_values} head values, more than the kernels' 32-bit index; lower runtime.prefill_chunk");
        }
        Ok(MlaRows {
            rows,
            q: dev.alloc(s, rows * most(&|x| x.q_rows))?,
            q_a: dev.alloc(s, rows * lora.max(1))?,
            kv_a: dev.alloc(s, rows * most(&|x| x.width))?,
            cache_rows: dev.alloc(s, rows * most(&|x| x.width))?,
            q_lat: dev.alloc(s, rows * most(&|x| x.heads * x.width))?,
            lat: dev.alloc(s, rows * most(&|x| x.heads * x.kvl))?,
            a16: dev.alloc(s, rows * widest_head.max(d).max(lora))?,
            batched: if batched {
                Some((
                    dev.alloc(s, rows * widest_head)?,
                    dev.upload(s, &head_ids.repeat(rows))?,
                ))
            } else {
                None
            },
            heads_out: dev.alloc(s, rows * most(&|x| x.heads * x.kvl.max(x.v)))?,
            spans: dev.alloc(s, 2 * most(&|x| x.heads))?,
            attend_rows,
            parts: dev.alloc(s, attend_rows * per_row)?,
        })
    }
}

/// Whether an MLA layer of hidden size `d`, q-LoRA rank `lora` (0 for a direct query),
/// no-rope head `nope` and latent `kvl` runs its prefill rows here: every product's
/// reduction is whole 64-value GEMM steps (a layer's own check, and a DSA plan's in
/// `prefill_rows`).
pub fn fits(d: usize, lora: usize, nope: usize, kvl: usize) -> bool {
    [d, lora, nope, kvl]
        .iter()
        .all(|w| w.is_multiple_of(GEMM_DEPTH))
}

impl MlaState {
    pub(super) fn rows_buffers(&self, rows: usize) -> Result<&MlaRows> {
        self.rows
            .as_ref()
            .filter(|r| rows <= r.rows)
            .ok_or_else(|| {
                anyhow!("an MLA prefill step of {rows} rows on a rank allocated for fewer")
            })
    }

    /// Whether layer `m` of a model with hidden size `d` takes [`Self::pre_rows`] and
    /// [`Self::core_rows`] (else its prefill rows run one at a time with the decode kernels).
    pub fn takes_rows(&self, m: &MlaWeights, d: usize) -> bool {
        let sh = m.shape();
        self.rows.is_some() && fits(d, m.q_lora(), sh.nope, sh.kvl)
    }

    /// The normed q-LoRA activations of the `rows` token rows `pre_rows` left (the DSA
    /// indexer's query input).
    pub fn q_lora_normed_rows(&self, m: &MlaWeights, rows: usize) -> Result<Span<f32>> {
        match &m.q {
            QueryPath::LowRank { a, .. } => {
                Ok(Span::of(&self.rows_buffers(rows)?.q_a).sub(0, rows * a.rows))
            }
            QueryPath::Direct(_) => {
                bail!("the DSA indexer reads the q-LoRA activations; this layer has a direct query")
            }
        }
    }

    /// `mla_pre` of `rows` token rows of `x` (row `r` at `positions[r]`, `positions[0] + r`):
    /// the attention norm into `xn`, the query and latent products, the latent norm and the
    /// rope of every row, each row's cache row written at its position, and each head's
    /// absorbed query.
    #[allow(clippy::too_many_arguments)]
    pub fn pre_rows(
        &self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        m: &MlaWeights,
        layer: usize,
        norm: Norm,
        (x, xn): (&Span<f32>, &Span<f32>),
        positions: &Span<u32>,
        rows: usize,
    ) -> Result<()> {
        let (sh, b) = (m.shape(), self.rows_buffers(rows)?);
        let d = x.len() / rows;
        let q = Span::of(&b.q).sub(0, rows * sh.q_rows);
        let kv_a = Span::of(&b.kv_a).sub(0, rows * sh.width);
        let a16 = Span::of(&b.a16);
        dev.rms_norm_narrowing(
            s,
            x,
            norm.weight,
            norm.eps,
            &mut xn.clone(),
            Some(&a16.sub(0, rows * d)),
        )?;
        match &m.q {
            QueryPath::Direct(w) => {
                dev.gemm_many(s, &[(w.into(), &q), ((&m.kv_a).into(), &kv_a)], &a16, rows)?;
            }
            QueryPath::LowRank { a, norm, b: q_b } => {
                let q_a = Span::of(&b.q_a).sub(0, rows * a.rows);
                dev.gemm_many(
                    s,
                    &[(a.into(), &q_a), ((&m.kv_a).into(), &kv_a)],
                    &a16,
                    rows,
                )?;
                let a16 = a16.sub(0, rows * a.rows);
                dev.rms_norm_narrowing(s, &q_a, norm, self.eps, &mut q_a.clone(), Some(&a16))?;
                dev.gemm_many(s, &[(q_b.into(), &q)], &a16, rows)?;
            }
        }
        let cache_rows = Span::of(&b.cache_rows).sub(0, rows * sh.width);
        let q_lat = Span::of(&b.q_lat).sub(0, rows * sh.heads * sh.width);
        self.rope_rows(dev, s, m, (&kv_a, &q), (&cache_rows, &q_lat), positions)?;
        let cache = self.cache(layer)?;
        dev.mla_store_rows(
            s,
            &cache_rows,
            &cache,
            (positions, None),
            (sh.width, self.capacity),
        )?;
        self.per_head(
            dev,
            s,
            &m.k_b,
            (&q, (sh.q_rows, sh.head_q, sh.nope)),
            (&q_lat, (sh.heads * sh.width, sh.width, sh.kvl)),
            rows,
        )
    }

    /// The latent norm of the token rows of `kv_a` into their cache rows, and the rope of
    /// their key parts (into the cache rows) and of their query heads' (from `q` into
    /// `q_lat`), row `r` at `positions[r]`: a launch each over every row.
    pub(super) fn rope_rows(
        &self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        m: &MlaWeights,
        (kv_a, q): (&Span<f32>, &Span<f32>),
        (cache_rows, q_lat): (&Span<f32>, &Span<f32>),
        positions: &Span<u32>,
    ) -> Result<()> {
        let sh = m.shape();
        let rows = positions.len();
        dev.rms_norm_strided(
            s,
            kv_a,
            &m.kv_a_norm,
            self.eps,
            cache_rows,
            (rows, sh.width),
        )?;
        let n_rot = sh.width - sh.kvl;
        // a nope layer (glm5-next's) has no rope part to rotate or copy
        if n_rot == 0 {
            return Ok(());
        }
        let end = |span: &Span<f32>, from: usize| span.sub(from, span.len() - from);
        self.rope_launch(
            dev,
            s,
            (&end(kv_a, sh.kvl), sh.width),
            (&end(cache_rows, sh.kvl), sh.width),
            rows,
            n_rot,
            (positions, 1),
        )?;
        self.rope_launch(
            dev,
            s,
            (&end(q, sh.nope), sh.head_q),
            (&end(q_lat, sh.kvl), sh.width),
            rows * sh.heads,
            n_rot,
            (positions, sh.heads),
        )
    }

    /// `mla_core` of the token rows at `positions`: latent attention of each row's absorbed
    /// queries over its causal prefix (a DSA layer's: over its row of `cells`), then each
    /// head's value into the rows of `att`.
    #[allow(clippy::too_many_arguments)]
    pub fn core_rows(
        &self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        m: &MlaWeights,
        layer: usize,
        positions: &Span<u32>,
        att: &Span<f32>,
        cells: Option<&Cells>,
    ) -> Result<()> {
        let rows = positions.len();
        let sh = m.shape();
        let lat = self.attend_rows(dev, s, m, layer, (positions, None), cells)?;
        let per_lat = sh.heads * sh.kvl;
        self.per_head(
            dev,
            s,
            &m.v_b,
            (&lat, (per_lat, sh.kvl, sh.kvl)),
            (att, (sh.heads * sh.v, sh.v, sh.v)),
            rows,
        )
    }

    /// Latent attention of the absorbed queries `q_lat` holds for the token rows at
    /// `positions` (in sequence slots `slots` for a batched step; else slot 0's cache), each
    /// over its causal prefix (a DSA layer's: its row of `cells`), in launches of
    /// `attend_rows` rows; returns the rows' latents.
    pub(super) fn attend_rows(
        &self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        m: &MlaWeights,
        layer: usize,
        (positions, slots): (&Span<u32>, Option<&Span<u32>>),
        cells: Option<&Cells>,
    ) -> Result<Span<f32>> {
        let rows = positions.len();
        let (sh, b) = (m.shape(), self.rows_buffers(rows)?);
        let cache = self.cache(layer)?;
        let q_lat = Span::of(&b.q_lat);
        let (per_q, per_lat) = (sh.heads * sh.width, sh.heads * sh.kvl);
        let lat = Span::of(&b.lat).sub(0, rows * per_lat);
        for r0 in (0..rows).step_by(b.attend_rows) {
            let n = b.attend_rows.min(rows - r0);
            let cells = cells.map(|c| Cells {
                span: c.span.sub(r0 * c.stride, n * c.stride),
                stride: c.stride,
            });
            let slots = slots.map(|x| x.sub(r0, n));
            dev.mla_attention(
                s,
                &q_lat.sub(r0 * per_q, n * per_q),
                None,
                &cache,
                &lat.sub(r0 * per_lat, n * per_lat),
                &Span::of(&b.parts),
                (&positions.sub(r0, n), slots.as_ref()),
                (sh.heads, sh.kvl, sh.width, self.capacity),
                self.kq_scale,
                cells.as_ref(),
            )?;
        }
        Ok(lat)
    }

    /// For each head `h` of `stack` and each of the `rows` rows: the head's slice of the row
    /// of `x` (`(row stride, head stride, length)`) times the head's matrix into its slice of
    /// the row of `y`: the slices gathered head-major in f16, one grouped GEMM, scattered back.
    fn per_head(
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
        let a16 = Span::of(&b.a16).sub(0, heads * rows * x_at.2);
        let out = Span::of(&b.heads_out).sub(0, heads * rows * y_at.2);
        dev.mla_heads_f16(s, x, x_at, (rows, heads), &a16)?;
        let spans: Vec<i32> = (0..heads)
            .flat_map(|h| [h * rows, rows])
            .map(|v| i32::try_from(v).expect("invariant: row counts fit in i32"))
            .collect();
        let groups = Groups {
            spans: Span::of(&b.spans).sub(0, spans.len()),
            count: heads,
            stride: stack.stride,
            most_rows: rows,
        };
        dev.write(s, &spans, &mut groups.spans.clone())?;
        dev.gemm_grouped(s, &[(stack.matrix(0), &out)], &a16, heads * rows, &groups)?;
        dev.mla_heads_f32(s, &out, (rows, heads), y, y_at)
    }

    pub(super) fn cache(&self, layer: usize) -> Result<Span<u16>> {
        self.caches[layer]
            .as_ref()
            .map(Span::of)
            .ok_or_else(|| anyhow!("an MLA segment on a layer without a latent cache"))
    }
}
