//! A prefill step on a CUDA rank: the decode program's segments over every token row of a
//! prompt chunk. Products are tensor-core GEMMs over f16 activation rows (`rows.rs`); a
//! row-parallel product (attention output, FFN down) is computed per canonical reduction chunk
//! and combined in the canonical tree, so a tensor-parallel rank's chunks are a subtree and the
//! group's all-reduce completes the sum one rank computes: every plan's prefill gives the same
//! bits. A weight whose chunks are not whole 64-value GEMM steps takes the decode matvec over
//! the rows instead (the same choice on every rank, since the chunk length does not depend on the
//! split). Attention writes every row's k and v to the cache first, then runs the decode
//! attention kernel with a grid row per token row, each over its own causal prefix: those rows
//! have the bits of the decode steps at their positions. The FFN is dense or a mixture of
//! experts (`moe_rows`: rows grouped by expert, the shared experts as a dense FFN, the decode
//! combine's slot blocks). MLA layers run their mixer over the rows at once (`mla::rows`: GEMMs,
//! then latent attention with a grid row per token row); MLA layers whose widths are not whole
//! GEMM steps run it row by row with the decode kernels, each row at its own position. KDA
//! layers run their projections over the rows at once and the convolution and delta rule token
//! by token inside one launch each (not yet the chunkwise-parallel form). DSA layers run the
//! indexer's products over the rows, then every row's cache write, the pools the rows
//! complete, and each row's scores and selection with a grid row per token row (`dsa.rs`),
//! and the MLA core over each row's cells. mHC runs each sublayer's mixing over the rows
//! (`mhc.rs`), and a finished sublayer's rows go to the streams instead of the residual. DSA
//! layers whose widths are not whole GEMM steps run prompts token by token (`prefill_rows`
//! says why).

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice};
use memra_compiler::plan::{reduction_chunks, FfnKind, Plan, Segment};

use super::device::{CudaDevice, DeviceBuffer};
use super::matvec::Norm;
use super::mla;
use super::moe::unfit;
use super::moe::{FfnWeights, MoeState};
use super::rank::{MixerWeights, Pending, RankDevice, Rows};
use super::rows::GEMM_DEPTH;
use super::span::Span;
use super::weights::{full_chunks, DeviceWeight};

/// The token rows a step of `plan` may have on CUDA: the plan's prefill chunk, or why prompts
/// run token by token.
pub fn prefill_rows(plan: &Plan) -> Result<u32, &'static str> {
    let m = &plan.model;
    if (0..m.layers).any(|l| m.layer_kind(l).mixer.is_sparse()) {
        let fits = m.mla.as_ref().is_some_and(|a| {
            let w = |v: u32| v as usize;
            let (d, lora) = (w(m.embedding), w(a.q_lora_rank));
            mla::fits(d, lora, w(a.qk_nope_head_dim), w(a.kv_lora_rank))
        });
        if !fits {
            return Err("the cuda prefill takes DSA layers whose hidden size, q-LoRA rank, no-rope head and latent are whole 64-value GEMM steps; this model's DSA prompts run token by token");
        }
    }
    let moe = (0..m.layers).any(|l| matches!(m.layer_kind(l).ffn, FfnKind::Moe { .. }));
    if let Some(why) = m
        .moe
        .as_ref()
        .filter(|_| moe)
        .and_then(|e| unfit(e, u64::from(m.embedding)))
    {
        return Err(why);
    }
    Ok(plan.runtime.prefill_chunk.max(1))
}

/// A rank's buffers for prefill steps only.
pub(super) struct RowBuffers {
    /// f16 activation rows, as wide as the widest product input.
    a16: DeviceBuffer<u16>,
    /// The up projection of the FFN rows.
    up: DeviceBuffer<f32>,
    /// Chunk partials of a row-parallel product: up to `MAX_ROW_CHUNKS` of rows x hidden.
    parts: DeviceBuffer<f32>,
    /// The position of each row (the step's position plus the row).
    positions: DeviceBuffer<u32>,
}

/// Most canonical reduction chunks (`reduction_chunks`).
const MAX_ROW_CHUNKS: usize = 8;

impl RowBuffers {
    pub fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        rows: usize,
        widest: usize,
        gate_rows: usize,
        d: usize,
    ) -> Result<RowBuffers> {
        Ok(RowBuffers {
            a16: dev.alloc(s, rows * widest)?,
            up: dev.alloc(s, rows * gate_rows)?,
            parts: dev.alloc(s, MAX_ROW_CHUNKS * rows * d)?,
            positions: dev.alloc(s, rows)?,
        })
    }
}

impl RankDevice {
    /// For each `(w, out)`: `out` (rows x `w.rows`) = the `rows` rows of `input` (rows x
    /// `w.cols`, the same for every weight) times `w`, combined over `chunks` reduction chunks
    /// in the canonical tree. The input is narrowed to f16 once for all of them, unless the
    /// kernel that wrote it left it narrowed in [`Self::narrowed_rows`] (`narrowed`).
    #[allow(clippy::too_many_arguments)]
    fn products(
        &self,
        s: &Arc<CudaStream>,
        input: &Span<f32>,
        mut narrowed: bool,
        rows: usize,
        chunks: usize,
        products: &[(&DeviceWeight, &Span<f32>)],
    ) -> Result<()> {
        let dev = &self.dev;
        let rb = self.row_buffers()?;
        if input.len() > rb.a16.len() {
            bail!(
                "a prefill product over {} input values; the rank's f16 rows hold {}",
                input.len(),
                rb.a16.len()
            );
        }
        let mut a16 = Span::of(&rb.a16).sub(0, input.len());
        // whole products (one chunk) go out together, sharing launches
        let mut whole = Vec::new();
        for &(w, out) in products {
            if !(w.cols / chunks).is_multiple_of(GEMM_DEPTH) {
                // the decode matvec over every row in one launch (each row its decode bits):
                // its chunk tree is the canonical one too
                let x = input.sub(0, rows * w.cols);
                dev.matvec(s, w, &x, chunks, &mut out.sub(0, rows * w.rows))?;
                continue;
            }
            if !narrowed {
                dev.to_f16(s, input, &mut a16)?;
                narrowed = true;
            }
            if chunks == 1 {
                whole.push((w.into(), out));
            } else {
                let parts = Span::of(&rb.parts).sub(0, chunks * rows * w.rows);
                dev.gemm_tree(s, w.into(), &a16, rows, chunks, &parts, out, None)?;
            }
        }
        dev.gemm_many(s, &whole, &a16, rows)
    }

    /// The f16 rows the products read, `len` values: a kernel that writes a product's input
    /// may leave it narrowed there too (`rms_norm_narrowing`, `swiglu_rows`), saving the
    /// products' own narrowing pass.
    fn narrowed_rows(&self, len: usize) -> Result<Span<u16>> {
        Ok(Span::of(&self.row_buffers()?.a16).sub(0, len))
    }

    /// The f16 rows buffer as bytes, where a batched decode step (which runs no GEMM) keeps
    /// its activation rows quantized for the tensor-core products (`matvec_mma`); `None` on a
    /// rank allocated for one token row.
    pub(super) fn quantized_rows(&self) -> Option<Span<u8>> {
        let rb = self.buf.rows.as_ref()?;
        Some(Span::of(&rb.a16).cast())
    }

    fn row_buffers(&self) -> Result<&RowBuffers> {
        self.buf
            .rows
            .as_ref()
            .ok_or_else(|| anyhow!("a prefill step on a rank allocated for one token row"))
    }

    /// The row-parallel product into x: added at once on a lone rank (with mHC: spread over
    /// the streams), left in `partial` for the group's all-reduce otherwise; `narrowed` as
    /// for [`Self::products`].
    #[allow(clippy::too_many_arguments)]
    fn row_parallel(
        &self,
        s: &Arc<CudaStream>,
        w: &DeviceWeight,
        input: &Span<f32>,
        narrowed: bool,
        rows: usize,
        chunks: Option<usize>,
        reduced: bool,
    ) -> Result<()> {
        let d = self.hidden_len();
        let chunks = chunks
            .unwrap_or_else(|| {
                reduction_chunks(w.cols as u64, w.dtype.block_size() as u64) as usize
            })
            .max(1);
        let x = Self::rows_of(&self.buf.x, rows, d);
        let partial = Self::rows_of(&self.buf.partial, rows, d);
        match (&self.hc, reduced) {
            (Some(hc), false) => {
                let f = hc.output(s, rows * d, false)?;
                self.products(s, input, narrowed, rows, chunks, &[(w, &f)])?;
                hc.post(&self.dev, s, &f)
            }
            (None, false) => {
                self.products(s, input, narrowed, rows, chunks, &[(w, &partial)])?;
                self.dev.add(s, &x, &partial, &mut x.clone())
            }
            (_, true) => self.products(s, input, narrowed, rows, chunks, &[(w, &partial)]),
        }
    }

    /// A lone rank's MoE rows of a step of `rows` token rows, combined into x, or with mHC
    /// into the sublayer's output and spread over the streams.
    fn combine_rows(&self, state: &MoeState, rows: usize, s: &Arc<CudaStream>) -> Result<()> {
        let d = self.hidden_len();
        match &self.hc {
            None => state.combine(&self.dev, s, &Self::rows_of(&self.buf.x, rows, d), false),
            Some(hc) => {
                let f = hc.output(s, rows * d, true)?;
                state.combine(&self.dev, s, &f, false)?;
                hc.post(&self.dev, s, &f)
            }
        }
    }

    /// One segment of `layer` over `rows` token rows.
    pub(super) fn prefill_segment(
        &mut self,
        layer: u32,
        seg: Segment,
        rows: usize,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let li = self.geo.layer_index(layer, self.layers.len())?;
        match seg {
            Segment::MoeRouter | Segment::MoeExperts | Segment::MoeShared => {
                return self.prefill_moe(layer, li, seg, rows, s);
            }
            Segment::MlaPre | Segment::MlaCore => {
                if let (MixerWeights::Mla(m), Some(state)) = (&self.layers[li].mixer, &self.mla) {
                    if state.takes_rows(m, self.hidden_len()) {
                        return self.prefill_mla((layer, li), seg, rows, s);
                    }
                }
                return self.prefill_mla_by_row(layer, li, seg, rows, s);
            }
            Segment::KdaPre | Segment::KdaCore => return self.prefill_kda(li, seg, rows, s),
            Segment::DsaSelect => return self.prefill_dsa(layer, li, rows, s),
            Segment::HcAttnPre | Segment::HcFfnPre => {
                let (Some(w), Some(hc)) = (&self.layers[li].hc, &self.hc) else {
                    bail!(
                        "segment `{}` on layer {layer} without mHC in the plan's model",
                        seg.name()
                    );
                };
                let x = Self::rows_of(&self.buf.x, rows, self.hidden_len());
                return hc.pre(
                    &self.dev,
                    s,
                    &w[usize::from(seg == Segment::HcFfnPre)],
                    &x,
                    rows,
                );
            }
            _ => {}
        }
        let lw = &self.layers[li];
        let b = &self.buf;
        let dev = &self.dev;
        let d = self.hidden_len();
        let (x, xn) = (Self::rows_of(&b.x, rows, d), Self::rows_of(&b.xn, rows, d));
        let gqa = || {
            let MixerWeights::Gqa(g) = &lw.mixer else {
                bail!("segment `{}` on layer {layer}, not a GQA layer", seg.name());
            };
            let q = Self::rows_of(&b.q, rows, g.q.rows);
            let (k, v) = (
                Self::rows_of(&b.k, rows, g.k.rows),
                Self::rows_of(&b.v, rows, g.v.rows),
            );
            Ok((g, q, k, v))
        };
        let eps = self.geo.eps;
        match seg {
            Segment::AttnPre => {
                let (g, q, k, v) = gqa()?;
                let a16 = self.narrowed_rows(xn.len())?;
                dev.rms_norm_narrowing(s, &x, &lw.attn_norm, eps, &mut xn.clone(), Some(&a16))?;
                self.products(s, &xn, true, rows, 1, &[(&g.q, &q), (&g.k, &k), (&g.v, &v)])?;
                g.finish_qkv(dev, s, [&q, &k, &v], eps)
            }
            Segment::AttnCore => {
                let (_, q, k, v) = gqa()?;
                let att = Self::rows_of(&b.att, rows, lw.o.cols);
                self.attend(li, [&q, &k, &v, &att], s)
            }
            Segment::AttnOut => {
                let att = Self::rows_of(&b.att, rows, lw.o.cols);
                self.pending = Pending::Hidden;
                let (chunks, reduced) = (self.geo.row_chunks.map(|c| c.0), self.geo.attn_reduced);
                self.row_parallel(s, &lw.o, &att, false, rows, chunks, reduced)
            }
            Segment::Ffn => {
                let FfnWeights::Dense(ffn) = &lw.ffn else {
                    bail!("ffn on layer {layer}, an MoE layer");
                };
                let f = ffn.gate.rows;
                let gate = Self::rows_of(&b.gate, rows, f);
                let up = Span::of(&self.row_buffers()?.up).sub(0, rows * f);
                let a16 = self.narrowed_rows(xn.len())?;
                dev.rms_norm_narrowing(s, &x, &lw.ffn_norm, eps, &mut xn.clone(), Some(&a16))?;
                self.products(s, &xn, true, rows, 1, &[(&ffn.gate, &gate), (&ffn.up, &up)])?;
                let a16 = self.narrowed_rows(gate.len())?;
                dev.swiglu_rows(s, &gate, &up, ffn.clamp, &mut gate.clone(), Some(&a16))?;
                self.pending = Pending::Hidden;
                let chunks = self.geo.row_chunks.map(|c| c.1);
                let tp = self.geo.tp_degree > 1;
                self.row_parallel(s, &ffn.down, &gate, true, rows, chunks, tp)
            }
            other => bail!(
                "segment `{}` has no prefill kernels on the cuda backend",
                other.name()
            ),
        }
    }

    /// An MLA segment of layer `layer` (index `li`) over `rows` token rows at once (`mla::rows`).
    fn prefill_mla(
        &self,
        (layer, li): (u32, usize),
        seg: Segment,
        rows: usize,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let lw = &self.layers[li];
        let (MixerWeights::Mla(m), Some(state)) = (&lw.mixer, &self.mla) else {
            bail!("an MLA segment on a layer without MLA weights or state");
        };
        let (dev, b, d) = (&self.dev, &self.buf, self.hidden_len());
        let positions = Span::of(&self.row_buffers()?.positions).sub(0, rows);
        if seg == Segment::MlaPre {
            dev.row_positions(s, &Span::of(&b.pos), &mut positions.clone())?;
            let (x, xn) = (Self::rows_of(&b.x, rows, d), Self::rows_of(&b.xn, rows, d));
            let norm = Norm {
                weight: &lw.attn_norm,
                eps: self.geo.eps,
            };
            state.pre_rows(dev, s, m, li, norm, (&x, &xn), &positions, rows)
        } else {
            let att = Self::rows_of(&b.att, rows, lw.o.cols);
            let cells = self.attended_cells(layer, m, rows)?;
            state.core_rows(dev, s, m, li, &positions, &att, cells.as_ref())
        }
    }

    /// Normalizes `rows` token rows of `x` by the attention norm of layer index `li` into
    /// `xn` and its f16 copy, which the products read (an earlier segment's products may have
    /// left their own input there); returns `xn`.
    fn attn_normed_rows(&self, li: usize, rows: usize, s: &Arc<CudaStream>) -> Result<Span<f32>> {
        let (b, d) = (&self.buf, self.hidden_len());
        let (x, xn) = (Self::rows_of(&b.x, rows, d), Self::rows_of(&b.xn, rows, d));
        let a16 = self.narrowed_rows(xn.len())?;
        let norm = &self.layers[li].attn_norm;
        let eps = self.geo.eps;
        self.dev
            .rms_norm_narrowing(s, &x, norm, eps, &mut xn.clone(), Some(&a16))?;
        Ok(xn)
    }

    /// `dsa_select` of layer `layer` (index `li`) over `rows` token rows: the indexer's key,
    /// gate and head weights from the normed rows and its queries from the rows' normed q-LoRA
    /// activations (products over the rows), then every row's selection (`DsaState::select_rows`)
    /// at the positions `mla_pre` wrote.
    fn prefill_dsa(&self, layer: u32, li: usize, rows: usize, s: &Arc<CudaStream>) -> Result<()> {
        let (m, ix, mla, dsa) = self.dsa_parts(layer, li)?;
        let xn = self.attn_normed_rows(li, rows, s)?;
        let r = dsa.rows(rows)?;
        let from_x = [(&ix.k, &r.key), (&ix.gate, &r.gate), (&ix.proj, &r.w)];
        self.products(s, &xn, true, rows, 1, &from_x)?;
        let q_a = mla.q_lora_normed_rows(m, rows)?;
        self.products(s, &q_a, false, rows, 1, &[(&ix.q_b, &r.q)])?;
        let positions = Span::of(&self.row_buffers()?.positions).sub(0, rows);
        dsa.select_rows(&self.dev, s, ix, li, (&positions, None))
    }

    /// A KDA segment of the layer of index `li` over `rows` token rows: the projections as
    /// products over the rows, the convolutions and the delta rule token by token inside one
    /// launch each (kernels/kda.cu), each token with its decode step's arithmetic over the
    /// products' rows (which, f16 GEMMs, differ from decode's in the last bits).
    fn prefill_kda(&self, li: usize, seg: Segment, rows: usize, s: &Arc<CudaStream>) -> Result<()> {
        let lw = &self.layers[li];
        let (MixerWeights::Kda(k), Some(state)) = (&lw.mixer, &self.kda) else {
            bail!("a KDA segment on a layer without KDA weights or state");
        };
        let (dev, b) = (&self.dev, &self.buf);
        let sp = state.row_spans(k, rows)?;
        if seg == Segment::KdaCore {
            let att = Self::rows_of(&b.att, rows, lw.o.cols);
            return state.core_rows(dev, s, k, li, &sp, &att, (&Span::of(&b.pos), None));
        }
        let xn = self.attn_normed_rows(li, rows, s)?;
        let from_x = [
            (&k.q, &sp.q),
            (&k.k, &sp.k),
            (&k.v, &sp.v),
            (&k.f_a, &sp.f_low),
            (&k.beta, &sp.beta),
            (&k.g_a, &sp.g_low),
        ];
        self.products(s, &xn, true, rows, 1, &from_x)?;
        self.products(s, &sp.f_low, false, rows, 1, &[(&k.f_b, &sp.f)])?;
        self.products(s, &sp.g_low, false, rows, 1, &[(&k.g_b, &sp.gate)])?;
        state.conv_rows(dev, s, k, li, &sp, (&Span::of(&b.pos), None))
    }

    /// An MLA segment of layer `layer` (index `li`) over `rows` token rows: the decode
    /// kernels row by row, row `r` at position `pos[0] + r`, so each row has its decode step's
    /// bits (the cache rows or the recurrent state the earlier rows leave are written first by
    /// their own steps). A row's core reads the single-row buffers its pre just wrote, so the
    /// core segment runs both for every row and the pre segment enqueues nothing.
    fn prefill_mla_by_row(
        &mut self,
        layer: u32,
        li: usize,
        seg: Segment,
        rows: usize,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let lw = &self.layers[li];
        match (&lw.mixer, seg) {
            (MixerWeights::Mla(m), _) if m.sparse => bail!(
                "layer {layer}: a DSA layer whose widths are not whole GEMM steps takes prompts token by token"
            ),
            (MixerWeights::Mla(_), Segment::MlaPre) => return Ok(()),
            (MixerWeights::Mla(_), Segment::MlaCore) => {}
            _ => bail!(
                "segment `{}` on layer {layer}, a layer of another mixer",
                seg.name()
            ),
        }
        let (dev, b, d, at) = (&self.dev, &self.buf, self.hidden_len(), lw.o.cols);
        let positions = Span::of(&self.row_buffers()?.positions).sub(0, rows);
        dev.row_positions(s, &Span::of(&b.pos), &mut positions.clone())?;
        let norm = Norm {
            weight: &lw.attn_norm,
            eps: self.geo.eps,
        };
        for r in 0..rows {
            let (x, att) = (
                Span::of(&b.x).sub(r * d, d),
                Span::of(&b.att).sub(r * at, at),
            );
            let (MixerWeights::Mla(m), Some(state)) = (&lw.mixer, &self.mla) else {
                bail!("layer {layer}: this rank holds no state of its mixer");
            };
            let pos = positions.sub(r, 1);
            state.pre(dev, s, m, norm, &x, &pos)?;
            state.core(dev, s, m, li, &pos, &att, None)?;
        }
        Ok(())
    }

    /// An MoE segment of layer `layer` (index `li`) over `rows` token rows: the router and the
    /// routed experts by `MoeRows`, the shared experts as a dense FFN over every row into the
    /// last slot block, and the combine on a lone rank once the layer's blocks are complete.
    fn prefill_moe(
        &mut self,
        layer: u32,
        li: usize,
        seg: Segment,
        rows: usize,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let lw = &self.layers[li];
        let (FfnWeights::Moe(e), Some(state)) = (&lw.ffn, &self.moe) else {
            bail!("segment `{}` on layer {layer}, a dense layer", seg.name());
        };
        let moe_rows = state
            .wide
            .as_ref()
            .ok_or_else(|| anyhow!("a prefill step on a rank allocated for one token row"))?;
        let (dev, b, d) = (&self.dev, &self.buf, self.hidden_len());
        let (x, xn) = (Self::rows_of(&b.x, rows, d), Self::rows_of(&b.xn, rows, d));
        let lone = self.geo.tp_degree == 1;
        match seg {
            Segment::MoeRouter => {
                dev.rms_norm(s, &x, &lw.ffn_norm, self.geo.eps, &mut xn.clone())?;
                moe_rows.route(dev, s, e, &state.router, &xn, None, rows)
            }
            Segment::MoeExperts => {
                self.pending = Pending::Experts;
                moe_rows.experts(dev, s, e, &xn, rows, &Span::of(&state.rows))?;
                if lone && e.shared.is_none() {
                    self.combine_rows(state, rows, s)?;
                }
                Ok(())
            }
            _ => {
                let (Some(g), Pending::Experts) = (&e.shared, self.pending) else {
                    bail!("moe_shared without shared experts after moe_experts");
                };
                let f = g.gate.rows;
                let gate = Self::rows_of(&b.gate, rows, f);
                let up = Span::of(&self.row_buffers()?.up).sub(0, rows * f);
                self.products(s, &xn, false, rows, 1, &[(&g.gate, &gate), (&g.up, &up)])?;
                let a16 = self.narrowed_rows(gate.len())?;
                dev.swiglu_rows(s, &gate, &up, g.clamp, &mut gate.clone(), Some(&a16))?;
                let chunks = self
                    .geo
                    .row_chunks
                    .map_or_else(|| full_chunks(&g.down), |c| c.1);
                let k = state.router.top_k as usize;
                let out = Span::of(&state.rows).sub(k * rows * d, rows * d);
                self.products(s, &gate, true, rows, chunks.max(1), &[(&g.down, &out)])?;
                if lone {
                    self.combine_rows(state, rows, s)?;
                }
                Ok(())
            }
        }
    }

    /// The final norm and this rank's vocab rows of the head for the rows whose logits come
    /// back, into the first rows of `logits`. A step that asks for one row (a generation's
    /// last prompt row) takes the decode matvec and so its decode step's head bits; a GEMM
    /// over one row would dequantize the whole vocabulary for it. A step that asks for more
    /// (scored rows) takes the product over the rows, whatever their number, so a scored
    /// row's bits depend only on whether its step asked for it alone.
    pub(super) fn prefill_head(&self, rows: Rows, s: &Arc<CudaStream>) -> Result<()> {
        let (norm, w) = self.head_weights()?;
        let d = self.hidden_len();
        let out = rows.out();
        let x = Span::of(&self.buf.x).sub(rows.logits_from * d, out * d);
        let xn = Self::rows_of(&self.buf.xn, out, d);
        self.dev
            .rms_norm(s, &x, norm, self.geo.eps, &mut xn.clone())?;
        let logits = Self::rows_of(&self.buf.logits, out, w.rows);
        if out == 1 {
            return self
                .dev
                .matvec(s, w, &xn, full_chunks(w), &mut logits.clone());
        }
        self.products(s, &xn, false, out, 1, &[(w, &logits)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_chunks_fit_the_partials_buffer() {
        // the canonical reduction never has more chunks than the partials buffer holds
        for k in [32u64, 576, 4096, 14336, 1 << 20] {
            for block in [1u64, 32, 256] {
                assert!(reduction_chunks(k, block) as usize <= MAX_ROW_CHUNKS);
            }
        }
    }
}
