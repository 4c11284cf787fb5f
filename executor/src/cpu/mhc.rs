//! mHC on the CPU (glm5-next's residual): the streams of every token row live in
//! `Activations::hc`; `hc_pre` collapses them into the sublayer's input in `x` (and keeps the
//! mixing weights), and a finished sublayer's output is spread back over them
//! (`finish_streams`), on a lone rank or after the group's all-reduce alike.

use anyhow::{bail, Result};

use super::kernels::{
    combine_into, hc_collapse, hc_expand, hc_mix, HcAffine, HcMix, MIXES, STREAMS,
};
use super::segments::{full_k, norm_rows, sized, view, Activations, Ctx, Pending};
use crate::layer_weights::HcWeights;

/// mHC's residual: per token row `STREAMS` rows of the embedding width, and each token row's
/// mixing weights of the sublayer running (its mixes kept between uses).
#[derive(Default)]
pub(super) struct HcState {
    pub streams: Vec<f32>,
    pub mixes: Vec<f32>,
    pub mix: Vec<HcMix>,
}

/// mHC's Sinkhorn iterations and epsilon (the plan's `model.mhc`).
#[derive(Clone, Copy)]
pub(super) struct HcParams {
    pub iters: u32,
    pub eps: f32,
}

/// mHC before a sublayer: each row's 24 mixes from its RMS-normed streams, the mixing weights,
/// and the sublayer's input (the pre-weighted sum of the streams) in `x`.
pub(super) fn hc_pre(c: &Ctx, w: &HcWeights, p: HcParams, a: &mut Activations) -> Result<()> {
    let Some(hc) = &mut a.hc else {
        bail!("an mHC segment without mHC streams in the plan's model");
    };
    let t = a.rows.max(1);
    let wide = hc.streams.len() / t;
    let d = wide / STREAMS;
    norm_rows(&hc.streams, &vec![1.0; wide], c.geo.eps, &mut a.xn);
    full_k(
        c.pool,
        &view(&w.mixes),
        &a.xn,
        sized(&mut hc.mixes, t * MIXES),
    );
    let affine = HcAffine {
        scale: &w.scale,
        base: &w.base,
    };
    hc.mix.clear();
    hc.mix.extend(
        hc.mixes
            .chunks_exact(MIXES)
            .map(|m| hc_mix(m, &affine, p.eps, p.iters)),
    );
    let x = sized(&mut a.x, t * d);
    for ((x, streams), m) in x
        .chunks_exact_mut(d)
        .zip(hc.streams.chunks_exact(wide))
        .zip(&hc.mix)
    {
        hc_collapse(streams, &m.pre, x);
    }
    Ok(())
}

/// Spreads the finished sublayer output (`sum`, or the combined experts) over the streams.
pub(super) fn finish_streams(a: &mut Activations, sum: &[f32]) {
    let hc = a.hc.as_mut().expect("invariant: called with mHC streams");
    let d = a.x.len() / a.rows.max(1);
    let combined;
    let f = match a.pending {
        Pending::Hidden => sum,
        Pending::Experts { k, shared } => {
            let per = (k + usize::from(shared)) * d;
            let mut f = vec![0.0; a.x.len()];
            for (sum, x) in sum.chunks_exact(per).zip(f.chunks_exact_mut(d)) {
                combine_into(sum, k, shared, x);
            }
            combined = f;
            &combined
        }
    };
    for ((f, m), streams) in f
        .chunks_exact(d)
        .zip(&hc.mix)
        .zip(hc.streams.chunks_exact_mut(STREAMS * d))
    {
        hc_expand(f, m, streams);
    }
}
