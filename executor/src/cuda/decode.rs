//! One layer segment of a decode step on a CUDA rank: a token row through the op family its
//! layer kind names (GQA attention, MLA, KDA, the dense FFN or the MoE segments), fused where
//! that keeps every bit (norms folded into the matvecs that read them, the residual add and
//! the SiLU gate into matvec epilogues, rope and the cache write into attention, which moves
//! rope from the attention-input segment to the attention-core one). q/k/v of mixed dtypes
//! fall back to a norm launch and one matvec each; gate and up must share dtype and shape (an
//! error names them otherwise). A prefill step's rows take `prefill.rs` instead.

use std::sync::Arc;

use anyhow::{bail, Result};
use cudarc::driver::CudaStream;
use memra_compiler::plan::{reduction_chunks, Segment};

use super::matvec::Norm;
use super::moe::FfnWeights;
use super::rank::{MixerWeights, Pending, RankDevice};
use super::span::Span;
use super::weights::DeviceWeight;

impl RankDevice {
    /// Enqueues segment `seg` of `layer` for the step's one token row on `s`.
    pub(super) fn segment(&mut self, layer: u32, seg: Segment, s: &Arc<CudaStream>) -> Result<()> {
        let li = self.geo.layer_index(layer, self.layers.len())?;
        let lw = &self.layers[li];
        let b = &self.buf;
        let dev = &self.dev;
        let d = self.hidden_len();
        let (x, xn) = (Self::rows_of(&b.x, 1, d), Self::rows_of(&b.xn, 1, d));
        let gqa = match &lw.mixer {
            MixerWeights::Gqa(g) => Some(g),
            _ => None,
        };
        let (q, k, v) = gqa.map_or_else(
            || {
                let n = self.max_rows;
                (
                    Self::rows_of(&b.q, 1, b.q.len() / n),
                    Self::rows_of(&b.k, 1, b.k.len() / n),
                    Self::rows_of(&b.v, 1, b.v.len() / n),
                )
            },
            |g| {
                (
                    Span::of(&b.q).sub(0, g.q.rows),
                    Span::of(&b.k).sub(0, g.k.rows),
                    Span::of(&b.v).sub(0, g.v.rows),
                )
            },
        );
        let chunks_of = |w: &DeviceWeight| {
            reduction_chunks(w.cols as u64, w.dtype.block_size() as u64) as usize
        };
        // the row-parallel product: added to x in the same launch on a lone rank (with mHC:
        // spread over the streams), left in `partial` for the group's all-reduce otherwise
        let hc = self.hc.as_ref();
        let row = |w: &DeviceWeight,
                   input: &Span<f32>,
                   chunks: Option<usize>,
                   reduced: bool|
         -> Result<()> {
            let chunks = chunks.unwrap_or_else(|| chunks_of(w)).max(1);
            match (reduced, hc) {
                (true, _) => dev.matvec(s, w, input, chunks, &mut Self::rows_of(&b.partial, 1, d)),
                (false, None) => dev.matvec_residual(s, w, input, chunks, &x, &mut x.clone()),
                (false, Some(hc)) => {
                    let f = hc.output(s, d, false)?;
                    dev.matvec(s, w, input, chunks, &mut f.clone())?;
                    hc.post(dev, s, &f)
                }
            }
        };
        // a lone rank's MoE rows: combined into x, or with mHC into the sublayer's output
        let combine = |state: &super::moe::MoeState| -> Result<()> {
            match hc {
                None => state.combine(dev, s, &x, false),
                Some(hc) => {
                    let f = hc.output(s, d, true)?;
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
                let pos = Span::of(&b.pos);
                if seg == Segment::MlaPre {
                    let norm = Norm {
                        weight: &lw.attn_norm,
                        eps: self.geo.eps,
                    };
                    state.pre(dev, s, m, norm, &x, &pos)
                } else {
                    let att = Span::of(&b.att).sub(0, lw.o.cols);
                    let cells = self.attended_cells(layer, m, 1)?;
                    state.core(dev, s, m, li, &pos, &att, cells.as_ref())
                }
            }
            Segment::HcAttnPre | Segment::HcFfnPre => {
                let (Some(w), Some(hc)) = (&lw.hc, hc) else {
                    bail!(
                        "segment `{}` on layer {layer} without mHC in the plan's model",
                        seg.name()
                    );
                };
                hc.pre(dev, s, &w[usize::from(seg == Segment::HcFfnPre)], &x, 1)
            }
            Segment::DsaSelect => {
                let (m, ix, mla, dsa) = self.dsa_parts(layer, li)?;
                let norm = Norm {
                    weight: &lw.attn_norm,
                    eps: self.geo.eps,
                };
                let q_a = mla.q_lora_normed(m)?;
                dsa.select(dev, s, ix, norm, &x, &q_a, li, &Span::of(&b.pos))
            }
            Segment::KdaPre | Segment::KdaCore => {
                let (MixerWeights::Kda(k), Some(state)) = (&lw.mixer, &self.kda) else {
                    bail!("segment `{}` on layer {layer}, not a KDA layer", seg.name());
                };
                if seg == Segment::KdaPre {
                    let norm = Norm {
                        weight: &lw.attn_norm,
                        eps: self.geo.eps,
                    };
                    state.pre(dev, s, k, li, norm, &x, &Span::of(&b.pos))
                } else {
                    let att = Span::of(&b.att).sub(0, lw.o.cols);
                    state.core(dev, s, k, li, &att, &Span::of(&b.pos))
                }
            }
            Segment::AttnPre => {
                let Some(lw) = gqa else {
                    bail!("attn_pre on layer {layer}, not a GQA layer");
                };
                let norm_w = &self.layers[li].attn_norm;
                let (ws, ys) = ([&lw.q, &lw.k, &lw.v], [q.clone(), k.clone(), v.clone()]);
                if ws
                    .iter()
                    .all(|w| w.dtype == lw.q.dtype && chunks_of(w) == chunks_of(&lw.q))
                {
                    let norm = Norm {
                        weight: norm_w,
                        eps: self.geo.eps,
                    };
                    dev.matvec_many(s, &ws, &x, Some(norm), chunks_of(&lw.q), &ys)?;
                } else {
                    dev.rms_norm(s, &x, norm_w, self.geo.eps, &mut xn.clone())?;
                    for (w, y) in ws.iter().zip(ys) {
                        dev.matvec(s, w, &xn, chunks_of(w), &mut y.clone())?;
                    }
                }
                lw.finish_qkv(dev, s, [&q, &k, &v], self.geo.eps)
            }
            Segment::AttnCore => {
                // rope here rather than in AttnPre: it is fused with the cache write and the
                // attention that reads it, and q and k are read by nothing else
                let att = Span::of(&b.att).sub(0, lw.o.cols);
                self.attend(li, [&q, &k, &v, &att], s)
            }
            Segment::AttnOut => {
                let att = Span::of(&b.att).sub(0, lw.o.cols);
                self.pending = Pending::Hidden;
                row(
                    &lw.o,
                    &att,
                    self.geo.row_chunks.map(|c| c.0),
                    self.geo.attn_reduced,
                )
            }
            Segment::Ffn => {
                let FfnWeights::Dense(ffn) = &lw.ffn else {
                    bail!("ffn on layer {layer}, an MoE layer");
                };
                let g = Span::of(&b.gate).sub(0, ffn.gate.rows);
                let (gw, uw) = (&ffn.gate, &ffn.up);
                if gw.dtype == uw.dtype && gw.cols == uw.cols && gw.rows == uw.rows {
                    let norm = Norm {
                        weight: &lw.ffn_norm,
                        eps: self.geo.eps,
                    };
                    dev.matvec_swiglu(
                        s,
                        gw,
                        uw,
                        &x,
                        Some(norm),
                        chunks_of(gw),
                        ffn.clamp,
                        &mut g.clone(),
                    )?;
                } else {
                    bail!("gate and up weights of layer {layer} differ in dtype or shape ({} {}x{}, {} {}x{}); the cuda backend fuses them", gw.dtype, gw.rows, gw.cols, uw.dtype, uw.rows, uw.cols);
                }
                self.pending = Pending::Hidden;
                row(
                    &ffn.down,
                    &g,
                    self.geo.row_chunks.map(|c| c.1),
                    self.geo.tp_degree > 1,
                )
            }
            Segment::MoeRouter | Segment::MoeExperts | Segment::MoeShared => {
                let (FfnWeights::Moe(e), Some(state)) = (&lw.ffn, &self.moe) else {
                    bail!("segment `{}` on layer {layer}, a dense layer", seg.name());
                };
                let lone = self.geo.tp_degree == 1;
                // the FFN norm is folded into each product that reads it
                let norm = Norm {
                    weight: &lw.ffn_norm,
                    eps: self.geo.eps,
                };
                match seg {
                    Segment::MoeRouter => state.route(dev, s, e, norm, &x),
                    Segment::MoeExperts => {
                        self.pending = Pending::Experts;
                        state.experts(dev, s, e, norm, &x, &state.picks(), 1)?;
                        if lone && e.shared.is_none() {
                            combine(state)?;
                        }
                        Ok(())
                    }
                    _ => {
                        let (Some(g), Pending::Experts) = (&e.shared, self.pending) else {
                            bail!("moe_shared without shared experts after moe_experts");
                        };
                        state.shared(dev, s, g, norm, &x, self.geo.row_chunks.map(|c| c.1))?;
                        if lone {
                            combine(state)?;
                        }
                        Ok(())
                    }
                }
            }
            other => bail!(
                "segment `{}` is not supported by the cuda backend",
                other.name()
            ),
        }
    }
}
