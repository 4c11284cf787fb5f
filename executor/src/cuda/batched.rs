//! A batched decode step on a CUDA rank (every step of a plan of several sequence slots, and a
//! speculative verify step on any plan): the rows of every span of the step (a generated token
//! of each sequence, the prompt chunk of a joining one, or a verify span's token and drafts)
//! go through the decode kernels together, each row with the bits it has in a step of its own.
//! Products keep the one-row decode's reduction order, never the prefill GEMM's: for q4_0 and
//! q4_1 weights an integer mma on tensor cores over the rows quantized once
//! (kernels/matvec_mma.cu, which replays the one-row kernel's lanes and tree), for other
//! dtypes the decode matvec over tiles of rows (kernels/matvec.cu loads each weight piece once
//! per tile and keeps every row's lane partition and tree); norms are their own launches over
//! the rows (the bits of the norms the one-row decode folds into its matvecs). Attention writes
//! every row's k and v into its own sequence slot, then runs the decode attention kernel with
//! a grid row per token row, each at its own position over its own slot (leaving the o
//! product's 8-bit rows where that product takes the tensor cores); an MLA layer's rows each
//! attend over their own slot's latent cache (`mla::batched`), and a KDA layer's rows of each
//! sequence run in order on their slot's windows and state (`kda`). MoE layers route every row
//! on the device and run each pick as a one-row expert matvec of its own grid row, grouped by
//! expert (`moe::rows`); shared experts are a product over the rows. The head takes the rows
//! whose logits come back.
//! A step of generated tokens only is padded to its bucket of rows and replayed from graphs
//! (`buckets`: pad rows first, in a slot the cache write and attention skip, every row a
//! logit row); a step with prompt rows (a joining sequence's chunk) runs eagerly, its
//! launches depending on its row count and logit rows.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice};
use memra_compiler::plan::{Plan, Segment};

use super::device::CudaDevice;
use super::matvec::{Epilogue, Norm};
use super::matvec_mma::{has_mma, MMA_MIN_ROWS};
use super::moe::FfnWeights;
use super::rank::{copy, MixerWeights, Pending, RankDevice, Rows};
use super::span::Span;
use super::weights::{full_chunks, DeviceWeight};

/// Most sequence slots a plan may have on the cuda backend (each row of a step is a grid row
/// of the attention launch, and the host stages every row's position and slot).
pub const MAX_SEQUENCES: u32 = 256;

/// Refuses a plan of several sequence slots the batched decode cannot run, saying why.
pub fn check_batched(plan: &Plan) -> Result<()> {
    let sequences = plan.runtime.max_sequences;
    if sequences > MAX_SEQUENCES {
        bail!(
            "runtime.max_sequences is {sequences}; the cuda backend decodes up to {MAX_SEQUENCES} sequences together"
        );
    }
    Ok(())
}

impl RankDevice {
    /// One segment of `layer` over the `rows` token rows of a batched step.
    pub(super) fn batch_segment(
        &mut self,
        layer: u32,
        seg: Segment,
        step: Rows,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let rows = step.rows;
        let li = self.geo.layer_index(layer, self.layers.len())?;
        let lw = &self.layers[li];
        let gqa = || match &lw.mixer {
            MixerWeights::Gqa(g) => Ok(g),
            _ => Err(anyhow!(
                "segment `{}` on layer {layer}, not a GQA layer",
                seg.name()
            )),
        };
        let b = &self.buf;
        let dev = &self.dev;
        let d = self.hidden_len();
        let (x, xn) = (Self::rows_of(&b.x, rows, d), Self::rows_of(&b.xn, rows, d));
        let eps = self.geo.eps;
        let xq = self.quantized_rows();
        let p = RowProducts {
            dev,
            s,
            xq: xq.as_ref(),
        };
        let product = |ws: &[&DeviceWeight], x: Input, chunks, ys: &[(u64, usize)], epilogue| {
            p.product(ws, x, chunks, ys, epilogue)
        };
        // the GQA attention's output is quantized for the o product in the attention's launch
        // where that product takes the tensor cores
        let att_quantized =
            matches!(lw.mixer, MixerWeights::Gqa(_)) && on_tensor_cores(xq.as_ref(), rows, &lw.o);
        let att = Self::rows_of(&b.att, rows, lw.o.cols);
        let at = RowsAt {
            pos: &self.pos(rows),
            slots: &self.slots(rows),
        };
        let out = |y: &Span<f32>| (y.addr(), y.len());
        let hc = self.hc.as_ref();
        // the row-parallel product: added to x in the same launch on a lone rank (with mHC:
        // spread over the streams), left in `partial` for the group's all-reduce otherwise
        let row_parallel = |w: &DeviceWeight, input: Input, chunks: Option<usize>, reduced| {
            let chunks = chunks.unwrap_or_else(|| full_chunks(w)).max(1);
            match (reduced, hc) {
                (true, _) => {
                    let partial = Self::rows_of(&b.partial, rows, d);
                    product(&[w], input, chunks, &[out(&partial)], Epilogue::Plain)
                }
                (false, None) => {
                    let into_x = Epilogue::Residual(x.addr());
                    product(&[w], input, chunks, &[out(&x)], into_x)
                }
                (false, Some(hc)) => {
                    let f = hc.output(s, rows * d, false)?;
                    product(&[w], input, chunks, &[out(&f)], Epilogue::Plain)?;
                    hc.post(dev, s, &f)
                }
            }
        };
        // a lone rank's MoE rows: combined into x, or with mHC into the sublayer's output
        let combine = |state: &super::moe::MoeState| -> Result<()> {
            match hc {
                None => state.combine(dev, s, &x, false),
                Some(hc) => {
                    let f = hc.output(s, rows * d, true)?;
                    state.combine(dev, s, &f, false)?;
                    hc.post(dev, s, &f)
                }
            }
        };
        match seg {
            Segment::MlaPre | Segment::MlaCore => {
                let (MixerWeights::Mla(m), Some(state)) = (&lw.mixer, &self.mla) else {
                    bail!(
                        "segment `{}` on layer {layer}, not an MLA layer",
                        seg.name()
                    );
                };
                if seg == Segment::MlaPre {
                    let norm = Norm {
                        weight: &lw.attn_norm,
                        eps,
                    };
                    state.pre_batched(p, m, li, norm, (&x, &xn), at)
                } else {
                    let cells = self.attended_cells(layer, m, rows)?;
                    state.core_batched(dev, s, m, li, at, &att, cells.as_ref())
                }
            }
            Segment::DsaSelect => {
                let (m, ix, mla, dsa) = self.dsa_parts(layer, li)?;
                let norm = Norm {
                    weight: &lw.attn_norm,
                    eps,
                };
                let q_a = mla.q_lora_normed_rows(m, rows)?;
                dsa.select_batched(p, (ix, li), norm, (&x, &xn), &q_a, at)
            }
            Segment::HcAttnPre | Segment::HcFfnPre => {
                let (Some(w), Some(hc)) = (&lw.hc, hc) else {
                    bail!(
                        "segment `{}` on layer {layer} without mHC in the plan's model",
                        seg.name()
                    );
                };
                hc.pre(dev, s, &w[usize::from(seg == Segment::HcFfnPre)], &x, rows)
            }
            Segment::KdaPre | Segment::KdaCore => {
                let (MixerWeights::Kda(k), Some(state)) = (&lw.mixer, &self.kda) else {
                    bail!("segment `{}` on layer {layer}, not a KDA layer", seg.name());
                };
                if seg == Segment::KdaPre {
                    let norm = Norm {
                        weight: &lw.attn_norm,
                        eps,
                    };
                    state.pre_batched(p, k, li, norm, (&x, &xn), at)
                } else {
                    state.core_batched(dev, s, k, li, at, &att)
                }
            }
            Segment::AttnPre => {
                let g = gqa()?;
                let q = Self::rows_of(&b.q, rows, g.q.rows);
                let (k, v) = (
                    Self::rows_of(&b.k, rows, g.k.rows),
                    Self::rows_of(&b.v, rows, g.v.rows),
                );
                let norm = Norm {
                    weight: &lw.attn_norm,
                    eps,
                };
                p.normed(&[&g.q, &g.k, &g.v], (&x, &xn), norm, &[&q, &k, &v])?;
                g.finish_qkv(dev, s, [&q, &k, &v], eps)
            }
            Segment::AttnCore => {
                let g = gqa()?;
                let q = Self::rows_of(&b.q, rows, g.q.rows);
                let (k, v) = (
                    Self::rows_of(&b.k, rows, g.k.rows),
                    Self::rows_of(&b.v, rows, g.v.rows),
                );
                let (pos, slots) = (at.pos, at.slots);
                let rope = (self.geo.theta, self.geo.rope);
                let parts = Span::of(&b.attn_parts);
                let kv = self.kv[li]
                    .as_mut()
                    .expect("invariant: a GQA layer has its cache");
                if !step.decode {
                    // a prompt chunk's rows read the rows before them from the cache (in a
                    // decode step each row's attention writes the one entry it reads that
                    // the step makes)
                    self.dev
                        .kv_store_rows(s, &k, &v, kv, pos, Some(slots), rope)?;
                }
                self.dev.attention(
                    s,
                    &mut q.clone(),
                    &k,
                    &v,
                    kv,
                    pos,
                    Some(slots),
                    rope,
                    &parts,
                    &mut att.clone(),
                    xq.as_ref().filter(|_| att_quantized),
                    None,
                )
            }
            Segment::AttnOut => {
                self.pending = Pending::Hidden;
                let chunks = self.geo.row_chunks.map(|c| c.0);
                let input = if att_quantized {
                    Input::Quantized(&att)
                } else {
                    Input::Rows(&att, None)
                };
                row_parallel(&lw.o, input, chunks, self.geo.attn_reduced)
            }
            Segment::Ffn => {
                let FfnWeights::Dense(ffn) = &lw.ffn else {
                    bail!("ffn on layer {layer}, an MoE layer");
                };
                let (gw, uw) = (&ffn.gate, &ffn.up);
                if gw.dtype != uw.dtype || gw.cols != uw.cols || gw.rows != uw.rows {
                    bail!("gate and up weights of layer {layer} differ in dtype or shape ({} {}x{}, {} {}x{}); the cuda backend fuses them", gw.dtype, gw.rows, gw.cols, uw.dtype, uw.rows, uw.cols);
                }
                let gate = Self::rows_of(&b.gate, rows, gw.rows);
                let norm = Norm {
                    weight: &lw.ffn_norm,
                    eps,
                };
                let swiglu = Epilogue::SwiGlu { limit: ffn.clamp };
                let ys = [out(&gate), out(&gate)];
                let input = Input::Rows(&x, Some((norm, &xn)));
                product(&[gw, uw], input, full_chunks(gw), &ys, swiglu)?;
                self.pending = Pending::Hidden;
                let chunks = self.geo.row_chunks.map(|c| c.1);
                let input = Input::Rows(&gate, None);
                row_parallel(&ffn.down, input, chunks, self.geo.tp_degree > 1)
            }
            Segment::MoeRouter | Segment::MoeExperts | Segment::MoeShared => {
                let (FfnWeights::Moe(e), Some(state)) = (&lw.ffn, &self.moe) else {
                    bail!("segment `{}` on layer {layer}, a dense layer", seg.name());
                };
                let wide = state.wide.as_ref().ok_or_else(|| {
                    anyhow!("a batched step on a rank allocated for one token row")
                })?;
                let lone = self.geo.tp_degree == 1;
                // the FFN norm is folded into each product that reads it, as in a decode step
                let norm = Norm {
                    weight: &lw.ffn_norm,
                    eps,
                };
                match seg {
                    Segment::MoeRouter => {
                        wide.route(dev, s, e, &state.router, &x, Some(norm), rows)
                    }
                    Segment::MoeExperts => {
                        self.pending = Pending::Experts;
                        let picks = wide.picks(dev, s, rows)?;
                        state.experts(dev, s, e, norm, &x, &picks, rows)?;
                        if lone && e.shared.is_none() {
                            combine(state)?;
                        }
                        Ok(())
                    }
                    _ => {
                        let (Some(g), Pending::Experts) = (&e.shared, self.pending) else {
                            bail!("moe_shared without shared experts after moe_experts");
                        };
                        // the shared experts' row of every token row after the routed ones
                        // (slot `top_k`), as the one-row decode's `MoeState::shared`
                        let gate = Self::rows_of(&b.gate, rows, g.gate.rows);
                        let swiglu = Epilogue::SwiGlu { limit: g.clamp };
                        let input = Input::Rows(&x, Some((norm, &xn)));
                        let ys = [out(&gate), out(&gate)];
                        product(&[&g.gate, &g.up], input, full_chunks(&g.gate), &ys, swiglu)?;
                        let k = state.router.top_k as usize;
                        let shared = Span::of(&state.rows).sub(k * rows * d, rows * d);
                        let chunks = self
                            .geo
                            .row_chunks
                            .map_or_else(|| full_chunks(&g.down), |c| c.1)
                            .max(1);
                        let input = Input::Rows(&gate, None);
                        product(&[&g.down], input, chunks, &[out(&shared)], Epilogue::Plain)?;
                        if lone {
                            combine(state)?;
                        }
                        Ok(())
                    }
                }
            }
            other => bail!(
                "segment `{}` has no batched decode kernels on the cuda backend",
                other.name()
            ),
        }
    }

    /// The final norm and this rank's vocab rows of the head for the step's `logit_rows`,
    /// into the first rows of `logits`: the rows' hidden states (with mHC, the mean of each
    /// of the `rows` rows' streams first) are gathered into the first rows of `xn` (one copy
    /// per run of consecutive rows), normalized there and multiplied.
    pub(super) fn batch_head(&self, rows: usize, s: &Arc<CudaStream>) -> Result<()> {
        let (norm, w) = self.head_weights()?;
        let d = self.hidden_len();
        if let Some(hc) = &self.hc {
            hc.mean(&self.dev, s, &Self::rows_of(&self.buf.x, rows, d), rows)?;
        }
        let picked = &self.logit_rows;
        let out = picked.len();
        let (x, xn) = (Span::of(&self.buf.x), Self::rows_of(&self.buf.xn, out, d));
        let mut i = 0;
        while i < out {
            let mut n = 1;
            while i + n < out && picked[i + n] == picked[i] + n {
                n += 1;
            }
            copy(
                s,
                &x.sub(picked[i] * d, n * d).cast(),
                &xn.sub(i * d, n * d).cast(),
            )?;
            i += n;
        }
        let logits = Self::rows_of(&self.buf.logits, out, w.rows);
        let ys = [(logits.addr(), logits.len())];
        let xq = self.quantized_rows();
        let norm = Norm {
            weight: norm,
            eps: self.geo.eps,
        };
        // normalized in place
        batch_product(
            &self.dev,
            xq.as_ref(),
            s,
            &[w],
            Input::Rows(&xn, Some((norm, &xn))),
            full_chunks(w),
            &ys,
            Epilogue::Plain,
        )
    }
}

/// Where a batched step's rows sit: each row's position and sequence slot (`PAD_SLOT` for a
/// pad row).
#[derive(Clone, Copy)]
pub(super) struct RowsAt<'a> {
    pub pos: &'a Span<u32>,
    pub slots: &'a Span<u32>,
}

/// The products of a batched step's rows on a rank: its device, the stream they go on, and
/// its 8-bit copy of the rows (for the products on tensor cores).
#[derive(Clone, Copy)]
pub(super) struct RowProducts<'a> {
    pub dev: &'a CudaDevice,
    pub s: &'a Arc<CudaStream>,
    pub xq: Option<&'a Span<u8>>,
}

impl RowProducts<'_> {
    /// `ys[i] = ws[i] (rms_norm(x) * norm)` over the rows, as the one-row decode runs them:
    /// one launch where the weights share dtype and chunk count (the norm in it; `xn` may be
    /// x, normalized in place), else the norm into `xn` first and a launch each.
    pub fn normed(
        &self,
        ws: &[&DeviceWeight],
        (x, xn): (&Span<f32>, &Span<f32>),
        norm: Norm,
        ys: &[&Span<f32>],
    ) -> Result<()> {
        let chunks = full_chunks(ws[0]);
        let out: Vec<(u64, usize)> = ys.iter().map(|y| (y.addr(), y.len())).collect();
        if ws
            .iter()
            .all(|w| w.dtype == ws[0].dtype && full_chunks(w) == chunks)
        {
            let input = Input::Rows(x, Some((norm, xn)));
            return self.product(ws, input, chunks, &out, Epilogue::Plain);
        }
        self.dev
            .rms_norm(self.s, x, norm.weight, norm.eps, &mut xn.clone())?;
        for (w, y) in ws.iter().zip(out) {
            let chunks = full_chunks(w);
            self.product(&[w], Input::Rows(xn, None), chunks, &[y], Epilogue::Plain)?;
        }
        Ok(())
    }

    /// `y = w x` over the rows.
    pub fn plain(&self, w: &DeviceWeight, x: &Span<f32>, y: &Span<f32>) -> Result<()> {
        let out = [(y.addr(), y.len())];
        self.product(
            &[w],
            Input::Rows(x, None),
            full_chunks(w),
            &out,
            Epilogue::Plain,
        )
    }

    /// [`batch_product`] on this rank.
    pub fn product(
        &self,
        ws: &[&DeviceWeight],
        x: Input,
        chunks: usize,
        ys: &[(u64, usize)],
        epilogue: Epilogue,
    ) -> Result<()> {
        batch_product(self.dev, self.xq, self.s, ws, x, chunks, ys, epilogue)
    }
}

/// A product's activation rows x: as f32 rows, `rms_norm`ed first with the norm into its span
/// (which may be x) where one is given; or x whose 8-bit copy the launch that wrote x also
/// left in the rank's `xq` (where `on_tensor_cores` holds for the product).
#[derive(Clone, Copy)]
pub(super) enum Input<'a> {
    Rows(&'a Span<f32>, Option<(Norm<'a>, &'a Span<f32>)>),
    Quantized(&'a Span<f32>),
}

/// Whether a product of `w` over `rows` activation rows runs on tensor cores, from the 8-bit
/// copy of its rows in `xq` (the rank's row buffers).
fn on_tensor_cores(xq: Option<&Span<u8>>, rows: usize, w: &DeviceWeight) -> bool {
    xq.is_some() && rows >= MMA_MIN_ROWS && has_mma(w.dtype, w.cols)
}

/// `ys[i] = ws[i] x` (`epilogue` applied) over the rows of x, weights of one dtype and K: on
/// tensor cores (`on_tensor_cores`), x quantized once into `xq` unless it is already there,
/// else the matvec tiles; every row has the one-row decode's bits either way.
#[allow(clippy::too_many_arguments)]
pub(super) fn batch_product(
    dev: &CudaDevice,
    xq: Option<&Span<u8>>,
    s: &Arc<CudaStream>,
    ws: &[&DeviceWeight],
    x: Input,
    chunks: usize,
    ys: &[(u64, usize)],
    epilogue: Epilogue,
) -> Result<()> {
    let cols = ws[0].cols;
    let (Input::Rows(rows_of, _) | Input::Quantized(rows_of)) = x;
    let rows = rows_of.len() / cols;
    match (xq, x) {
        (Some(xq), x) if on_tensor_cores(Some(xq), rows, ws[0]) => {
            match x {
                // normalized in place: the quantizing launch's blocks each read the whole row
                // for its scale while the others write their slices, so the norm goes first
                // (the same bits: the quantizer's norm is rms_norm_f32's)
                Input::Rows(x, Some((norm, xn))) if xn.addr() == x.addr() => {
                    dev.rms_norm(s, x, norm.weight, norm.eps, &mut xn.clone())?;
                    dev.quantize_rows(s, x, cols, xq, None)?;
                }
                Input::Rows(x, norm) => dev.quantize_rows(s, x, cols, xq, norm)?,
                Input::Quantized(_) => {}
            }
            dev.matvec_mma(s, ws, xq, rows, chunks, ys, epilogue, None)
        }
        (_, Input::Quantized(_)) => {
            bail!("invariant: a batched product's rows were quantized for tensor cores it does not take")
        }
        (_, Input::Rows(x, norm)) => {
            let x = match norm {
                Some((norm, xn)) => {
                    dev.rms_norm(s, x, norm.weight, norm.eps, &mut xn.clone())?;
                    xn
                }
                None => x,
            };
            dev.matvec_job(s, ws, x, None, chunks, ys, epilogue, None)
        }
    }
}
