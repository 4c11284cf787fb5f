//! The prefill kernels over token rows: the tensor-core product against an f64 reference of
//! the values it multiplies (activations and dequantized weights narrowed to f16), per dtype
//! and at awkward sizes; the tensor-parallel property of its chunks (the chunks of a column
//! half are bit for bit the full product's chunks); a prefill step's attention rows bit for
//! bit against the decode steps at the same positions (outputs and cache); and the
//! tensor-core attention of the rows against those rows; each row's position.

use std::sync::Arc;

use anyhow::Result;
use memra_gguf::f16::{f16_to_f32, f32_to_f16};
use memra_gguf::GgmlType;

use super::{attend, bit_mismatches, random, random_weight, Ctx};
use crate::cuda::ops::attention_parts_len;
use crate::cuda::rows::{GemmTile, Groups};
use crate::cuda::weights::DeviceStack;
use crate::cuda::{CudaDevice, CudaStream, DeviceBuffer, DeviceKv, DeviceWeight, RopeStyle, Span};
use crate::weights::Stack;

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    for dtype in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        for (rows, n, k, chunks) in [(1, 131, 256, 1), (70, 131, 512, 2), (130, 256, 2048, 8)] {
            gemm(cx, dtype, rows, n, k, chunks)?;
        }
    }
    for dtype in [GgmlType::F16, GgmlType::Q4_1, GgmlType::Q8_0] {
        gemm_halves(cx, dtype)?;
    }
    for dtype in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q6_K,
    ] {
        gemm_tiles(cx, dtype)?;
    }
    for dtype in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        gemm_shared_launch(cx, dtype)?;
        gemm_trees(cx, dtype)?;
        gemm_groups(cx, dtype)?;
    }
    // the decode steps split positions past the first chunk across blocks, the prefill rows walk
    for (n_heads, n_kv, hd, p0, rows) in [
        (4, 2, 64, 5, 9),
        (8, 8, 128, 0, 70),
        (6, 2, 96, 31, 3),
        (4, 2, 64, 300, 9),
    ] {
        attention_rows(cx, n_heads, n_kv, hd, p0, rows)?;
    }
    for (n_heads, n_kv, hd, p0, rows) in [
        (8, 2, 128, 0, 70),
        (4, 4, 64, 37, 130),
        (6, 2, 128, 200, 17),
        (2, 1, 64, 0, 1),
    ] {
        flash_rows(cx, n_heads, n_kv, hd, p0, rows)?;
    }
    for (p0, rows) in [(0, 1), (37, 300)] {
        positions(cx, p0, rows)?;
    }
    narrowing(cx)?;
    Ok(())
}

/// The f16 copies the norm and the SiLU gate leave for the products (`rms_norm_narrowing`,
/// `swiglu_rows` with `out16`) equal `to_f16` of their f32 outputs, bit for bit, and the f32
/// outputs are the plain launches'.
fn narrowing(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (rows, n) = (37, 1000);
    let halves = |d: &DeviceBuffer<u16>| -> Result<Vec<f32>> {
        Ok(dev.download(s, d)?.into_iter().map(f16_to_f32).collect())
    };
    let narrowed = |y: &DeviceBuffer<f32>| -> Result<Vec<f32>> {
        let mut h = dev.alloc::<u16>(s, y.len())?;
        dev.to_f16(s, y, &mut h)?;
        halves(&h)
    };
    let x = dev.upload(s, &random(&mut cx.rng, rows * n, 3.0))?;
    let up = dev.upload(s, &random(&mut cx.rng, rows * n, 3.0))?;
    let weight = dev.upload(s, &random(&mut cx.rng, n, 1.0))?;
    let (mut plain, mut fused) = (
        dev.alloc::<f32>(s, rows * n)?,
        dev.alloc::<f32>(s, rows * n)?,
    );
    let h = dev.alloc::<u16>(s, rows * n)?;
    dev.rms_norm(s, &x, &weight, 1e-5, &mut plain)?;
    dev.rms_norm_narrowing(s, &x, &weight, 1e-5, &mut fused, Some(&Span::of(&h)))?;
    let wrong = bit_mismatches(&dev.download(s, &fused)?, &dev.download(s, &plain)?)
        + bit_mismatches(&halves(&h)?, &narrowed(&plain)?);
    cx.report.exact(
        "rms_norm_f32",
        format!("narrowing {rows} rows of {n} == rms_norm then to_f16"),
        wrong,
    );
    for limit in [None, Some(2.5)] {
        let h = dev.alloc::<u16>(s, rows * n)?;
        dev.swiglu_rows(s, &x, &up, limit, &mut plain, None)?;
        dev.swiglu_rows(s, &x, &up, limit, &mut fused, Some(&Span::of(&h)))?;
        let wrong = bit_mismatches(&dev.download(s, &fused)?, &dev.download(s, &plain)?)
            + bit_mismatches(&halves(&h)?, &narrowed(&plain)?);
        cx.report.exact(
            "swiglu_rows_f32",
            format!("narrowing {rows}x{n} (limit {limit:?}) == swiglu_rows then to_f16"),
            wrong,
        );
    }
    Ok(())
}

/// `row_positions` of `rows` rows from position `p0`: `p0 + t` for row `t`, exactly.
fn positions(cx: &mut Ctx, p0: u32, rows: usize) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let pd = dev.upload(s, &[p0])?;
    let mut out = dev.alloc::<u32>(s, rows)?;
    dev.row_positions(s, &pd, &mut out)?;
    let got = dev.download(s, &out)?;
    let wrong = (0..rows)
        .filter(|&t| got[t] as usize != p0 as usize + t)
        .count();
    cx.report
        .exact("row_positions", format!("{rows} rows from {p0}"), wrong);
    Ok(())
}

/// `flash_attention` of `rows` rows from position `p0` (a prefix of random cache rows before
/// them) against the decode kernel's rows over the same cache: relative to the largest output.
fn flash_rows(
    cx: &mut Ctx,
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    p0: usize,
    rows: usize,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (row, qrow) = (n_kv * hd, n_heads * hd);
    let rope = (10000.0, RopeStyle::Normal);
    let mut kv = DeviceKv::new(dev, s, n_kv, hd, p0 + rows + 5, 1)?;
    let mut pd = dev.alloc::<u32>(s, 1)?;
    if p0 > 0 {
        let (k, v) = (
            random(&mut cx.rng, p0 * row, 2.0),
            random(&mut cx.rng, p0 * row, 1.0),
        );
        let (kd, vd) = (dev.upload(s, &k)?, dev.upload(s, &v)?);
        dev.kv_store_rows(s, &kd, &vd, &mut kv, &pd, None, rope)?;
    }
    dev.write(s, &[p0 as u32], &mut pd)?;
    let q = random(&mut cx.rng, rows * qrow, 1.0);
    let (k, v) = (
        random(&mut cx.rng, rows * row, 2.0),
        random(&mut cx.rng, rows * row, 1.0),
    );
    let (kd, vd) = (dev.upload(s, &k)?, dev.upload(s, &v)?);
    dev.kv_store_rows(s, &kd, &vd, &mut kv, &pd, None, rope)?;
    let qd = dev.upload(s, &q)?;
    let mut fast = dev.upload(s, &vec![f32::NAN; rows * qrow])?;
    dev.flash_attention(s, &qd, &kv, &pd, rows, rope, &mut fast)?;
    let mut qc = dev.upload(s, &q)?;
    let mut want = dev.alloc::<f32>(s, rows * qrow)?;
    let no_parts = dev.alloc::<f32>(s, 0)?;
    attend(
        (dev, s),
        &mut qc,
        (&kd, &vd),
        &mut kv,
        &pd,
        rope,
        &no_parts,
        &mut want,
        None,
    )?;
    let (got, want) = (dev.download(s, &fast)?, dev.download(s, &want)?);
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = got
        .iter()
        .zip(&want)
        .map(|(a, b)| f64::from((a - b).abs() / scale))
        .fold(0f64, |m, e| {
            if e.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(e)
            }
        });
    cx.report.tol(
        "flash_attention",
        format!("{rows} rows from {p0}, h={n_heads} kv={n_kv} hd={hd}"),
        err,
        4e-3,
        "rel max",
    );
    Ok(())
}

fn half(x: f32) -> f64 {
    f64::from(f16_to_f32(f32_to_f16(x)))
}

/// `a` on the device, narrowed to f16 by `to_f16`, as a prefill step's products read it.
fn narrowed(dev: &CudaDevice, s: &Arc<CudaStream>, a: &[f32]) -> Result<DeviceBuffer<u16>> {
    let ad = dev.upload(s, a)?;
    let mut a16 = dev.alloc::<u16>(s, a.len())?;
    dev.to_f16(s, &ad, &mut a16)?;
    Ok(a16)
}

/// `gemm_<dtype>` of `rows` rows into `chunks` partials, in every tile of the dtype, against
/// the f64 sums of each chunk.
fn gemm(
    cx: &mut Ctx,
    dtype: GgmlType,
    rows: usize,
    n: usize,
    k: usize,
    chunks: usize,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (bytes, deq) = random_weight(&mut cx.rng, dtype, n, k)?;
    let a = random(&mut cx.rng, rows * k, 1.0);
    let w = DeviceWeight::upload(dev, s, dtype, &bytes, n, k)?;
    let a16 = narrowed(dev, s, &a)?;
    for tile in GemmTile::all(dtype, dev.arch()) {
        let mut yd = dev.upload(s, &vec![f32::NAN; chunks * rows * n])?;
        dev.gemm(s, (&w).into(), &a16, rows, chunks, &mut yd, Some(tile))?;
        let y = dev.download(s, &yd)?;
        let len = k / chunks;
        let mut err = 0f64;
        for z in 0..chunks {
            for t in 0..rows {
                for j in 0..n {
                    let (mut sum, mut scale) = (0f64, 0f64);
                    for i in z * len..(z + 1) * len {
                        let p = half(a[t * k + i]) * half(deq[j * k + i]);
                        sum += p;
                        scale += p.abs();
                    }
                    let got = f64::from(y[(z * rows + t) * n + j]);
                    err = err.max((got - sum).abs() / scale.max(1e-30));
                }
            }
        }
        if y.iter().any(|v| !v.is_finite()) {
            err = f64::NAN;
        }
        cx.report.tol(
            &format!("gemm_{dtype}"),
            format!("{tile:?} {rows}x{k} by {n}x{k} chunks={chunks}"),
            err,
            1e-5,
            "rel|wx|",
        );
    }
    Ok(())
}

/// The chunks of each column half of a weight (a tensor-parallel rank's share of a
/// row-parallel product) equal the full product's chunks bit for bit.
fn gemm_halves(cx: &mut Ctx, dtype: GgmlType) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (rows, n, k, chunks) = (70, 96, 1024, 8);
    let src = random(&mut cx.rng, n * k, 1.0);
    let quantize = |cols: std::ops::Range<usize>| -> Result<Vec<u8>> {
        let part: Vec<f32> = (0..n)
            .flat_map(|j| src[j * k + cols.start..j * k + cols.end].to_vec())
            .collect();
        let size = dtype
            .bytes_for(part.len() as u64)
            .expect("invariant: whole blocks");
        let mut bytes = vec![0u8; size as usize];
        memra_gguf::quantize(dtype, &part, &mut bytes)?;
        Ok(bytes)
    };
    let a = random(&mut cx.rng, rows * k, 1.0);
    let run = |bytes: &[u8], cols: std::ops::Range<usize>, c: usize| -> Result<Vec<f32>> {
        let w = DeviceWeight::upload(dev, s, dtype, bytes, n, cols.len())?;
        let part: Vec<f32> = (0..rows)
            .flat_map(|t| a[t * k + cols.start..t * k + cols.end].to_vec())
            .collect();
        let a16 = narrowed(dev, s, &part)?;
        let mut yd = dev.alloc::<f32>(s, c * rows * n)?;
        dev.gemm(s, (&w).into(), &a16, rows, c, &mut yd, None)?;
        dev.download(s, &yd)
    };
    let full = run(&quantize(0..k)?, 0..k, chunks)?;
    let lo = run(&quantize(0..k / 2)?, 0..k / 2, chunks / 2)?;
    let hi = run(&quantize(k / 2..k)?, k / 2..k, chunks / 2)?;
    let halves: Vec<f32> = lo.into_iter().chain(hi).collect();
    cx.report.exact(
        &format!("gemm_{dtype}"),
        format!("column halves = full chunks, {rows}x{k} by {n}"),
        bit_mismatches(&halves, &full),
    );
    Ok(())
}

/// Every tile of the dtype (`GemmTile::all`) gives every output the bits of tiles of 64 rows.
fn gemm_tiles(cx: &mut Ctx, dtype: GgmlType) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    for (rows, n, k, chunks) in [(300, 260, 1024, 2), (512, 640, 2048, 8), (73, 384, 512, 1)] {
        let (bytes, _) = random_weight(&mut cx.rng, dtype, n, k)?;
        let w = DeviceWeight::upload(dev, s, dtype, &bytes, n, k)?;
        let a16 = narrowed(dev, s, &random(&mut cx.rng, rows * k, 1.0))?;
        let run = |tile: GemmTile| -> Result<Vec<f32>> {
            let mut yd = dev.upload(s, &vec![f32::NAN; chunks * rows * n])?;
            dev.gemm(s, (&w).into(), &a16, rows, chunks, &mut yd, Some(tile))?;
            dev.download(s, &yd)
        };
        let small = run(GemmTile::Mma { rows: 64 })?;
        for tile in GemmTile::all(dtype, dev.arch()).into_iter().skip(1) {
            cx.report.exact(
                &format!("gemm_{dtype}"),
                format!("{tile:?} = Mma {{ rows: 64 }}, {rows}x{k} by {n} chunks={chunks}"),
                bit_mismatches(&run(tile)?, &small),
            );
        }
    }
    Ok(())
}

/// The chunks' tree in every tile of the dtype (`gemm_tree`: the warpgroup kernels add it as
/// each chunk ends) equals the chunks of tiles of 64 rows added by `tree_sum`, bit for bit.
fn gemm_trees(cx: &mut Ctx, dtype: GgmlType) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    for (rows, n, k, chunks) in [(300, 260, 1024, 2), (512, 384, 2048, 8), (73, 131, 512, 4)] {
        let (bytes, _) = random_weight(&mut cx.rng, dtype, n, k)?;
        let w = DeviceWeight::upload(dev, s, dtype, &bytes, n, k)?;
        let a16 = narrowed(dev, s, &random(&mut cx.rng, rows * k, 1.0))?;
        let parts = dev.upload(s, &vec![f32::NAN; chunks * rows * n])?;
        let out = dev.upload(s, &vec![f32::NAN; rows * n])?;
        let (ps, os) = (Span::of(&parts), Span::of(&out));
        dev.gemm_tree(
            s,
            (&w).into(),
            &a16,
            rows,
            chunks,
            &ps,
            &os,
            Some(GemmTile::Mma { rows: 64 }),
        )?;
        let reference = dev.download(s, &out)?;
        for tile in GemmTile::all(dtype, dev.arch()).into_iter().skip(1) {
            let parts = dev.upload(s, &vec![f32::NAN; chunks * rows * n])?;
            let out = dev.upload(s, &vec![f32::NAN; rows * n])?;
            dev.gemm_tree(
                s,
                (&w).into(),
                &a16,
                rows,
                chunks,
                &Span::of(&parts),
                &Span::of(&out),
                Some(tile),
            )?;
            cx.report.exact(
                &format!("gemm_{dtype}"),
                format!("tree in {tile:?} = chunks of Mma {{ rows: 64 }} + tree_sum, {rows}x{k} by {n} chunks={chunks}"),
                bit_mismatches(&dev.download(s, &out)?, &reference),
            );
        }
    }
    Ok(())
}

/// Products of one input sharing launches (`gemm_many`: three weights in one, a fourth in
/// the next) give each output the bits of its own launch.
fn gemm_shared_launch(cx: &mut Ctx, dtype: GgmlType) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (rows, k) = (150, 512);
    let a16 = narrowed(dev, s, &random(&mut cx.rng, rows * k, 1.0))?;
    let mut weights = Vec::new();
    for n in [384, 130, 130, 200] {
        let (bytes, _) = random_weight(&mut cx.rng, dtype, n, k)?;
        weights.push(DeviceWeight::upload(dev, s, dtype, &bytes, n, k)?);
    }
    let mut alone = Vec::new();
    for w in &weights {
        let mut yd = dev.upload(s, &vec![f32::NAN; rows * w.rows])?;
        dev.gemm(s, w.into(), &a16, rows, 1, &mut yd, None)?;
        alone.extend(dev.download(s, &yd)?);
    }
    let outs = weights
        .iter()
        .map(|w| dev.upload(s, &vec![f32::NAN; rows * w.rows]))
        .collect::<Result<Vec<_>>>()?;
    let spans: Vec<Span<f32>> = outs.iter().map(Span::of).collect();
    let products: Vec<_> = weights
        .iter()
        .zip(&spans)
        .map(|(w, y)| (w.into(), y))
        .collect();
    dev.gemm_many(s, &products, &a16, rows)?;
    let mut together = Vec::new();
    for y in &outs {
        together.extend(dev.download(s, y)?);
    }
    cx.report.exact(
        &format!("gemm_{dtype}"),
        format!("4 weights sharing launches = alone, {rows}x{k}"),
        bit_mismatches(&together, &alone),
    );
    Ok(())
}

/// A grouped launch (`gemm_grouped`: two stacks' matrices, groups of 70, 0, 3, 130 and 1
/// rows) gives each group's rows the bits of that group's product alone.
fn gemm_groups(cx: &mut Ctx, dtype: GgmlType) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (n, k) = (200, 512);
    let sizes = [70usize, 0, 3, 130, 1];
    let rows: usize = sizes.iter().sum();
    let mut stacks = Vec::new();
    for _ in 0..2 {
        let mut data = Vec::new();
        for _ in &sizes {
            data.extend(random_weight(&mut cx.rng, dtype, n, k)?.0);
        }
        let st = Stack {
            dtype,
            data,
            first: 0,
            count: sizes.len(),
            rows: n,
            cols: k,
        };
        stacks.push(DeviceStack::upload(dev, s, &st)?);
    }
    let a16 = narrowed(dev, s, &random(&mut cx.rng, rows * k, 1.0))?;
    let (mut alone, mut spans, mut first) = (Vec::new(), Vec::new(), 0);
    for st in &stacks {
        let mut at = 0;
        for (g, &m) in sizes.iter().enumerate() {
            if m > 0 {
                let a = Span::of(&a16).sub(at * k, m * k);
                let mut yd = dev.upload(s, &vec![f32::NAN; m * n])?;
                dev.gemm(s, st.matrix(g), &a, m, 1, &mut yd, None)?;
                alone.extend(dev.download(s, &yd)?);
            }
            at += m;
        }
    }
    for &m in &sizes {
        spans.extend([first as i32, m as i32]);
        first += m;
    }
    let spans = dev.upload(s, &spans)?;
    let groups = Groups {
        spans: Span::of(&spans),
        count: sizes.len(),
        stride: stacks[0].stride,
        most_rows: 130,
    };
    let outs = [
        dev.upload(s, &vec![f32::NAN; rows * n])?,
        dev.upload(s, &vec![f32::NAN; rows * n])?,
    ];
    let ys = [Span::of(&outs[0]), Span::of(&outs[1])];
    let products = [(stacks[0].matrix(0), &ys[0]), (stacks[1].matrix(0), &ys[1])];
    dev.gemm_grouped(s, &products, &Span::of(&a16), rows, &groups)?;
    let mut grouped = dev.download(s, &outs[0])?;
    grouped.extend(dev.download(s, &outs[1])?);
    cx.report.exact(
        &format!("gemm_{dtype}"),
        format!("grouped = each group alone, groups of {sizes:?} rows, {k} by {n}, two stacks"),
        bit_mismatches(&grouped, &alone),
    );
    Ok(())
}

/// A prefill step's attention over `rows` token rows from position `p0` against decode steps
/// at the same positions: outputs, rotated q and cache, bit for bit.
fn attention_rows(
    cx: &mut Ctx,
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    p0: usize,
    rows: usize,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (cap, row, qrow) = (p0 + rows + 3, n_kv * hd, n_heads * hd);
    let rope = (10000.0, RopeStyle::Neox);
    let total = p0 + rows;
    let q = random(&mut cx.rng, total * qrow, 1.0);
    let k = random(&mut cx.rng, total * row, 2.0);
    let v = random(&mut cx.rng, total * row, 1.0);
    let (no_parts, parts) = (
        dev.alloc::<f32>(s, 0)?,
        dev.alloc::<f32>(s, attention_parts_len(1, n_heads, hd, cap))?,
    );
    // decode: one step per position
    let mut kv_a = DeviceKv::new(dev, s, n_kv, hd, cap, 1)?;
    let mut kv_b = DeviceKv::new(dev, s, n_kv, hd, cap, 1)?;
    let mut want = Vec::new();
    let mut pd = dev.alloc::<u32>(s, 1)?;
    for p in 0..total {
        dev.write(s, &[p as u32], &mut pd)?;
        let mut qd = dev.upload(s, &q[p * qrow..(p + 1) * qrow])?;
        let kd = dev.upload(s, &k[p * row..(p + 1) * row])?;
        let vd = dev.upload(s, &v[p * row..(p + 1) * row])?;
        let mut out = dev.alloc::<f32>(s, qrow)?;
        for (kv, keep) in [(&mut kv_a, true), (&mut kv_b, false)] {
            if !keep && p >= p0 {
                continue;
            }
            let mut qc = dev.upload(s, &q[p * qrow..(p + 1) * qrow])?;
            attend(
                (dev, s),
                &mut qc,
                (&kd, &vd),
                kv,
                &pd,
                rope,
                &parts,
                &mut out,
                None,
            )?;
            if keep {
                qd = qc;
            }
        }
        if p >= p0 {
            want.extend(dev.download(s, &out)?);
            want.extend(dev.download(s, &qd)?);
        }
    }
    // prefill: the rows from p0 in one step
    dev.write(s, &[p0 as u32], &mut pd)?;
    let mut qd = dev.upload(s, &q[p0 * qrow..])?;
    let kd = dev.upload(s, &k[p0 * row..])?;
    let vd = dev.upload(s, &v[p0 * row..])?;
    let mut out = dev.alloc::<f32>(s, rows * qrow)?;
    dev.kv_store_rows(s, &kd, &vd, &mut kv_b, &pd, None, rope)?;
    attend(
        (dev, s),
        &mut qd,
        (&kd, &vd),
        &mut kv_b,
        &pd,
        rope,
        &no_parts,
        &mut out,
        None,
    )?;
    let (o, qr) = (dev.download(s, &out)?, dev.download(s, &qd)?);
    let got: Vec<f32> = (0..rows)
        .flat_map(|r| {
            o[r * qrow..(r + 1) * qrow]
                .iter()
                .chain(&qr[r * qrow..(r + 1) * qrow])
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    let cache = |kv: &DeviceKv| -> Result<Vec<u16>> {
        let mut c = dev.download(s, &kv.k)?;
        c.extend(dev.download(s, &kv.v)?);
        Ok(c)
    };
    let (ca, cb) = (cache(&kv_a)?, cache(&kv_b)?);
    let cache_diff = ca.iter().zip(&cb).filter(|(a, b)| a != b).count();
    cx.report.exact(
        "attention_f16",
        format!("{rows} prefill rows from {p0} = decode, h={n_heads} kv={n_kv} hd={hd}"),
        bit_mismatches(&got, &want) + cache_diff,
    );
    Ok(())
}
