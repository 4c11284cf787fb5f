//! Bit-exactness on the device: the tensor-parallel subtree property of matvec (the full-K
//! result equals tree_sum over the d column-shard results, d = 2 and 4, for every dtype),
//! tree_sum against the host tree, determinism (a repeated launch gives the same bits), and a
//! captured CUDA graph of a decode-like sequence replayed at several positions against the
//! eager run of the same launches, the fused matvec launches (q/k/v in one, the residual
//! add, the SiLU gate) against the separate launches they replace, and the few-rows f32
//! kernel against the generic one.

use std::sync::Arc;

use anyhow::Result;
use memra_gguf::rng::Rng;
use memra_gguf::GgmlType;

use super::{attend, bit_mismatches, random, random_weight, Ctx, DTYPES};
use crate::cpu::kernels::silu_mul_clamped;
use crate::cuda::{
    capture, CaptureError, CudaDevice, CudaStream, DeviceBuffer, DeviceKv, DeviceWeight, Graph,
    Norm, RopeStyle, Span,
};

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    for &dtype in DTYPES {
        let unit = dtype.block_size().max(8);
        tensor_parallel(cx, dtype, 67, 8 * unit * 3, 8)?;
        if dtype.block_size() == 1 {
            tensor_parallel(cx, dtype, 9, 8 * 13, 8)?;
        }
    }
    for &dtype in DTYPES {
        fusion(cx, dtype, 8 * dtype.block_size().max(8) * 3)?;
    }
    // the mHC mixes' shape (normed); a last pass of two groups of the four a lane loads ahead;
    // chunks of 13, not whole groups (the scalar path); four rows a block (2 chunks, normed)
    for (cols, chunks, norm) in [
        (24576, 8, true),
        (20480, 8, false),
        (8 * 13, 8, false),
        (4096, 2, true),
    ] {
        thin_rows(cx, cols, chunks, norm)?;
    }
    tree_sum(cx)?;
    graph(cx)?;
    Ok(())
}

/// `matvec_thin_f32` (a plain f32 launch of at most 1024 rows) against the generic kernel:
/// three weights cut from the rows of a 1100-row matrix, fused in one launch (633 rows, the
/// thin kernel; with 2 chunks its last block holds one row of four), give the bits of the
/// matrix's launch (the persistent grid), x normalized in both when `norm` is set.
fn thin_rows(cx: &mut Ctx, cols: usize, chunks: usize, norm: bool) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (dtype, rows) = (GgmlType::F32, 1100);
    let (bytes, _) = random_weight(&mut cx.rng, dtype, rows, cols)?;
    let x = random(&mut cx.rng, cols, 1.0);
    let xd = dev.upload(s, &x)?;
    let weight = dev.upload(s, &random(&mut cx.rng, cols, 1.0))?;
    let norm = norm.then_some(Norm {
        weight: &weight,
        eps: 1e-5,
    });
    let full = DeviceWeight::upload(dev, s, dtype, &bytes, rows, cols)?;
    let y = dev.alloc::<f32>(s, rows)?;
    dev.matvec_many(s, &[&full], &xd, norm, chunks, &[Span::of(&y)])?;
    let want = dev.download(s, &y)?;
    let row_bytes = cols * 4;
    let cuts = [(0, 301), (301, 600), (1000, 1033)];
    let mut parts = Vec::new();
    for (a, b) in cuts {
        let part = &bytes[a * row_bytes..b * row_bytes];
        parts.push(DeviceWeight::upload(dev, s, dtype, part, b - a, cols)?);
    }
    let ys: Vec<DeviceBuffer<f32>> = parts
        .iter()
        .map(|w| dev.alloc::<f32>(s, w.rows))
        .collect::<Result<_>>()?;
    let spans: Vec<Span<f32>> = ys.iter().map(Span::of).collect();
    dev.matvec_many(
        s,
        &[&parts[0], &parts[1], &parts[2]],
        &xd,
        norm,
        chunks,
        &spans,
    )?;
    let mut mismatches = 0;
    for ((a, b), y) in cuts.iter().zip(&ys) {
        mismatches += bit_mismatches(&dev.download(s, y)?, &want[*a..*b]);
    }
    let normed = if norm.is_some() { ", normed" } else { "" };
    cx.report.exact(
        "matvec_thin_f32",
        format!("rows of 1100x{cols} chunks={chunks}{normed} == generic"),
        mismatches,
    );
    Ok(())
}

/// Column shard `r` of `d` of a row-major weight: each row's bytes for columns
/// `r * cols / d .. (r + 1) * cols / d`.
fn column_shard(
    dtype: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    d: usize,
    r: usize,
) -> Vec<u8> {
    let row_bytes = bytes.len() / rows;
    let part = row_bytes / d;
    debug_assert_eq!(part, (cols / d) / dtype.block_size() * dtype.block_bytes());
    bytes
        .chunks(row_bytes)
        .flat_map(|row| &row[r * part..(r + 1) * part])
        .copied()
        .collect()
}

fn tensor_parallel(
    cx: &mut Ctx,
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    chunks: usize,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (bytes, _) = random_weight(&mut cx.rng, dtype, rows, cols)?;
    let x = random(&mut cx.rng, cols, 1.0);
    let full = DeviceWeight::upload(dev, s, dtype, &bytes, rows, cols)?;
    let xd = dev.upload(s, &x)?;
    let mut y = dev.alloc::<f32>(s, rows)?;
    dev.matvec(s, &full, &xd, chunks, &mut y)?;
    let want = dev.download(s, &y)?;
    // determinism: the same launch again
    dev.matvec(s, &full, &xd, chunks, &mut y)?;
    let again = dev.download(s, &y)?;
    cx.report.exact(
        &format!("matvec_{dtype}"),
        format!("determinism {rows}x{cols} chunks={chunks}"),
        bit_mismatches(&want, &again),
    );
    for d in [2, 4] {
        let k = cols / d;
        let mut parts = dev.alloc::<f32>(s, d * rows)?;
        for r in 0..d {
            let shard = DeviceWeight::upload(
                dev,
                s,
                dtype,
                &column_shard(dtype, &bytes, rows, cols, d, r),
                rows,
                k,
            )?;
            let xs = dev.upload(s, &x[r * k..(r + 1) * k])?;
            dev.matvec(
                s,
                &shard,
                &xs,
                chunks / d,
                &mut parts.slice_mut(r * rows..(r + 1) * rows),
            )?;
            s.synchronize()?;
        }
        let mut combined = dev.alloc::<f32>(s, rows)?;
        dev.tree_sum(s, &parts, d, &mut combined)?;
        let got = dev.download(s, &combined)?;
        cx.report.exact(
            &format!("matvec_{dtype}"),
            format!("tp d={d} {rows}x{cols} chunks={chunks}"),
            bit_mismatches(&got, &want),
        );
    }
    Ok(())
}

fn tree_sum(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let n = 1000;
    for d in [1, 2, 8, 32] {
        let parts = random(&mut cx.rng, d * n, 100.0);
        let mut out = dev.alloc::<f32>(s, n)?;
        dev.tree_sum(s, &dev.upload(s, &parts)?, d, &mut out)?;
        let got = dev.download(s, &out)?;
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let mut v: Vec<f32> = (0..d).map(|k| parts[k * n + i]).collect();
                while v.len() > 1 {
                    v = v.chunks(2).map(|p| p[0] + p[1]).collect();
                }
                v[0]
            })
            .collect();
        cx.report.exact(
            "tree_sum_f32",
            format!("d={d} n={n}"),
            bit_mismatches(&got, &want),
        );
    }
    Ok(())
}

/// The fused matvec launches against one launch per weight: `matvec_many` over three weights
/// whose rows are not whole quads and `matvec_residual` bit for bit; `matvec_swiglu` against
/// the host's silu over the two launches' outputs (f32 `exp` may differ by an ulp), also
/// clamped (glm5-next) against `silu_mul_clamped`, and the prefill's clamped `swiglu_rows`
/// bit for bit against the fused launch.
fn fusion(cx: &mut Ctx, dtype: GgmlType, cols: usize) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let chunks = 8;
    let x = random(&mut cx.rng, cols, 1.0);
    let xd = dev.upload(s, &x)?;
    let mut ws = Vec::new();
    for rows in [67, 22, 22] {
        let (bytes, _) = random_weight(&mut cx.rng, dtype, rows, cols)?;
        ws.push(DeviceWeight::upload(dev, s, dtype, &bytes, rows, cols)?);
    }
    let mut alone = Vec::new();
    for w in &ws {
        let mut y = dev.alloc::<f32>(s, w.rows)?;
        dev.matvec(s, w, &xd, chunks, &mut y)?;
        alone.push(dev.download(s, &y)?);
    }
    let ys: Vec<DeviceBuffer<f32>> = ws
        .iter()
        .map(|w| dev.alloc::<f32>(s, w.rows))
        .collect::<Result<_>>()?;
    let spans: Vec<Span<f32>> = ys.iter().map(Span::of).collect();
    dev.matvec_many(s, &[&ws[0], &ws[1], &ws[2]], &xd, None, chunks, &spans)?;
    let mut mismatches = 0;
    for (y, want) in ys.iter().zip(&alone) {
        mismatches += bit_mismatches(&dev.download(s, y)?, want);
    }
    cx.report.exact(
        &format!("matvec_{dtype}"),
        format!("fused 67+22+22 rows x {cols} == three launches"),
        mismatches,
    );

    let residual = random(&mut cx.rng, ws[0].rows, 4.0);
    let mut y = dev.upload(s, &residual)?;
    dev.matvec_residual(s, &ws[0], &xd, chunks, &y.clone(), &mut y)?;
    let want: Vec<f32> = residual.iter().zip(&alone[0]).map(|(r, v)| r + v).collect();
    cx.report.exact(
        &format!("matvec_{dtype}"),
        format!("residual in place, 67x{cols} == matvec + add"),
        bit_mismatches(&dev.download(s, &y)?, &want),
    );

    let mut h = dev.alloc::<f32>(s, ws[1].rows)?;
    dev.matvec_swiglu(s, &ws[1], &ws[2], &xd, None, chunks, None, &mut h)?;
    let got = dev.download(s, &h)?;
    let err = (0..ws[1].rows)
        .map(|i| {
            let (g, u) = (f64::from(alone[1][i]), f64::from(alone[2][i]));
            let want = g / (1.0 + (-g).exp()) * u;
            (f64::from(got[i]) - want).abs() / want.abs().max(1e-3)
        })
        .fold(0f64, f64::max);
    cx.report.tol(
        &format!("matvec_{dtype}"),
        format!("swiglu 22x{cols} vs silu(gate) * up of two launches"),
        err,
        2e-6,
        "rel",
    );

    let limit = 0.5;
    dev.matvec_swiglu(s, &ws[1], &ws[2], &xd, None, chunks, Some(limit), &mut h)?;
    let got = dev.download(s, &h)?;
    let mut want = alone[1].clone();
    silu_mul_clamped(&mut want, &alone[2], limit);
    let err = got
        .iter()
        .zip(&want)
        .map(|(&g, &w)| f64::from(g - w).abs() / f64::from(w.abs()).max(1e-3))
        .fold(0f64, |m, e| if e.is_nan() { f64::NAN } else { m.max(e) });
    cx.report.tol(
        &format!("matvec_{dtype}"),
        format!("swiglu clamped at {limit}, 22x{cols} vs silu_mul_clamped of two launches"),
        err,
        2e-6,
        "rel",
    );
    let (gd, ud) = (dev.upload(s, &alone[1])?, dev.upload(s, &alone[2])?);
    let mut rows = dev.alloc::<f32>(s, ws[1].rows)?;
    dev.swiglu_rows(s, &gd, &ud, Some(limit), &mut rows, None)?;
    cx.report.exact(
        &format!("matvec_{dtype}"),
        format!("swiglu_rows clamped at {limit} == the fused launch, 22x{cols}"),
        bit_mismatches(&dev.download(s, &rows)?, &got),
    );

    // a norm folded into the launch: the bits of rms_norm then the plain launch
    let weight = dev.upload(s, &random(&mut cx.rng, cols, 1.0))?;
    let mut xn = dev.alloc::<f32>(s, cols)?;
    dev.rms_norm(s, &xd, &weight, 1e-5, &mut xn)?;
    let mut want = Vec::new();
    for w in &ws {
        let mut y = dev.alloc::<f32>(s, w.rows)?;
        dev.matvec(s, w, &xn, chunks, &mut y)?;
        want.push(dev.download(s, &y)?);
    }
    let norm = Some(Norm {
        weight: &weight,
        eps: 1e-5,
    });
    dev.matvec_many(s, &[&ws[0], &ws[1], &ws[2]], &xd, norm, chunks, &spans)?;
    let mut mismatches = 0;
    for (y, want) in ys.iter().zip(&want) {
        mismatches += bit_mismatches(&dev.download(s, y)?, want);
    }
    dev.matvec_swiglu(s, &ws[1], &ws[2], &xd, norm, chunks, None, &mut h)?;
    let mut unfused = dev.alloc::<f32>(s, ws[1].rows)?;
    dev.matvec_swiglu(s, &ws[1], &ws[2], &xn, None, chunks, None, &mut unfused)?;
    mismatches += bit_mismatches(&dev.download(s, &h)?, &dev.download(s, &unfused)?);
    cx.report.exact(
        &format!("matvec_{dtype}"),
        format!("norm folded in (q/k/v, swiglu) == rms_norm then matvec, K={cols}"),
        mismatches,
    );
    Ok(())
}

/// Buffers of a small decode-like step: embed -> rms_norm -> q/k/v matvecs -> rope and cache
/// write -> attention -> output matvec with the residual add -> gate/up matvec with the norm
/// folded in and silu -> head matvec -> argmax, which writes the token the next step embeds.
struct Step {
    embed: DeviceWeight,
    wq: DeviceWeight,
    wk: DeviceWeight,
    wv: DeviceWeight,
    wo: DeviceWeight,
    wu: DeviceWeight,
    head: DeviceWeight,
    norm: DeviceBuffer<f32>,
    kv: DeviceKv,
    token: DeviceBuffer<u32>,
    pos: DeviceBuffer<u32>,
    h: DeviceBuffer<f32>,
    hn: DeviceBuffer<f32>,
    q: DeviceBuffer<f32>,
    k: DeviceBuffer<f32>,
    v: DeviceBuffer<f32>,
    att: DeviceBuffer<f32>,
    o: DeviceBuffer<f32>,
    scores: DeviceBuffer<f32>,
    logits: DeviceBuffer<f32>,
}

const DIM: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const VOCAB: usize = 300;
const CTX: usize = 16;

impl Step {
    fn new(dev: &CudaDevice, s: &Arc<CudaStream>, rng: &mut Rng) -> Result<Step> {
        let mut weight = |dtype, rows, cols| -> Result<DeviceWeight> {
            let (bytes, _) = random_weight(rng, dtype, rows, cols)?;
            DeviceWeight::upload(dev, s, dtype, &bytes, rows, cols)
        };
        let kvd = KV_HEADS * HEAD_DIM;
        Ok(Step {
            embed: weight(GgmlType::Q4_1, VOCAB, DIM)?,
            wq: weight(GgmlType::Q8_0, DIM, DIM)?,
            wk: weight(GgmlType::Q4_K, kvd, DIM)?,
            wv: weight(GgmlType::F16, kvd, DIM)?,
            wo: weight(GgmlType::Q6_K, DIM, DIM)?,
            wu: weight(GgmlType::Q8_0, DIM, DIM)?,
            head: weight(GgmlType::Q4_0, VOCAB, DIM)?,
            norm: dev.upload(s, &random(rng, DIM, 1.0))?,
            kv: DeviceKv::new(dev, s, KV_HEADS, HEAD_DIM, CTX, 1)?,
            token: dev.upload(s, &[5u32])?,
            pos: dev.alloc(s, 1)?,
            h: dev.alloc(s, DIM)?,
            hn: dev.alloc(s, DIM)?,
            q: dev.alloc(s, DIM)?,
            k: dev.alloc(s, kvd)?,
            v: dev.alloc(s, kvd)?,
            att: dev.alloc(s, DIM)?,
            o: dev.alloc(s, DIM)?,
            scores: dev.alloc(s, HEADS * CTX)?,
            logits: dev.alloc(s, VOCAB)?,
        })
    }

    /// Enqueues one step; everything per-step comes from `token` and `pos` on the device.
    fn enqueue(&mut self, dev: &CudaDevice, s: &CudaStream) -> Result<()> {
        dev.embed(s, &self.embed, &self.token, &mut self.h)?;
        dev.rms_norm(s, &self.h, &self.norm, 1e-5, &mut self.hn)?;
        dev.matvec(s, &self.wq, &self.hn, 8, &mut self.q)?;
        dev.matvec(s, &self.wk, &self.hn, 1, &mut self.k)?;
        dev.matvec(s, &self.wv, &self.hn, 2, &mut self.v)?;
        attend(
            (dev, s),
            &mut self.q,
            (&self.k, &self.v),
            &mut self.kv,
            &self.pos,
            (10000.0, RopeStyle::Normal),
            &self.scores,
            &mut self.att,
            None,
        )?;
        dev.matvec_residual(s, &self.wo, &self.att, 1, &self.h, &mut self.o)?;
        let norm = Norm {
            weight: &self.norm,
            eps: 1e-5,
        };
        dev.matvec_swiglu(
            s,
            &self.wq,
            &self.wu,
            &self.o,
            Some(norm),
            8,
            None,
            &mut self.att,
        )?;
        dev.matvec(s, &self.head, &self.att, 4, &mut self.logits)?;
        dev.argmax(s, &self.logits, &mut self.token)
    }

    /// Resets token, cache and position, then runs `steps` steps with `run_step`, returning the
    /// logits and token of every step.
    fn trace(
        &mut self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        steps: usize,
        run_step: &mut dyn FnMut(&mut Step) -> Result<()>,
    ) -> Result<Vec<f32>> {
        dev.write(s, &[5u32], &mut self.token)?;
        s.memset_zeros(&mut self.kv.k)?;
        s.memset_zeros(&mut self.kv.v)?;
        let mut trace = Vec::new();
        for p in 0..steps {
            dev.write(s, &[p as u32], &mut self.pos)?;
            run_step(self)?;
            trace.extend(dev.download(s, &self.logits)?);
            trace.push(dev.download(s, &self.token)?[0] as f32);
        }
        Ok(trace)
    }
}

/// Reports under `check` the bits of a captured graph's replay (`replay`) against the eager
/// run `eager`, or the capture's failure.
pub(super) fn report_replay(
    cx: &mut Ctx,
    check: &str,
    what: String,
    captured: Result<Graph, CaptureError>,
    eager: &[f32],
    replay: impl FnOnce(&Graph) -> Result<Vec<f32>>,
) -> Result<()> {
    match captured {
        Ok(g) => {
            let replayed = replay(&g)?;
            cx.report
                .exact(check, what, bit_mismatches(&replayed, eager));
        }
        Err(e) => {
            println!("{check} capture failed: {e}");
            cx.report.exact(check, "capture".to_string(), 1);
        }
    }
    Ok(())
}

fn graph(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let mut step = Step::new(dev, s, &mut cx.rng)?;
    s.synchronize()?;
    let steps = 6;
    let eager = step.trace(dev, s, steps, &mut |st: &mut Step| st.enqueue(dev, s))?;
    let eager_again = step.trace(dev, s, steps, &mut |st: &mut Step| st.enqueue(dev, s))?;
    cx.report.exact(
        "graph",
        format!("eager determinism, {steps} steps"),
        bit_mismatches(&eager, &eager_again),
    );
    let captured = capture(s, || step.enqueue(dev, s));
    report_replay(
        cx,
        "graph",
        format!("replay == eager, {steps} steps x 11 launches"),
        captured,
        &eager,
        |g| step.trace(dev, s, steps, &mut |_: &mut Step| Ok(g.replay()?)),
    )?;
    // a capture whose recording fails must leave the stream usable (the guard ends it)
    let failed = capture(s, || anyhow::bail!("planted failure"));
    let usable = step.trace(dev, s, 1, &mut |st: &mut Step| st.enqueue(dev, s))?;
    let ok = failed.is_err() && bit_mismatches(&usable, &eager[..VOCAB + 1]) == 0;
    cx.report.exact(
        "graph",
        "failed capture leaves the stream eager".to_string(),
        usize::from(!ok),
    );
    Ok(())
}
