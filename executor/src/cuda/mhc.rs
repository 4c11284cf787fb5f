//! mHC (glm5-next's residual streams) on a CUDA rank: typed launches of kernels/mhc.cu, with
//! the math of the CPU backend's `cpu/kernels/mhc.rs` (`hc_mix` then `hc_collapse` in
//! `hc_pre`, `hc_expand` in `hc_post`, `hc_mean`, and the embedding copied into every stream),
//! each launch over every token row of the step, one grid row each; and the rank's `HcState`,
//! the CPU's `cpu/mhc.rs` on the device: the streams (what pipeline boundaries carry), the
//! `hc_attn_pre` and `hc_ffn_pre` segments (the 24 mixes are the product of the RMS-normed
//! streams, unit weight, by `hc_*_fn`: a normed matvec) and the finish of a sublayer, which
//! spreads its output over the streams instead of adding it to the residual. The mixing is
//! computed whole on every rank, so every plan gives the same streams.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::result as cu;
use cudarc::driver::{CudaStream, DeviceSlice, LaunchConfig};
use memra_compiler::plan::Plan;

use super::device::{CudaDevice, DeviceBuffer};
use super::matvec::Norm;
use super::span::Span;
use super::weights::{full_chunks, int, upload_matrix, DeviceWeight};
use crate::layer_weights::{HcWeights as HostHc, MIXES, STREAMS};
use crate::weights::RankWeights;

/// Values of one token's mixing weights on the device: pre, post, then the combination
/// `comb[dst + STREAMS * src]` (`HC_MIX_LEN` in kernels/mhc.cu, the CPU's `HcMix`).
pub const MIX_LEN: usize = 2 * STREAMS + STREAMS * STREAMS;

/// Threads of a block of the mHC launches.
const THREADS: usize = 256;

/// One sublayer's mHC weights on the device (`layer_weights::HcWeights`, checked there).
pub(super) struct HcWeights {
    mixes: DeviceWeight,
    scale: DeviceBuffer<f32>,
    base: DeviceBuffer<f32>,
}

impl HcWeights {
    /// Layer `l`'s mixer and FFN sublayers' mHC weights, taken out of `w` and uploaded.
    pub fn take(
        l: u32,
        w: &mut RankWeights,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
    ) -> Result<[HcWeights; 2]> {
        let mut one = |which: &str| -> Result<HcWeights> {
            let h = HostHc::take(l, which, w)?;
            Ok(HcWeights {
                mixes: upload_matrix(dev, s, h.mixes)?,
                scale: dev.upload(s, &h.scale)?,
                base: dev.upload(s, &h.base)?,
            })
        };
        Ok([one("attn")?, one("ffn")?])
    }
}

/// A rank's mHC state: the streams of every token row, the mixes and mixing weights of the
/// sublayer running, a finished sublayer's output, and the plan's settings.
pub(super) struct HcState {
    streams: DeviceBuffer<f32>,
    mixes: DeviceBuffer<f32>,
    mix: DeviceBuffer<f32>,
    out: DeviceBuffer<f32>,
    /// The RMS-normed streams of a step of several token rows (whose mixes are a matvec over
    /// the rows, without the one-row launch's fused norm); `None` for steps of one row.
    normed: Option<DeviceBuffer<f32>>,
    /// The unit weight of the streams' RMS norm.
    ones: DeviceBuffer<f32>,
    /// The streams' RMS norm epsilon (the model's).
    norm_eps: f32,
    eps: f32,
    iters: u32,
}

impl HcState {
    /// The state for steps of up to `rows` token rows of width `d`, if the plan's model has
    /// mHC streams; `norm_eps` is the model's RMS norm epsilon.
    pub fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        plan: &Plan,
        d: usize,
        rows: usize,
        norm_eps: f32,
    ) -> Result<Option<HcState>> {
        let Some(h) = &plan.model.mhc else {
            return Ok(None);
        };
        if h.streams as usize != STREAMS {
            bail!(
                "model.mhc.streams is {}; the cuda backend takes {STREAMS}",
                h.streams
            );
        }
        Ok(Some(HcState {
            streams: dev.alloc(s, rows * STREAMS * d)?,
            mixes: dev.alloc(s, rows * MIXES)?,
            mix: dev.alloc(s, rows * MIX_LEN)?,
            out: dev.alloc(s, rows * d)?,
            normed: match rows > 1 {
                true => Some(dev.alloc(s, rows * STREAMS * d)?),
                false => None,
            },
            ones: dev.upload(s, &vec![1f32; STREAMS * d])?,
            norm_eps,
            eps: h.eps as f32,
            iters: h.sinkhorn_iters,
        }))
    }

    /// The streams of the first `rows` token rows (the residual boundaries carry).
    pub fn streams(&self, rows: usize) -> Span<f32> {
        let per = self.ones.len();
        Span::of(&self.streams).sub(0, rows * per)
    }

    /// Every stream of the `rows` token rows of `x` starts as that row's embedding.
    pub fn embed(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        x: &Span<f32>,
        rows: usize,
    ) -> Result<()> {
        dev.hc_embed(s, x, &self.streams(rows), rows)
    }

    /// The head's input in `x`: each token row's mean of its streams.
    pub fn mean(&self, dev: &CudaDevice, s: &CudaStream, x: &Span<f32>, rows: usize) -> Result<()> {
        dev.hc_mean(s, &self.streams(rows), x, rows)
    }

    /// `hc_attn_pre` / `hc_ffn_pre` of `rows` token rows with sublayer weights `w`: the mixes,
    /// the mixing weights, and the sublayer's input in `x` (`rows` rows). Each row has the
    /// bits of its one-row step: the streams' norm is `rms_norm`'s, fused into the matvec for
    /// one row and a launch of its own for several.
    pub fn pre(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        w: &HcWeights,
        x: &Span<f32>,
        rows: usize,
    ) -> Result<()> {
        let streams = self.streams(rows);
        let mixes = Span::of(&self.mixes).sub(0, rows * MIXES);
        let chunks = full_chunks(&w.mixes);
        match (rows, &self.normed) {
            (1, _) => {
                let norm = Norm {
                    weight: &self.ones,
                    eps: self.norm_eps,
                };
                dev.matvec_many(
                    s,
                    &[&w.mixes],
                    &streams,
                    Some(norm),
                    chunks,
                    std::slice::from_ref(&mixes),
                )?;
            }
            (_, Some(normed)) => {
                let normed = Span::of(normed).sub(0, streams.len());
                dev.rms_norm(s, &streams, &self.ones, self.norm_eps, &mut normed.clone())?;
                dev.matvec(s, &w.mixes, &normed, chunks, &mut mixes.clone())?;
            }
            (_, None) => bail!("an mHC step of {rows} token rows on a rank allocated for one"),
        }
        let a = HcAffine {
            scale: Span::of(&w.scale),
            base: Span::of(&w.base),
            eps: self.eps,
            iters: self.iters,
        };
        dev.hc_pre(
            s,
            &mixes,
            &a,
            &streams,
            &Span::of(&self.mix).sub(0, rows * MIX_LEN),
            x,
        )
    }

    /// Where a finished sublayer's output of `len` values (its token rows) goes before
    /// `post`: zeroed when `zeroed` (an all-reduce or the experts' combine adds into it).
    pub fn output(&self, s: &CudaStream, len: usize, zeroed: bool) -> Result<Span<f32>> {
        let out = Span::of(&self.out).sub(0, len);
        if zeroed {
            s.context().bind_to_thread()?;
            // SAFETY: `out` is a live buffer of this rank of `len` f32 values
            unsafe { cu::memset_d8_async(out.addr(), 0, len * 4, s.cu_stream()) }
                .map_err(|e| anyhow!("cuda backend: zeroing the mHC output: {e:?}"))?;
        }
        Ok(out)
    }

    /// Spreads the finished sublayer output `f` (whole token rows) over the streams.
    pub fn post(&self, dev: &CudaDevice, s: &CudaStream, f: &Span<f32>) -> Result<()> {
        let rows = f.len() / (self.ones.len() / STREAMS);
        dev.hc_post(
            s,
            f,
            &Span::of(&self.mix).sub(0, rows * MIX_LEN),
            &self.streams(rows),
        )
    }
}

/// A sublayer's learned map from mixes to mixing weights (the CPU's `HcAffine`) and the
/// plan's Sinkhorn settings (`model.mhc`).
pub(super) struct HcAffine {
    /// Pre, post and combination scales (3 values).
    pub scale: Span<f32>,
    /// One base per mix.
    pub base: Span<f32>,
    pub eps: f32,
    pub iters: u32,
}

/// One block row per token row, blocks across the embedding width `d`.
fn rows_grid(rows: usize, d: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (d.div_ceil(THREADS).max(1) as u32, rows as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaDevice {
    /// For each token row: the mixing weights from its `MIXES` mixes into `mix` (`MIX_LEN`
    /// values, `hc_mix`) and the sublayer's input, the pre-weighted sum of its `STREAMS`
    /// streams, into `x` (`hc_collapse`).
    pub(super) fn hc_pre(
        &self,
        s: &CudaStream,
        mixes: &Span<f32>,
        a: &HcAffine,
        streams: &Span<f32>,
        mix: &Span<f32>,
        x: &Span<f32>,
    ) -> Result<()> {
        let rows = mixes.len() / MIXES;
        let d = x.len() / rows.max(1);
        assert!(
            rows > 0
                && mixes.len() == rows * MIXES
                && x.len() == rows * d
                && streams.len() == rows * STREAMS * d
                && mix.len() == rows * MIX_LEN
                && a.scale.len() == 3
                && a.base.len() == MIXES,
            "hc_pre: {rows} rows: mixes {}, streams {}, mix {}, x {}, scale {}, base {}",
            mixes.len(),
            streams.len(),
            mix.len(),
            x.len(),
            a.scale.len(),
            a.base.len()
        );
        let (mp, sp, bp, stp, mxp, xp) = (
            mixes.addr(),
            a.scale.addr(),
            a.base.addr(),
            streams.addr(),
            mix.addr(),
            x.addr(),
        );
        let (eps, iters, dd) = (a.eps, int(a.iters as usize), int(d));
        self.launch(s, "hc_pre_f32", rows_grid(rows, d), |l| {
            l.arg(&mp).arg(&sp).arg(&bp).arg(&eps).arg(&iters);
            l.arg(&stp).arg(&mxp).arg(&xp).arg(&dd);
        })
    }

    /// For each token row: its streams after a sublayer whose output is `f` (`hc_expand`
    /// with the row's `mix` from `hc_pre`), in place.
    pub(super) fn hc_post(
        &self,
        s: &CudaStream,
        f: &Span<f32>,
        mix: &Span<f32>,
        streams: &Span<f32>,
    ) -> Result<()> {
        let rows = mix.len() / MIX_LEN;
        let d = f.len() / rows.max(1);
        assert!(
            rows > 0
                && mix.len() == rows * MIX_LEN
                && f.len() == rows * d
                && streams.len() == rows * STREAMS * d,
            "hc_post: {rows} rows: f {}, mix {}, streams {}",
            f.len(),
            mix.len(),
            streams.len()
        );
        let (fp, mp, sp, dd) = (f.addr(), mix.addr(), streams.addr(), int(d));
        self.launch(s, "hc_post_f32", rows_grid(rows, d), |l| {
            l.arg(&fp).arg(&mp).arg(&sp).arg(&dd);
        })
    }

    /// The head's input of each token row: the mean of its streams (`hc_mean`) into `out`.
    pub(super) fn hc_mean(
        &self,
        s: &CudaStream,
        streams: &Span<f32>,
        out: &Span<f32>,
        rows: usize,
    ) -> Result<()> {
        let d = out.len() / rows.max(1);
        assert!(
            rows > 0 && out.len() == rows * d && streams.len() == rows * STREAMS * d,
            "hc_mean: {rows} rows: streams {}, out {}",
            streams.len(),
            out.len()
        );
        let (sp, op, dd) = (streams.addr(), out.addr(), int(d));
        self.launch(s, "hc_mean_f32", rows_grid(rows, d), |l| {
            l.arg(&sp).arg(&op).arg(&dd);
        })
    }

    /// Every stream of each token row starts as its embedding `x`.
    pub(super) fn hc_embed(
        &self,
        s: &CudaStream,
        x: &Span<f32>,
        streams: &Span<f32>,
        rows: usize,
    ) -> Result<()> {
        let d = x.len() / rows.max(1);
        assert!(
            rows > 0 && x.len() == rows * d && streams.len() == rows * STREAMS * d,
            "hc_embed: {rows} rows: x {}, streams {}",
            x.len(),
            streams.len()
        );
        let (xp, sp, dd) = (x.addr(), streams.addr(), int(d));
        self.launch(s, "hc_embed_f32", rows_grid(rows, d), |l| {
            l.arg(&xp).arg(&sp).arg(&dd);
        })
    }
}
