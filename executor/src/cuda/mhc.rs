//! mHC (glm5-next's residual streams) on a CUDA device: typed launches of kernels/mhc.cu, with
//! the math of the CPU backend's `cpu::kernels::mhc` (`hc_mix` then `hc_collapse` in
//! `hc_pre`, `hc_expand` in `hc_post`, `hc_mean`, and the embedding copied into every stream).
//! A sublayer's 24 mixes are the product of its RMS-normed streams (unit weight) by
//! `hc_*_fn`, an ordinary normed matvec the caller runs. Each launch takes every token row of
//! the step, one grid row each. The rank does not hold mHC streams yet (`rank` refuses
//! glm5-next's plans by name); the self-test checks these launches against the CPU kernels.

use anyhow::Result;
use cudarc::driver::{CudaStream, DeviceSlice, LaunchConfig};

use super::device::CudaDevice;
use super::ops::int;
use super::span::Span;
use crate::cpu::kernels::{MIXES, STREAMS};

/// Values of one token's mixing weights on the device: pre, post, then the combination
/// `comb[dst + STREAMS * src]` (`HC_MIX_LEN` in kernels/mhc.cu, `cpu::kernels::HcMix`).
pub const MIX_LEN: usize = 2 * STREAMS + STREAMS * STREAMS;

/// Threads of a block of the mHC launches.
const THREADS: usize = 256;

/// A sublayer's learned map from mixes to mixing weights (`cpu::kernels::HcAffine`) and the
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
