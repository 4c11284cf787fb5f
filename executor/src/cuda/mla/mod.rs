//! Multi-head latent attention (deepseek2) on a CUDA rank: the layer's weights, the rank's MLA
//! buffers and f16 latent caches, and the `mla_pre` and `mla_core` segments, with the math of
//! the CPU backend's `segments::mla_pre` and `mla_core`. The plain projections (the query path,
//! `attn_kv_a_mqa`) are ordinary matvecs and the per-head absorbed products through `attn_k_b`
//! and `attn_v_b` one expert-mode matvec each (a grid row per head, the heads' matrices as a
//! stack), all with the canonical chunk counts of a whole K, so every plan reduces in the
//! same order; rope (YaRN included) and the latent attention are kernels/mla.cu. The position
//! is read from device memory throughout, so the segments are captured like any other. A DSA
//! layer (glm5-next: nope MLA, no rope part) carries its indexer, and its attention runs over
//! the cells `dsa::DsaState` selected. A batched decode step's rows (`batched.rs`) each
//! attend over their own sequence slot's cache; a prefill step's (`rows.rs`) over slot 0's.

mod batched;
mod rows;

pub use rows::fits;

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice, LaunchConfig};
use memra_compiler::plan::{mla_parts_len, Mixer, Plan, MLA_CHUNK};

use super::device::{CudaDevice, DeviceBuffer};
use super::dsa::{Cells, IndexerWeights};
use super::matvec::{ExpertSel, Norm};
use super::ops::RopeStyle;
use super::span::Span;
use super::weights::{device_matrix, full_chunks, grid, DeviceStack, DeviceWeight, LayerLoad};
use crate::geometry::RankGeometry;
use crate::rope::{mla_kq_scale, Yarn};

/// Threads of a latent attention block (MLA_THREADS in kernels/mla.cu).
const MLA_THREADS: u32 = 256;
/// `kv_lora_rank + qk_rope_head_dim` the latent attention takes at most (MLA_MAX_WIDTH).
pub const MAX_LATENT_WIDTH: usize = 1024;

/// How the query is made.
pub(super) enum QueryPath {
    /// `attn_q . x`.
    Direct(DeviceWeight),
    /// `attn_q_b . norm(attn_q_a . x)`.
    LowRank {
        a: DeviceWeight,
        norm: DeviceBuffer<f32>,
        b: DeviceWeight,
    },
}

/// One MLA layer's weights on the device: this rank's heads of the query, `attn_k_b` and
/// `attn_v_b` (a stack of one matrix per head), and the whole `attn_kv_a_mqa` and its norm.
pub(super) struct MlaWeights {
    pub q: QueryPath,
    pub kv_a: DeviceWeight,
    pub kv_a_norm: DeviceBuffer<f32>,
    pub k_b: DeviceStack,
    pub v_b: DeviceStack,
    /// The DSA indexer of a `Mixer::Dsa` layer.
    pub indexer: Option<IndexerWeights>,
    /// Whether attention runs over the rank's DSA selection (`Mixer::Dsa`, `DsaShared`).
    pub sparse: bool,
}

impl MlaWeights {
    /// Takes layer `l`'s MLA shards (all but `attn_output`) out of `w`.
    pub fn take(ld: &mut LayerLoad) -> Result<MlaWeights> {
        let (plan, l, dev, s) = (ld.plan, ld.l, ld.dev, ld.s);
        let w = &mut *ld.w;
        let mla =
            plan.model.mla.as_ref().ok_or_else(|| {
                anyhow!("layer {l} is an MLA layer but the plan has no model.mla")
            })?;
        let name = |x: &str| format!("blk.{l}.{x}");
        let q = if mla.q_lora_rank > 0 {
            QueryPath::LowRank {
                a: device_matrix(dev, s, w, &name("attn_q_a.weight"))?,
                norm: dev.upload(s, &w.take_vector(&name("attn_q_a_norm.weight"))?)?,
                b: device_matrix(dev, s, w, &name("attn_q_b.weight"))?,
            }
        } else {
            QueryPath::Direct(device_matrix(dev, s, w, &name("attn_q.weight"))?)
        };
        let kv_a = device_matrix(dev, s, w, &name("attn_kv_a_mqa.weight"))?;
        let kv_a_norm = dev.upload(s, &w.take_vector(&name("attn_kv_a_norm.weight"))?)?;
        let (k_b, v_b) = (
            w.take_stack(&name("attn_k_b.weight"))?,
            w.take_stack(&name("attn_v_b.weight"))?,
        );
        if (k_b.first, k_b.count) != (v_b.first, v_b.count) {
            bail!("layer {l}: the rank holds different heads of attn_k_b and attn_v_b");
        }
        let m = MlaWeights {
            q,
            kv_a,
            kv_a_norm,
            k_b: DeviceStack::upload(dev, s, &k_b)?,
            v_b: DeviceStack::upload(dev, s, &v_b)?,
            indexer: match plan.model.layer_kind(l).mixer {
                Mixer::Dsa => {
                    let mut ld = LayerLoad { plan, l, w, dev, s };
                    Some(IndexerWeights::take(&mut ld)?)
                }
                _ => None,
            },
            sparse: plan.model.layer_kind(l).mixer.is_sparse(),
        };
        let sh = m.shape();
        if sh.heads == 0 || sh.width > MAX_LATENT_WIDTH || sh.width < sh.kvl {
            bail!("layer {l}: {} heads and latent rows of {} values; the cuda backend takes 1 or more heads and rows of up to {MAX_LATENT_WIDTH}, the latent then the rope part", sh.heads, sh.width);
        }
        let rope = sh.width - sh.kvl;
        if sh.q_rows != sh.heads * (sh.nope + rope) || sh.v_b_cols != sh.kvl {
            bail!("layer {l}: query rows {} are not {} heads of {} no-rope and {rope} rope values, or attn_v_b does not read the {}-value latent", sh.q_rows, sh.heads, sh.nope, sh.kvl);
        }
        if !(sh.head_q * 4).is_multiple_of(16) || !(sh.kvl * 4).is_multiple_of(16) {
            bail!("layer {l}: heads of {} values and latents of {} are not 16-byte aligned for the cuda matvecs", sh.head_q, sh.kvl);
        }
        Ok(m)
    }

    fn q_rows(&self) -> usize {
        match &self.q {
            QueryPath::Direct(q) => q.rows,
            QueryPath::LowRank { b, .. } => b.rows,
        }
    }

    fn q_lora(&self) -> usize {
        match &self.q {
            QueryPath::Direct(_) => 0,
            QueryPath::LowRank { a, .. } => a.rows,
        }
    }

    fn shape(&self) -> Shape {
        let heads = self.k_b.count;
        let kvl = self.k_b.weight.rows;
        let q_rows = self.q_rows();
        Shape {
            heads,
            kvl,
            nope: self.k_b.weight.cols,
            width: self.kv_a.rows,
            head_q: q_rows / heads.max(1),
            q_rows,
            v: self.v_b.weight.rows,
            v_b_cols: self.v_b.weight.cols,
        }
    }

    /// Values of the attention output (this rank's heads of `v_head_dim`).
    pub fn att_len(&self) -> usize {
        let sh = self.shape();
        sh.heads * sh.v
    }
}

/// The sizes of one MLA layer on this rank.
struct Shape {
    heads: usize,
    kvl: usize,
    nope: usize,
    width: usize,
    head_q: usize,
    q_rows: usize,
    v: usize,
    v_b_cols: usize,
}

/// The rope of the MLA rope parts, as kernels/mla.cu takes it.
#[derive(Clone, Copy)]
struct Rope {
    /// Whether the parts are rotated (kimi-linear's are copied as they are).
    rotate: bool,
    theta: f32,
    neox: i32,
    yarn: Option<Yarn>,
}

/// A rank's MLA buffers (sized for its widest MLA layer) and one latent cache per MLA layer.
pub(super) struct MlaState {
    /// The buffers of prefill steps over token rows (`rows.rs`), on a rank that takes them.
    rows: Option<rows::MlaRows>,
    xn: DeviceBuffer<f32>,
    q_a: DeviceBuffer<f32>,
    q_an: DeviceBuffer<f32>,
    q: DeviceBuffer<f32>,
    kv_a: DeviceBuffer<f32>,
    /// The token's cache row: the normalized latent, then the roped key.
    row: DeviceBuffer<f32>,
    q_lat: DeviceBuffer<f32>,
    lat: DeviceBuffer<f32>,
    /// Scratch of latent attention's chunk partials (`mla_parts_len`).
    parts: DeviceBuffer<f32>,
    /// The ids of the heads this rank holds, in order: the slots of the absorbed products.
    head_ids: DeviceBuffer<i32>,
    /// By the rank's layer index; `None` for GQA layers.
    caches: Vec<Option<DeviceBuffer<u16>>>,
    capacity: usize,
    kq_scale: f32,
    eps: f32,
    rope: Rope,
}

impl MlaState {
    /// The state of a rank whose layers are `layers` (`Some` for MLA layers), if any is MLA,
    /// for steps of up to `max_rows` token rows.
    pub fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        plan: &Plan,
        geo: &RankGeometry,
        layers: &[Option<&MlaWeights>],
        max_rows: usize,
    ) -> Result<Option<MlaState>> {
        let shapes: Vec<Shape> = layers.iter().flatten().map(|m| m.shape()).collect();
        if shapes.is_empty() {
            return Ok(None);
        }
        let most = |f: fn(&Shape) -> usize| shapes.iter().map(f).max().unwrap_or(1).max(1);
        let lora = layers
            .iter()
            .flatten()
            .map(|m| m.q_lora())
            .max()
            .unwrap_or(0);
        let held: Vec<(usize, usize)> = layers
            .iter()
            .flatten()
            .map(|m| (m.k_b.first, m.k_b.count))
            .collect();
        if held.windows(2).any(|w| w[0] != w[1]) {
            bail!("the rank holds different heads in different MLA layers: {held:?}");
        }
        let (first, count) = held[0];
        let head_ids: Vec<i32> = (first..first + count)
            .map(|h| i32::try_from(h).expect("invariant: head ids fit in i32"))
            .collect();
        let capacity = plan.runtime.max_context as usize;
        let sequences = plan.runtime.max_sequences.max(1) as usize;
        let d = plan.model.embedding as usize;
        let mut caches = Vec::new();
        for m in layers {
            caches.push(match m {
                // a cache of `capacity` rows per sequence slot, slot after slot
                Some(m) => Some(dev.alloc(s, m.shape().width * capacity * sequences)?),
                None => None,
            });
        }
        let rows = match max_rows {
            0 | 1 => None,
            n => Some(rows::MlaRows::new(
                dev,
                s,
                &shapes,
                // a plan of several sequences, or a speculative one, takes batched steps
                (lora, &head_ids, sequences > 1 || plan.speculative.is_some()),
                (n, d, capacity),
            )?),
        };
        Ok(Some(MlaState {
            rows,
            xn: dev.alloc(s, d)?,
            q_a: dev.alloc(s, lora.max(1))?,
            q_an: dev.alloc(s, lora.max(1))?,
            q: dev.alloc(s, most(|x| x.q_rows))?,
            kv_a: dev.alloc(s, most(|x| x.width))?,
            row: dev.alloc(s, most(|x| x.width))?,
            q_lat: dev.alloc(s, most(|x| x.heads * x.width))?,
            lat: dev.alloc(s, most(|x| x.heads * x.kvl))?,
            parts: dev.alloc(
                s,
                shapes
                    .iter()
                    .map(|x| mla_parts_len(x.heads, x.kvl, capacity))
                    .max()
                    .unwrap_or(1),
            )?,
            head_ids: dev.upload(s, &head_ids)?,
            caches,
            capacity,
            kq_scale: mla_kq_scale(plan.model.rope_yarn.as_ref(), plan.model.head_dim as usize),
            eps: geo.eps,
            rope: Rope {
                rotate: plan.model.mla.as_ref().is_some_and(|m| m.rope),
                theta: geo.theta,
                neox: i32::from(geo.rope == RopeStyle::Neox),
                yarn: geo.yarn,
            },
        }))
    }

    /// `mla_pre`: norm, query, latent and rope key, rope, and each head's absorbed query.
    pub fn pre(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        m: &MlaWeights,
        norm: Norm,
        x: &Span<f32>,
        pos: &Span<u32>,
    ) -> Result<()> {
        let sh = m.shape();
        let q = Span::of(&self.q).sub(0, sh.q_rows);
        let kv_a = Span::of(&self.kv_a).sub(0, sh.width);
        let row = Span::of(&self.row).sub(0, sh.width);
        let q_lat = Span::of(&self.q_lat).sub(0, sh.heads * sh.width);
        let (first, first_y) = match &m.q {
            QueryPath::Direct(w) => (w, q.clone()),
            QueryPath::LowRank { a, .. } => (a, Span::of(&self.q_a).sub(0, a.rows)),
        };
        if first.dtype == m.kv_a.dtype && full_chunks(first) == full_chunks(&m.kv_a) {
            let ys = [first_y.clone(), kv_a.clone()];
            dev.matvec_many(s, &[first, &m.kv_a], x, Some(norm), full_chunks(first), &ys)?;
        } else {
            let xn = Span::of(&self.xn).sub(0, x.len());
            dev.rms_norm(s, x, norm.weight, norm.eps, &mut xn.clone())?;
            dev.matvec(s, first, &xn, full_chunks(first), &mut first_y.clone())?;
            dev.matvec(s, &m.kv_a, &xn, full_chunks(&m.kv_a), &mut kv_a.clone())?;
        }
        if let QueryPath::LowRank { a, norm, b } = &m.q {
            let q_an = Span::of(&self.q_an).sub(0, a.rows);
            dev.rms_norm(s, &first_y, norm, self.eps, &mut q_an.clone())?;
            dev.matvec(s, b, &q_an, full_chunks(b), &mut q.clone())?;
        }
        let kvl = sh.kvl;
        dev.rms_norm(
            s,
            &kv_a.sub(0, kvl),
            &m.kv_a_norm,
            self.eps,
            &mut row.sub(0, kvl),
        )?;
        let n_rot = sh.width - kvl;
        let rot = |src: Span<f32>, src_stride, dst: Span<f32>, dst_stride, n| {
            self.rope_launch(
                dev,
                s,
                (&src, src_stride),
                (&dst, dst_stride),
                n,
                n_rot,
                (pos, n),
            )
        };
        // a nope layer (glm5-next's) has no rope part to rotate or copy
        if n_rot > 0 {
            rot(
                kv_a.sub(kvl, n_rot),
                sh.width,
                row.sub(kvl, n_rot),
                sh.width,
                1,
            )?;
            rot(
                q.sub(sh.nope, sh.q_rows - sh.nope),
                sh.head_q,
                q_lat.sub(kvl, sh.heads * sh.width - kvl),
                sh.width,
                sh.heads,
            )?;
        }
        let sel = self.heads(&m.k_b, sh.head_q, sh.width);
        let k_b = &m.k_b.weight;
        dev.matvec_experts(s, &[k_b], &q, None, full_chunks(k_b), &q_lat, None, sel)
    }

    /// The normed q-LoRA activations `pre` left (the DSA indexer's query input).
    pub fn q_lora_normed(&self, m: &MlaWeights) -> Result<Span<f32>> {
        match &m.q {
            QueryPath::LowRank { a, .. } => Ok(Span::of(&self.q_an).sub(0, a.rows)),
            QueryPath::Direct(_) => {
                bail!("the DSA indexer reads the q-LoRA activations; this layer has a direct query")
            }
        }
    }

    /// `mla_core`: the cache write and latent attention (over DSA's `cells` when given), then
    /// each head's value into `att`.
    #[allow(clippy::too_many_arguments)]
    pub fn core(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        m: &MlaWeights,
        layer: usize,
        pos: &Span<u32>,
        att: &Span<f32>,
        cells: Option<&Cells>,
    ) -> Result<()> {
        let sh = m.shape();
        let cache = self.caches[layer]
            .as_ref()
            .ok_or_else(|| anyhow!("mla_core on a layer without a latent cache"))?;
        let lat = Span::of(&self.lat).sub(0, sh.heads * sh.kvl);
        dev.mla_attention(
            s,
            &Span::of(&self.q_lat).sub(0, sh.heads * sh.width),
            Some(&Span::of(&self.row).sub(0, sh.width)),
            &Span::of(cache),
            &lat,
            &Span::of(&self.parts),
            (pos, None),
            (sh.heads, sh.kvl, sh.width, self.capacity),
            self.kq_scale,
            cells,
        )?;
        if att.len() != sh.heads * sh.v {
            bail!(
                "mla_core: {} output values for {} heads of {}",
                att.len(),
                sh.heads,
                sh.v
            );
        }
        let sel = self.heads(&m.v_b, sh.kvl, sh.v);
        let v_b = &m.v_b.weight;
        dev.matvec_experts(s, &[v_b], &lat, None, full_chunks(v_b), att, None, sel)
    }

    /// Every head of `stack` as the slots of one expert-mode matvec: head `h` reads
    /// `x[h * x_stride..]` and writes `y[h * y_stride..]`; each head's bits are those of a
    /// matvec with its matrix alone.
    fn heads(&self, stack: &DeviceStack, x_stride: usize, y_stride: usize) -> ExpertSel {
        ExpertSel {
            ids: Span::of(&self.head_ids).addr(),
            weights: 0,
            order: 0,
            slots: stack.count,
            first: stack.first,
            count: stack.count,
            stride: stack.stride,
            x_stride,
            y_stride,
            token_rows: 1,
            x_row_stride: 0,
        }
    }

    /// [`CudaDevice::mla_rope`] with the layer's rotation (none: a copy).
    #[allow(clippy::too_many_arguments)]
    fn rope_launch(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        src: (&Span<f32>, usize),
        dst: (&Span<f32>, usize),
        n_vecs: usize,
        n_rot: usize,
        pos: (&Span<u32>, usize),
    ) -> Result<()> {
        let r = self.rope;
        let theta_scale = r.theta.powf(-2.0 / n_rot as f32);
        let rotation = r.rotate.then_some((theta_scale, r.neox, r.yarn));
        dev.mla_rope(s, src, dst, n_vecs, n_rot, pos, rotation)
    }
}

fn int(n: usize) -> i32 {
    i32::try_from(n).expect("invariant: kernel sizes fit in i32")
}

impl CudaDevice {
    /// Rotates the first `n_rot` values of each of `n_vecs` vectors of `src` (`stride` apart)
    /// into `dst`, vector `v` at position `pos[v / per_pos]`, as the CPU kernel `rope_part` with `rotation`'s
    /// `theta_scale` (`theta^(-2 / n_rot)`), neox flag and YaRN when given; without a
    /// rotation, copies them as they are.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mla_rope(
        &self,
        s: &CudaStream,
        src: (&Span<f32>, usize),
        dst: (&Span<f32>, usize),
        n_vecs: usize,
        n_rot: usize,
        (pos, per_pos): (&Span<u32>, usize),
        rotation: Option<(f32, i32, Option<Yarn>)>,
    ) -> Result<()> {
        assert!(
            n_rot.is_multiple_of(2)
                && n_vecs > 0
                && per_pos > 0
                && pos.len() >= n_vecs.div_ceil(per_pos)
                && src.0.len() >= (n_vecs - 1) * src.1 + n_rot
                && dst.0.len() >= (n_vecs - 1) * dst.1 + n_rot,
            "mla_rope: {n_vecs} vectors of {n_rot} rotated values"
        );
        let (sp, dp, pp) = (src.0.addr(), dst.0.addr(), pos.addr());
        let (ss, ds, nv, nr, pg) = (
            int(src.1),
            int(dst.1),
            int(n_vecs),
            int(n_rot),
            int(per_pos),
        );
        let rotate = i32::from(rotation.is_some());
        let (theta_scale, neox, yarn) = rotation.unwrap_or((1.0, 0, None));
        let y = yarn.unwrap_or(Yarn {
            freq_scale: 1.0,
            corr_dims: [0.0, 0.0],
            mscale: 1.0,
        });
        let on = i32::from(yarn.is_some());
        let (fs, lo, hi, ms) = (y.freq_scale, y.corr_dims[0], y.corr_dims[1], y.mscale);
        let cfg = LaunchConfig {
            grid_dim: ((n_vecs * n_rot / 2).div_ceil(128) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(s, "mla_rope_f32", cfg, |a| {
            a.arg(&sp)
                .arg(&ss)
                .arg(&dp)
                .arg(&ds)
                .arg(&nv)
                .arg(&nr)
                .arg(&pp)
                .arg(&pg);
            a.arg(&theta_scale)
                .arg(&rotate)
                .arg(&neox)
                .arg(&on)
                .arg(&fs);
            a.arg(&lo);
            a.arg(&hi).arg(&ms);
        })
    }

    /// Latent attention (the CPU kernel `latent_attention` over positions `0..=pos[0]`, or
    /// `latent_attention_at` over DSA's `cells`: a count, then the positions) of the `heads`
    /// queries in `q_lat` (rows of `width`) into `out` (`heads x kvl`): each head's chunks of
    /// `MLA_CHUNK` rows across blocks, then merged in chunk order (kernels/mla.cu). With `row`,
    /// that row (narrowed to f16) is written to the cache at `pos[0]` first; without, `q_lat`
    /// and `out` may hold several token rows (a prefill step's, row `r` at position `pos[r]`),
    /// over the cache rows `mla_store_rows` wrote. With `slots` (a batched decode step), row
    /// `r` attends over sequence slot `slots[r]`'s cache, `capacity` rows from
    /// `slots[r] * capacity` on. `parts` holds `mla_parts_len` values a row.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mla_attention(
        &self,
        s: &CudaStream,
        q_lat: &Span<f32>,
        row: Option<&Span<f32>>,
        cache: &Span<u16>,
        out: &Span<f32>,
        parts: &Span<f32>,
        (pos, slots): (&Span<u32>, Option<&Span<u32>>),
        (heads, kvl, width, capacity): (usize, usize, usize, usize),
        scale: f32,
        cells: Option<&Cells>,
    ) -> Result<()> {
        let rows = q_lat.len() / (heads * width).max(1);
        assert!(
            width <= MAX_LATENT_WIDTH
                && kvl <= width
                && width.is_multiple_of(4)
                && kvl.is_multiple_of(4)
                && rows > 0
                && q_lat.len() == rows * heads * width
                && out.len() == rows * heads * kvl
                && pos.len() >= rows
                && row.is_none_or(|r| r.len() == width && rows == 1 && slots.is_none())
                && slots.is_none_or(|x| x.len() >= rows)
                && cache.len() >= width * capacity
                && parts.len() >= rows * mla_parts_len(heads, kvl, capacity)
                && cells.is_none_or(|c| c.span.len() >= rows * c.stride && c.stride > 0),
            "mla_attention: {rows} rows of {heads} heads, rows of {width}, latents of {kvl}, {capacity} positions"
        );
        let (qp, rp, cp, op, pap, pp, sp) = (
            q_lat.addr(),
            row.map_or(0, Span::addr),
            cache.addr(),
            out.addr(),
            parts.addr(),
            pos.addr(),
            slots.map_or(0, Span::addr),
        );
        let (h, k, w, c) = (int(heads), int(kvl), int(width), int(capacity));
        let (cp_cells, cells_stride) = cells.map_or((0, 0), |c| (c.span.addr(), int(c.stride)));
        let chunks = capacity.div_ceil(MLA_CHUNK);
        let cfg = |x: usize, y: usize, z: usize, smem: usize| LaunchConfig {
            grid_dim: (x as u32, y as u32, z as u32),
            block_dim: (MLA_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let grid = cfg(
            heads.div_ceil(MLA_TILE_HEADS),
            chunks,
            rows,
            mla_smem_bytes(width),
        );
        self.launch(s, "mla_attention_f16", grid, |a| {
            a.arg(&qp).arg(&rp).arg(&cp).arg(&pap).arg(&pp).arg(&sp);
            a.arg(&h).arg(&k).arg(&w).arg(&c).arg(&scale).arg(&cp_cells);
            a.arg(&cells_stride);
        })?;
        let nc = int(chunks);
        self.launch(s, "mla_merge_f16", cfg(heads, rows, 1, 0), |a| {
            a.arg(&pap).arg(&op).arg(&pp).arg(&h).arg(&k).arg(&c);
            a.arg(&cp_cells).arg(&cells_stride).arg(&nc);
        })
    }

    /// Writes the f32 cache rows (each `width` values: the normalized latent, then the roped
    /// key) narrowed to f16 at positions `pos[0] + r` of `cache`, or with `slots` (a batched
    /// decode step) row `r` at `pos[r]` of sequence slot `slots[r]`'s cache (`capacity` rows
    /// a slot; a pad row's not at all); none past `capacity`.
    pub(super) fn mla_store_rows(
        &self,
        s: &CudaStream,
        rows: &Span<f32>,
        cache: &Span<u16>,
        (pos, slots): (&Span<u32>, Option<&Span<u32>>),
        (width, capacity): (usize, usize),
    ) -> Result<()> {
        let n_rows = rows.len() / width.max(1);
        assert!(
            width > 0
                && rows.len().is_multiple_of(width)
                && cache.len() >= width * capacity
                && slots.is_none_or(|x| x.len() >= n_rows && pos.len() >= n_rows),
            "mla_store_rows: rows of {width} values into a cache of {capacity}"
        );
        let (rp, cp, pp, sp) = (
            rows.addr(),
            cache.addr(),
            pos.addr(),
            slots.map_or(0, Span::addr),
        );
        let (w, n, c) = (int(width), int(rows.len()), int(capacity));
        self.launch(s, "mla_store_rows_f16", grid(rows.len(), 256), |a| {
            a.arg(&rp)
                .arg(&cp)
                .arg(&pp)
                .arg(&sp)
                .arg(&w)
                .arg(&n)
                .arg(&c);
        })
    }

    /// `out[h][r][i] = x[r * row_stride + h * head_stride + i]`, `i < len`: each head's
    /// slices of the `rows` rows together in f32 ([`Self::mla_heads_f16`]'s layout), the
    /// slots of a batched step's per-head products (`out` holds `heads * rows * len`).
    pub(super) fn mla_heads_gather(
        &self,
        s: &CudaStream,
        x: &Span<f32>,
        at: (usize, usize, usize),
        rows_heads: (usize, usize),
        out: &Span<f32>,
    ) -> Result<()> {
        let to = (out.addr(), out.len());
        self.heads_major(s, "mla_heads_gather_f32", x, at, rows_heads, to)
    }

    /// `out[h][r][i]` = f16 of `x[r * row_stride + h * head_stride + i]`, `i < len`: each
    /// head's slices of the `rows` rows together (`out` holds `heads * rows * len`).
    pub(super) fn mla_heads_f16(
        &self,
        s: &CudaStream,
        x: &Span<f32>,
        at: (usize, usize, usize),
        rows_heads: (usize, usize),
        out: &Span<u16>,
    ) -> Result<()> {
        let to = (out.addr(), out.len());
        self.heads_major(s, "mla_heads_f16", x, at, rows_heads, to)
    }

    /// `kernel` (`mla_heads_f16` or `mla_heads_gather_f32`): each head's slices of the rows
    /// of `x` into the head-major `out` (its address and values).
    fn heads_major(
        &self,
        s: &CudaStream,
        kernel: &str,
        x: &Span<f32>,
        (row_stride, head_stride, len): (usize, usize, usize),
        (rows, heads): (usize, usize),
        (op, out_len): (u64, usize),
    ) -> Result<()> {
        let n = heads * rows * len;
        // the kernels index the values with 32-bit ints
        assert!(
            n > 0
                && n <= i32::MAX as usize
                && out_len >= n
                && x.len() >= (rows - 1) * row_stride + (heads - 1) * head_stride + len,
            "{kernel}: {rows} rows of {heads} heads of {len} values"
        );
        let xp = x.addr();
        let (rs, hs, l, r, h) = (
            int(row_stride),
            int(head_stride),
            int(len),
            int(rows),
            int(heads),
        );
        self.launch(s, kernel, grid(n, 256), |a| {
            a.arg(&xp)
                .arg(&rs)
                .arg(&hs)
                .arg(&l)
                .arg(&r)
                .arg(&h)
                .arg(&op);
        })
    }

    /// `out[r * row_stride + h * head_stride + i] = y[h][r][i]`: [`Self::mla_heads_f16`]'s
    /// layout back, in f32.
    pub(super) fn mla_heads_f32(
        &self,
        s: &CudaStream,
        y: &Span<f32>,
        (rows, heads): (usize, usize),
        out: &Span<f32>,
        (row_stride, head_stride, len): (usize, usize, usize),
    ) -> Result<()> {
        let n = heads * rows * len;
        assert!(
            n > 0
                && n <= i32::MAX as usize
                && y.len() >= n
                && out.len() >= (rows - 1) * row_stride + (heads - 1) * head_stride + len,
            "mla_heads_f32: {rows} rows of {heads} heads of {len} values"
        );
        let (yp, op) = (y.addr(), out.addr());
        let (rs, hs, l, r, h) = (
            int(row_stride),
            int(head_stride),
            int(len),
            int(rows),
            int(heads),
        );
        self.launch(s, "mla_heads_f32", grid(n, 256), |a| {
            a.arg(&yp)
                .arg(&l)
                .arg(&r)
                .arg(&h)
                .arg(&op)
                .arg(&rs)
                .arg(&hs);
        })
    }
}

/// Query heads an attention block takes at most: the rows of a tensor-core tile
/// (MLA_TILE_HEADS in kernels/mla.cu).
const MLA_TILE_HEADS: usize = 16;

/// Dynamic shared memory of mla_attention_f16 for rows of `width` (kernels/mla.cu's
/// `mla_smem`): the q fragments (16 bytes per lane, two k steps per 32 values), the current
/// row in f16, the tile's weights in f16 (rows padded by 8), and each warp's max and sum per
/// head. At most about 40 KiB (rows of `MAX_LATENT_WIDTH`), under the launch's plain limit.
fn mla_smem_bytes(width: usize) -> usize {
    let warps = MLA_THREADS as usize / 32;
    width.div_ceil(32) * 2 * 32 * 16
        + width.next_multiple_of(8) * 2
        + MLA_TILE_HEADS * (MLA_CHUNK + 8) * 2
        + 2 * warps * MLA_TILE_HEADS * 4
}
