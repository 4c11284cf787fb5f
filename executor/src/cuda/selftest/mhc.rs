//! mHC on the device against the CPU backend (`cpu::kernels::mhc`), over several token rows at
//! awkward widths: `hc_pre_f32`'s mixing weights against `hc_mix` within a relative bound
//! (CUDA's expf may round an ulp away from the host's in the sigmoids and the softmax, and
//! Sinkhorn carries it), its collapse bit for bit against `hc_collapse` with the device's own
//! pre weights, `hc_post_f32` bit for bit against `hc_expand` with the device's own mixing
//! weights, `hc_mean_f32` and `hc_embed_f32` bit for bit; the mixes themselves, the product of
//! the RMS-normed streams by `hc_*_fn`, within a relative bound of the CPU's rms_norm and
//! matvec. Then a sublayer's launches captured in a graph and replayed against eager, bit for
//! bit.

use anyhow::Result;
use memra_gguf::GgmlType;

use super::exact::report_replay;
use super::{bit_mismatches, random, Ctx};
use crate::cpu::kernels::{
    self, hc_collapse, hc_expand, hc_mean, hc_mix, HcAffine as HostAffine, HcMix, Pool, Weight,
    MIXES, STREAMS,
};
use crate::cuda::mhc::{HcAffine, MIX_LEN};
use crate::cuda::weights::full_chunks;
use crate::cuda::{capture, DeviceWeight, Norm, Span};

/// The epsilon of the streams' RMS norm.
const NORM_EPS: f32 = 1e-6;
/// mHC's epsilon (glm5-next's `hc_eps`).
const EPS: f32 = 1e-6;

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    // (embedding width, token rows, Sinkhorn iterations)
    for case in [(37, 1, 20), (256, 3, 20), (1000, 2, 1), (4096, 1, 7)] {
        kernels_of(cx, case)?;
    }
    for d in [64, 1024] {
        mixes(cx, d)?;
    }
    graph(cx)?;
    Ok(())
}

/// A device mix as the CPU's `HcMix`.
fn as_mix(v: &[f32]) -> HcMix {
    let mut m = HcMix::default();
    m.pre.copy_from_slice(&v[..STREAMS]);
    m.post.copy_from_slice(&v[STREAMS..2 * STREAMS]);
    m.comb.copy_from_slice(&v[2 * STREAMS..MIX_LEN]);
    m
}

fn mix_values(m: &HcMix) -> Vec<f32> {
    m.pre
        .iter()
        .chain(&m.post)
        .chain(&m.comb)
        .copied()
        .collect()
}

fn kernels_of(cx: &mut Ctx, (d, rows, iters): (usize, usize, u32)) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let case = format!("d {d}, {rows} rows, {iters} iterations");
    let mixes = random(&mut cx.rng, rows * MIXES, 4.0);
    let (scale, base) = (random(&mut cx.rng, 3, 1.5), random(&mut cx.rng, MIXES, 1.0));
    let streams = random(&mut cx.rng, rows * STREAMS * d, 2.0);
    let f = random(&mut cx.rng, rows * d, 2.0);
    let md = dev.upload(s, &mixes)?;
    let (sd, bd) = (dev.upload(s, &scale)?, dev.upload(s, &base)?);
    let std = dev.upload(s, &streams)?;
    let fd = dev.upload(s, &f)?;
    let mixd = dev.alloc::<f32>(s, rows * MIX_LEN)?;
    let xd = dev.alloc::<f32>(s, rows * d)?;
    let a = HcAffine {
        scale: Span::of(&sd),
        base: Span::of(&bd),
        eps: EPS,
        iters,
    };
    let (mix_s, x_s, st_s) = (Span::of(&mixd), Span::of(&xd), Span::of(&std));
    dev.hc_pre(s, &Span::of(&md), &a, &st_s, &mix_s, &x_s)?;
    let got_mix = dev.download(s, &mixd)?;
    let got_x = dev.download(s, &xd)?;
    let host = HostAffine {
        scale: &scale,
        base: &base,
    };
    let (mut err, mut collapse) = (0f64, 0);
    let mut want_x = vec![0f32; d];
    for r in 0..rows {
        let want = mix_values(&hc_mix(
            &mixes[r * MIXES..(r + 1) * MIXES],
            &host,
            EPS,
            iters,
        ));
        let got = &got_mix[r * MIX_LEN..(r + 1) * MIX_LEN];
        for (&g, &w) in got.iter().zip(&want) {
            let e = f64::from(g - w).abs() / f64::from(w.abs()).max(1e-3);
            err = if e.is_nan() {
                f64::INFINITY
            } else {
                err.max(e)
            };
        }
        let own = as_mix(got);
        hc_collapse(
            &streams[r * STREAMS * d..(r + 1) * STREAMS * d],
            &own.pre,
            &mut want_x,
        );
        collapse += bit_mismatches(&got_x[r * d..(r + 1) * d], &want_x);
    }
    cx.report.tol("hc_pre mix", case.clone(), err, 2e-5, "rel");
    cx.report.exact("hc_pre collapse", case.clone(), collapse);

    dev.hc_post(s, &Span::of(&fd), &mix_s, &st_s)?;
    let got = dev.download(s, &std)?;
    let mut want = streams.clone();
    for r in 0..rows {
        let own = as_mix(&got_mix[r * MIX_LEN..(r + 1) * MIX_LEN]);
        let w = &mut want[r * STREAMS * d..(r + 1) * STREAMS * d];
        hc_expand(&f[r * d..(r + 1) * d], &own, w);
    }
    cx.report
        .exact("hc_post", case.clone(), bit_mismatches(&got, &want));

    dev.hc_mean(s, &st_s, &x_s, rows)?;
    let mut mean = vec![0f32; rows * d];
    for (o, st) in mean.chunks_exact_mut(d).zip(want.chunks_exact(STREAMS * d)) {
        hc_mean(st, o);
    }
    cx.report.exact(
        "hc_mean",
        case.clone(),
        bit_mismatches(&dev.download(s, &xd)?, &mean),
    );

    dev.hc_embed(s, &Span::of(&fd), &st_s, rows)?;
    let copies: Vec<f32> = f
        .chunks_exact(d)
        .flat_map(|row| (0..STREAMS).flat_map(move |_| row.iter().copied()))
        .collect();
    cx.report.exact(
        "hc_embed",
        case,
        bit_mismatches(&dev.download(s, &std)?, &copies),
    );
    Ok(())
}

/// The mixes: `hc_*_fn` (f32, `MIXES x STREAMS d`) times the streams normed with a unit
/// weight, as a normed matvec, against the CPU's rms_norm then matvec.
fn mixes(cx: &mut Ctx, d: usize) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let wide = STREAMS * d;
    let w = random(&mut cx.rng, MIXES * wide, 0.1);
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let wd = DeviceWeight::upload(dev, s, GgmlType::F32, &bytes, MIXES, wide)?;
    let streams = random(&mut cx.rng, wide, 2.0);
    let ones = vec![1f32; wide];
    let (std, onesd) = (dev.upload(s, &streams)?, dev.upload(s, &ones)?);
    let out = dev.alloc::<f32>(s, MIXES)?;
    let norm = Norm {
        weight: &onesd,
        eps: NORM_EPS,
    };
    let chunks = full_chunks(&wd);
    dev.matvec_many(s, &[&wd], &std, Some(norm), chunks, &[Span::of(&out)])?;
    let got = dev.download(s, &out)?;
    let mut xn = vec![0f32; wide];
    kernels::rms_norm(&streams, &ones, NORM_EPS, &mut xn);
    let weight = Weight {
        dtype: GgmlType::F32,
        data: &bytes,
        rows: MIXES,
        cols: wide,
    };
    let mut want = vec![0f32; MIXES];
    kernels::matvec(&Pool::new(2), &weight, &xn, chunks, &mut want);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let err = got
        .iter()
        .zip(&want)
        .map(|(&g, &w)| f64::from((g - w).abs() / scale))
        .fold(0f64, |m, e| if e.is_nan() { f64::NAN } else { m.max(e) });
    cx.report.tol(
        "hc mixes",
        format!("{MIXES}x{wide} f32, normed streams"),
        err,
        1e-5,
        "rel max",
    );
    Ok(())
}

fn graph(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (d, steps) = (512, 4);
    let mixes: Vec<Vec<f32>> = (0..steps)
        .map(|_| random(&mut cx.rng, MIXES, 4.0))
        .collect();
    let fs: Vec<Vec<f32>> = (0..steps).map(|_| random(&mut cx.rng, d, 1.0)).collect();
    let (scale, base) = (random(&mut cx.rng, 3, 1.5), random(&mut cx.rng, MIXES, 1.0));
    let streams = random(&mut cx.rng, STREAMS * d, 2.0);
    let (sd, bd) = (dev.upload(s, &scale)?, dev.upload(s, &base)?);
    let a = HcAffine {
        scale: Span::of(&sd),
        base: Span::of(&bd),
        eps: EPS,
        iters: 20,
    };
    let mut md = dev.alloc::<f32>(s, MIXES)?;
    let mut fd = dev.alloc::<f32>(s, d)?;
    let mixd = dev.alloc::<f32>(s, MIX_LEN)?;
    let xd = dev.alloc::<f32>(s, d)?;
    let mut std = dev.upload(s, &streams)?;
    let (m_s, f_s, mix_s, x_s, st_s) = (
        Span::of(&md),
        Span::of(&fd),
        Span::of(&mixd),
        Span::of(&xd),
        Span::of(&std),
    );
    // a sublayer whose output is its input plus f: pre, an add, post
    let enqueue = || -> Result<()> {
        dev.hc_pre(s, &m_s, &a, &st_s, &mix_s, &x_s)?;
        dev.add(s, &x_s, &f_s, &mut x_s.clone())?;
        dev.hc_post(s, &x_s, &mix_s, &st_s)
    };
    let mut eager = Vec::new();
    for (m, f) in mixes.iter().zip(&fs) {
        dev.write(s, m, &mut md)?;
        dev.write(s, f, &mut fd)?;
        enqueue()?;
        eager.extend(dev.download(s, &std)?);
    }
    dev.write(s, &streams, &mut std)?;
    s.synchronize()?;
    let captured = capture(s, enqueue);
    report_replay(
        cx,
        "hc graph",
        format!("replay == eager, {steps} sublayers, d {d}"),
        captured,
        &eager,
        |g| {
            let mut replayed = Vec::new();
            for (m, f) in mixes.iter().zip(&fs) {
                dev.write(s, m, &mut md)?;
                dev.write(s, f, &mut fd)?;
                g.replay()?;
                replayed.extend(dev.download(s, &std)?);
            }
            Ok(replayed)
        },
    )
}
