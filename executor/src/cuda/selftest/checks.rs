//! Per-op numerics: each kernel against a CPU reference at awkward sizes. Matvec errors are
//! relative to the row's sum of |w * x| (the scale of f32 rounding in a dot product), against
//! an f64 dot with the activations the kernel multiplies (x quantized as the CPU backend does
//! for quantized weights), elsewhere to the largest reference magnitude; embed and the cache's
//! v row must match the CPU bits exactly.

use anyhow::Result;
use memra_gguf::f16::{f16_to_f32, f32_to_f16};
use memra_gguf::GgmlType;

use super::{attend, bit_mismatches, random, random_weight, Ctx, DTYPES};
use crate::cpu::kernels::reference::{effective_x, matvec_row};
use crate::cuda::ops::{attention_parts_len, AttentionForm, ATTN_CHUNK, ATTN_SPLIT_ROWS};
use crate::cuda::{DeviceKv, DeviceWeight, RopeStyle, Span};

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    for &dtype in DTYPES {
        for (rows, cols, chunks) in matvec_cases(dtype) {
            matvec(cx, dtype, rows, cols, chunks)?;
        }
        embed(cx, dtype)?;
    }
    rms_norm(cx)?;
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for pos in [0, 37, 4000] {
            rope(cx, style, pos)?;
        }
    }
    // the last cases' capacities split each head's positions across blocks by chunk
    // (flash-decoding), over one chunk, three and five
    for (n_heads, n_kv, hd, cap, pos) in [
        (6, 2, 64, 50, 36),
        (4, 4, 128, 8, 0),
        (8, 1, 32, 300, 299),
        (2, 2, 96, 20, 11),
        (4, 2, 64, 9000, 40),
        (4, 1, 256, 600, 599),
        (8, 2, 128, 1200, 1100),
        // two head tiles of one KV head (16 + 8), heads of 8 values, heads not a multiple of 8
        (48, 2, 64, 600, 599),
        (32, 8, 8, 300, 299),
        (6, 2, 12, 40, 39),
    ] {
        attention(cx, n_heads, n_kv, hd, cap, pos)?;
    }
    attention_forms(cx)?;
    elementwise(cx)?;
    argmax(cx)?;
    rcp_rn(cx)?;
    Ok(())
}

/// The fast reciprocal (`rcp_rn`, kernels/common.cuh) against `__frcp_rn` on every 32-bit
/// pattern, in launches of 2^28 patterns.
fn rcp_rn(cx: &mut Ctx) -> Result<()> {
    let per_launch = 1u64 << 28;
    let mut wrong = 0;
    for k in 0..(1u64 << 32) / per_launch {
        wrong += cx
            .dev
            .rcp_rn_mismatches(cx.s, (k * per_launch) as u32, per_launch as u32)?;
    }
    cx.report.exact(
        "rcp_rn",
        "every float == __frcp_rn".to_string(),
        wrong as usize,
    );
    Ok(())
}

/// (rows, cols, chunks): rows not a multiple of the 4 rows per block, K with 1, 2, 8 and 32
/// chunks of odd block counts; the float types also get a chunk length that is not a multiple
/// of 8 (their scalar path).
pub(super) fn matvec_cases(dtype: GgmlType) -> Vec<(usize, usize, usize)> {
    let unit = dtype.block_size().max(8);
    let mut cases = vec![
        (37, unit * 7, 1),
        (131, 2 * unit * 5, 2),
        (5, 8 * unit * 3, 8),
        (66, 32 * unit, 32),
    ];
    if dtype.block_size() == 1 {
        cases.push((19, 8 * 13, 8));
    }
    cases
}

fn matvec(cx: &mut Ctx, dtype: GgmlType, rows: usize, cols: usize, chunks: usize) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (bytes, deq) = random_weight(&mut cx.rng, dtype, rows, cols)?;
    let x = random(&mut cx.rng, cols, 1.0);
    let w = DeviceWeight::upload(dev, s, dtype, &bytes, rows, cols)?;
    let xd = dev.upload(s, &x)?;
    // the kernels must reproduce the CPU backend's 8-bit activations: a different rounding of
    // one quant shows as an error near 1e-4
    let xe = effective_x(dtype, &x);
    let mut yd = dev.upload(s, &vec![f32::NAN; rows])?;
    dev.matvec(s, &w, &xd, chunks, &mut yd)?;
    let y = dev.download(s, &yd)?;
    let rb = bytes.len() / rows;
    let mut err = 0f64;
    for (r, &got) in y.iter().enumerate() {
        let row = &deq[r * cols..(r + 1) * cols];
        let row_bytes = &bytes[r * rb..(r + 1) * rb];
        let (exact, scale) = matvec_row(dtype, row, row_bytes, &x, &xe);
        err = err.max((f64::from(got) - exact).abs() / scale.max(1e-30));
    }
    let err = if y.iter().any(|v| !v.is_finite()) {
        f64::NAN
    } else {
        err
    };
    cx.report.tol(
        &format!("matvec_{dtype}"),
        format!("{rows}x{cols} chunks={chunks}"),
        err,
        1e-5,
        "rel|wx|",
    );
    Ok(())
}

fn embed(cx: &mut Ctx, dtype: GgmlType) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (rows, cols) = (11, dtype.block_size().max(8) * 5);
    let (bytes, deq) = random_weight(&mut cx.rng, dtype, rows, cols)?;
    let table = DeviceWeight::upload(dev, s, dtype, &bytes, rows, cols)?;
    let mut token = dev.upload(s, &[7u32])?;
    let mut out = dev.upload(s, &vec![f32::NAN; cols])?;
    dev.embed(s, &table, &token, &mut out)?;
    let got = dev.download(s, &out)?;
    cx.report.exact(
        &format!("embed_{dtype}"),
        format!("row 7 of {rows}x{cols}"),
        bit_mismatches(&got, &deq[7 * cols..8 * cols]),
    );
    // a token outside the table must not read out of bounds: it writes NaNs
    dev.write(s, &[rows as u32], &mut token)?;
    dev.embed(s, &table, &token, &mut out)?;
    let got = dev.download(s, &out)?;
    cx.report.exact(
        &format!("embed_{dtype}"),
        "token out of range -> NaN".to_string(),
        got.iter().filter(|v| !v.is_nan()).count(),
    );
    Ok(())
}

fn rms_norm(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    for (rows, n) in [(1, 1000), (3, 4096), (7, 64)] {
        let x = random(&mut cx.rng, rows * n, 3.0);
        let w = random(&mut cx.rng, n, 1.0);
        let (xd, wd) = (dev.upload(s, &x)?, dev.upload(s, &w)?);
        let mut od = dev.alloc::<f32>(s, rows * n)?;
        let eps = 1e-5;
        dev.rms_norm(s, &xd, &wd, eps, &mut od)?;
        let got = dev.download(s, &od)?;
        let mut err = 0f64;
        for (xr, gr) in x.chunks(n).zip(got.chunks(n)) {
            // the CPU backend's formula: f64 sum of f32 squares, f32 scale
            let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
            let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
            for ((&v, &wv), &g) in xr.iter().zip(&w).zip(gr) {
                err = err.max(f64::from((g - v * scale * wv).abs()));
            }
        }
        cx.report.tol(
            "rms_norm_f32",
            format!("{rows} rows of {n}"),
            err,
            1e-6,
            "abs",
        );
    }
    Ok(())
}

/// The distance of `got` from `want` in f16 steps at `want`'s magnitude.
fn f16_steps(got: f32, want: f32) -> f64 {
    let w = f16_to_f32(f32_to_f16(want));
    let next = f16_to_f32(f32_to_f16(w.abs()).wrapping_add(1)) - w.abs();
    f64::from((got - want).abs() / next)
}

/// The rotary embedding and cache write of the attention launch: q rotated in place against
/// f64, the cache row against f16 of the f64-rotated k (within one f16 step: the f32 rotation
/// may round the other way), v narrowed bit for bit.
fn rope(cx: &mut Ctx, style: RopeStyle, pos: u32) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (n_heads, n_kv, hd, theta) = (6, 2, 64, 10000f32);
    let (n, row) = (n_heads * hd, n_kv * hd);
    let x = random(&mut cx.rng, n + row, 2.0);
    let v = random(&mut cx.rng, row, 2.0);
    let (mut qd, kd) = (dev.upload(s, &x[..n])?, dev.upload(s, &x[n..])?);
    let vd = dev.upload(s, &v)?;
    let cap = pos as usize + 1;
    let mut kv = DeviceKv::new(dev, s, n_kv, hd, cap, 1)?;
    let pd = dev.upload(s, &[pos])?;
    let parts = dev.alloc::<f32>(s, attention_parts_len(1, n_heads, hd, cap))?;
    let mut out = dev.alloc::<f32>(s, n)?;
    attend(
        (dev, s),
        &mut qd,
        (&kd, &vd),
        &mut kv,
        &pd,
        (theta, style),
        &parts,
        &mut out,
        None,
    )?;
    let half = hd / 2;
    let theta_scale = theta.powf(-2.0 / hd as f32);
    let mut want = x.clone();
    let mut angle = pos as f32;
    for i in 0..half {
        let (c, sn) = (f64::from(angle).cos(), f64::from(angle).sin());
        let (a, b) = if style == RopeStyle::Normal {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        for h in 0..n_heads + n_kv {
            let (x0, x1) = (f64::from(x[h * hd + a]), f64::from(x[h * hd + b]));
            want[h * hd + a] = (x0 * c - x1 * sn) as f32;
            want[h * hd + b] = (x0 * sn + x1 * c) as f32;
        }
        angle *= theta_scale;
    }
    let err = dev
        .download(s, &qd)?
        .iter()
        .zip(&want)
        .map(|(&g, &w)| f64::from((g - w).abs()))
        .fold(0f64, f64::max);
    let style_name = if style == RopeStyle::Normal {
        "normal"
    } else {
        "neox"
    };
    cx.report.tol(
        "attention_f16",
        format!("rope {style_name} q {n_heads}x{hd} pos={pos}"),
        err,
        2e-5,
        "abs",
    );
    let at = pos as usize * row..(pos as usize + 1) * row;
    let cached = |c: &[u16]| -> Vec<f32> { c[at.clone()].iter().map(|&h| f16_to_f32(h)).collect() };
    let k_steps = cached(&dev.download(s, &kv.k)?)
        .iter()
        .zip(&want[n..])
        .map(|(&g, &w)| f16_steps(g, w))
        .fold(0f64, f64::max);
    cx.report.tol(
        "attention_f16",
        format!("rope {style_name} cache k row {pos} {n_kv}x{hd} == f16(rotated k)"),
        k_steps,
        1.0,
        "f16 steps",
    );
    let narrow: Vec<f32> = v.iter().map(|&x| f16_to_f32(f32_to_f16(x))).collect();
    cx.report.exact(
        "attention_f16",
        format!("cache v row {pos} == f16(v)"),
        bit_mismatches(&cached(&dev.download(s, &kv.v)?), &narrow),
    );
    Ok(())
}

/// Attention over a cache written one position per launch, as decode writes it, against f64
/// with the rotated q and the cached k and v the device holds.
fn attention(
    cx: &mut Ctx,
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    cap: usize,
    pos: usize,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let row = n_kv * hd;
    let mut kv = DeviceKv::new(dev, s, n_kv, hd, cap, 1)?;
    let mut pd = dev.alloc::<u32>(s, 1)?;
    let parts = dev.alloc::<f32>(s, attention_parts_len(1, n_heads, hd, cap))?;
    let mut out = dev.upload(s, &vec![f32::NAN; n_heads * hd])?;
    let rope = (10000.0, RopeStyle::Normal);
    let mut qd = dev.alloc::<f32>(s, n_heads * hd)?;
    for p in 0..=pos {
        let (k, v) = (random(&mut cx.rng, row, 2.0), random(&mut cx.rng, row, 1.0));
        dev.write(s, &[p as u32], &mut pd)?;
        qd = dev.upload(s, &random(&mut cx.rng, n_heads * hd, 1.0))?;
        let (kd, vd) = (dev.upload(s, &k)?, dev.upload(s, &v)?);
        attend(
            (dev, s),
            &mut qd,
            (&kd, &vd),
            &mut kv,
            &pd,
            rope,
            &parts,
            &mut out,
            None,
        )?;
    }
    let got = dev.download(s, &out)?;
    // the last launch's rotated q, and the cache as the device holds it
    let q = dev.download(s, &qd)?;
    let widen = |c: Vec<u16>| -> Vec<f32> { c.iter().map(|&h| f16_to_f32(h)).collect() };
    let (ks, vs) = (
        widen(dev.download(s, &kv.k)?),
        widen(dev.download(s, &kv.v)?),
    );
    let scale = 1.0 / (hd as f64).sqrt();
    let group = n_heads / n_kv;
    // The kernel narrows q to the cache's f16, as the CPU backend does, and each chunk's
    // weights exp(s - the chunk's max) to f16 (the canonical order, kernels/attention.cu).
    let half = |x: f32| f64::from(f16_to_f32(f32_to_f16(x)));
    let mut err = 0f64;
    for h in 0..n_heads {
        let kvh = h / group;
        let at = |buf: &[f32], p: usize, d: usize| f64::from(buf[p * row + kvh * hd + d]);
        let sc: Vec<f64> = (0..=pos)
            .map(|p| {
                (0..hd)
                    .map(|d| half(q[h * hd + d]) * at(&ks, p, d))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let max = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        // each chunk's narrowed weights, rescaled to the row's max in f64
        let mut e = Vec::with_capacity(sc.len());
        for chunk in sc.chunks(ATTN_CHUNK) {
            let m = chunk.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            e.extend(
                chunk
                    .iter()
                    .map(|v| half((v - m).exp() as f32) * (m - max).exp()),
            );
        }
        let sum: f64 = e.iter().sum();
        for d in 0..hd {
            let want: f64 = (0..=pos).map(|p| e[p] / sum * at(&vs, p, d)).sum();
            err = err.max((f64::from(got[h * hd + d]) - want).abs());
        }
    }
    // a weight whose f32 exp lands on the other side of an f16 rounding step than f64's moves
    // by one f16 step (2^-11 of it): a few 1e-5 at the shortest contexts
    cx.report.tol(
        "attention_f16",
        format!("h={n_heads} kv={n_kv} hd={hd} ctx={} cap={cap}", pos + 1),
        err,
        5e-5,
        "abs",
    );
    Ok(())
}

fn elementwise(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let n = 1001;
    let (a, b) = (random(&mut cx.rng, n, 6.0), random(&mut cx.rng, n, 2.0));
    let (ad, bd) = (dev.upload(s, &a)?, dev.upload(s, &b)?);
    let mut od = dev.alloc::<f32>(s, n)?;
    dev.add(s, &ad, &bd, &mut od)?;
    let got = dev.download(s, &od)?;
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    cx.report
        .exact("add_f32", format!("n={n}"), bit_mismatches(&got, &want));
    Ok(())
}

fn argmax(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let n = 49_157;
    let mut x = random(&mut cx.rng, n, 10.0);
    x[1234] = 50.0;
    x[40_000] = 50.0; // a tie: the first index wins
    x[777] = f32::NAN; // never chosen
    let mut td = dev.alloc::<u32>(s, 1)?;
    dev.argmax(s, &dev.upload(s, &x)?, &mut td)?;
    let got = dev.download(s, &td)?[0];
    cx.report.exact(
        "argmax_f32",
        format!("n={n} tie + NaN (got {got}, want 1234)"),
        usize::from(got != 1234),
    );
    let all_neg_inf = vec![f32::NEG_INFINITY; 3000];
    dev.argmax(s, &dev.upload(s, &all_neg_inf)?, &mut td)?;
    let got = dev.download(s, &td)?[0];
    cx.report.exact(
        "argmax_f32",
        format!("all -inf (got {got}, want 0)"),
        usize::from(got != 0),
    );
    // a greedy batch's rows: the one with a NaN (beside a larger logit) and the one with an
    // infinity give NOT_FINITE, as sample::greedy does on the host; the others their argmax
    let mut rows = random(&mut cx.rng, 4 * 3000, 10.0);
    rows[3000 + 17] = f32::NAN;
    rows[3000 + 18] = 60.0;
    rows[2 * 3000 + 5] = f32::INFINITY;
    let want: Vec<u32> = rows.chunks_exact(3000).map(crate::sample::greedy).collect();
    let out = dev.alloc::<u32>(s, 4)?;
    dev.argmax_rows(s, &Span::of(&dev.upload(s, &rows)?), &Span::of(&out))?;
    let got = dev.download(s, &out)?;
    cx.report.exact(
        "argmax_f32",
        format!("4 rows, NaN and inf flagged (got {got:?}, want {want:?})"),
        usize::from(
            got != want
                || want[1] != crate::sample::NOT_FINITE
                || want[2] != crate::sample::NOT_FINITE,
        ),
    );
    Ok(())
}

/// Both forms of attention (a walk or a split) over the same cache, the same row and q: the
/// same output and rotated q, bit for bit.
fn attention_forms(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (n_heads, n_kv, hd, cap, pos) = (8, 2, 128, 1100, 1000usize);
    let row = n_kv * hd;
    let rope = (10000.0, RopeStyle::Normal);
    let mut kv = DeviceKv::new(dev, s, n_kv, hd, cap, 1)?;
    let (k, v) = (
        random(&mut cx.rng, pos * row, 2.0),
        random(&mut cx.rng, pos * row, 1.0),
    );
    let (kd, vd) = (dev.upload(s, &k)?, dev.upload(s, &v)?);
    dev.kv_store_rows(s, &kd, &vd, &mut kv, &dev.upload(s, &[0u32])?, None, rope)?;
    let q = random(&mut cx.rng, n_heads * hd, 1.0);
    let (k1, v1) = (
        dev.upload(s, &random(&mut cx.rng, row, 2.0))?,
        dev.upload(s, &random(&mut cx.rng, row, 1.0))?,
    );
    let pd = dev.upload(s, &[pos as u32])?;
    let parts = dev.alloc::<f32>(s, attention_parts_len(ATTN_SPLIT_ROWS, n_heads, hd, cap))?;
    // first a split of as many rows as a split takes, over the same scratch: the one-row
    // splits after it must find their arrival counters where it left them (zero)
    let many = ATTN_SPLIT_ROWS;
    let (km, vm) = (
        dev.upload(s, &random(&mut cx.rng, many * row, 2.0))?,
        dev.upload(s, &random(&mut cx.rng, many * row, 1.0))?,
    );
    let first = dev.upload(s, &[(pos - many) as u32])?;
    dev.kv_store_rows(s, &km, &vm, &mut kv, &first, None, rope)?;
    let mut qm = dev.upload(s, &random(&mut cx.rng, many * n_heads * hd, 1.0))?;
    let mut om = dev.alloc::<f32>(s, many * n_heads * hd)?;
    let split = AttentionForm::Split;
    let parts_span = Span::of(&parts);
    dev.attention(
        s,
        &mut qm,
        &km,
        &vm,
        &mut kv,
        &first,
        None,
        rope,
        &parts_span,
        &mut om,
        None,
        Some(split),
    )?;
    let mut results = Vec::new();
    for form in [AttentionForm::Walk, AttentionForm::Split] {
        let mut qd = dev.upload(s, &q)?;
        let mut out = dev.alloc::<f32>(s, n_heads * hd)?;
        attend(
            (dev, s),
            &mut qd,
            (&k1, &v1),
            &mut kv,
            &pd,
            rope,
            &parts,
            &mut out,
            Some(form),
        )?;
        let mut got = dev.download(s, &out)?;
        got.extend(dev.download(s, &qd)?);
        results.push((form, got));
    }
    for (form, got) in &results[1..] {
        cx.report.exact(
            "attention_f16",
            format!(
                "{form:?} == Walk: h={n_heads} kv={n_kv} hd={hd} ctx={}",
                pos + 1
            ),
            bit_mismatches(got, &results[0].1),
        );
    }
    Ok(())
}
