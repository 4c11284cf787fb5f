//! The kernels of a batched decode step, bit for bit against the one-row decode: the matvec
//! over several activation rows (every dtype, every form a step uses: q/k/v in one launch, the
//! residual add, SwiGLU; batches below, at and above a tile, with a partial last tile) against
//! a launch per row, and for q4_0 and q4_1 the same forms on tensor cores (`matvec_mma`); the
//! rows' quantization with its RMS norm in the launch against the two launches; and
//! attention over rows of different sequence slots and positions (two
//! consecutive rows of one slot among them, as a joining prompt's chunk, and two pad rows in
//! front, as a padded decode step's) against each row's decode attention over a one-slot
//! cache holding that slot's rows, outputs and caches (a pad row's output is zeros).

use anyhow::Result;
use memra_gguf::GgmlType;

use super::{attend, bit_mismatches, random, random_weight, Ctx, DTYPES};
use crate::cuda::matvec::{Epilogue, Norm};
use crate::cuda::matvec_mma::{has_mma, quantized_bytes, MmaTile};
use crate::cuda::ops::{attention_parts_len, ATTN_SPLIT_ROWS, PAD_SLOT};
use crate::cuda::{DeviceKv, DeviceWeight, RopeStyle, Span};

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    for &dtype in DTYPES {
        // the last three give the tensor-core products (q4_0, q4_1) chunks of 32, 48 and 40
        // blocks: whole and partial steps of sixteen blocks
        for (batch, k, chunks) in [
            (2, 512, 2),
            (8, 256, 1),
            (13, 2048, 8),
            (64, 512, 2),
            (5, 4096, 4),
            (70, 1536, 1),
            (3, 2560, 2),
        ] {
            matvec_rows(cx, dtype, batch, k, chunks)?;
        }
        if has_mma(dtype, 1024) {
            // 32 chunks of one block: the chunk tree's deepest stack
            matvec_rows(cx, dtype, 20, 1024, 32)?;
            // chunks of 9 blocks (the second starting on an odd block: q4_0's scale words)
            // and of 18 (a step of 16 blocks, then a partial one)
            matvec_rows(cx, dtype, 9, 576, 2)?;
            matvec_rows(cx, dtype, 17, 576, 1)?;
            // K in four parts of chunks of 9 blocks, over 6 rows and over 12
            matvec_rows(cx, dtype, 6, 1152, 4)?;
            matvec_rows(cx, dtype, 12, 1152, 4)?;
            // chunks of 16 blocks (one step per group; 8 chunks as llama's 4096 columns), over
            // partial tiles
            matvec_rows(cx, dtype, 37, 4096, 8)?;
            matvec_rows(cx, dtype, 11, 2048, 4)?;
            // chunks of 56 blocks, as llama's 14336 columns in 8 chunks: groups of 4 and of 3
            // steps
            matvec_rows(cx, dtype, 19, 3584, 2)?;
            matvec_rows(cx, dtype, 6, 14336, 8)?;
        }
    }
    for (rows, cols) in [(5, 4096), (3, 576), (64, 14336)] {
        normed_quantize(cx, rows, cols)?;
    }
    attention_slots(cx)?;
    Ok(())
}

/// `quantize_rows` with a norm against `rms_norm` then `quantize_rows`: the quantized rows
/// and the normalized ones, bit for bit.
fn normed_quantize(cx: &mut Ctx, rows: usize, cols: usize) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let x = dev.upload(s, &random(&mut cx.rng, rows * cols, 3.0))?;
    let weight = dev.upload(s, &random(&mut cx.rng, cols, 1.0))?;
    let norm = Norm {
        weight: &weight,
        eps: 1e-5,
    };
    let (xs, bytes) = (Span::of(&x), quantized_bytes(rows, cols));
    let (mut want_xn, want_q) = (
        dev.alloc::<f32>(s, rows * cols)?,
        dev.alloc::<u8>(s, bytes)?,
    );
    dev.rms_norm(s, &x, &weight, norm.eps, &mut want_xn)?;
    dev.quantize_rows(s, &Span::of(&want_xn), cols, &Span::of(&want_q), None)?;
    let (got_xn, got_q) = (
        dev.alloc::<f32>(s, rows * cols)?,
        dev.alloc::<u8>(s, bytes)?,
    );
    let xn = Span::of(&got_xn);
    dev.quantize_rows(s, &xs, cols, &Span::of(&got_q), Some((norm, &xn)))?;
    let (q1, q2) = (dev.download(s, &got_q)?, dev.download(s, &want_q)?);
    let quant_diff = q1.iter().zip(&q2).filter(|(a, b)| a != b).count();
    cx.report.exact(
        "quantize_rows_q8",
        format!("{rows} rows of {cols} normed in the launch == rms_norm, then quantize_rows"),
        bit_mismatches(&dev.download(s, &got_xn)?, &dev.download(s, &want_xn)?) + quant_diff,
    );
    Ok(())
}

fn upload_weight(cx: &mut Ctx, dtype: GgmlType, rows: usize, cols: usize) -> Result<DeviceWeight> {
    let (bytes, _) = random_weight(&mut cx.rng, dtype, rows, cols)?;
    DeviceWeight::upload(cx.dev, cx.s, dtype, &bytes, rows, cols)
}

/// `batch` rows through q/k/v-like weights in one launch, a residual launch and a SwiGLU
/// launch, against the same launches on each row alone.
fn matvec_rows(cx: &mut Ctx, dtype: GgmlType, batch: usize, k: usize, chunks: usize) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let shapes = [131, 64, 36];
    let ws: Vec<DeviceWeight> = shapes
        .iter()
        .map(|&n| upload_weight(cx, dtype, n, k))
        .collect::<Result<_>>()?;
    let up = upload_weight(cx, dtype, shapes[0], k)?;
    let x = dev.upload(s, &random(&mut cx.rng, batch * k, 2.0))?;
    let residual = dev.upload(s, &random(&mut cx.rng, batch * shapes[0], 1.0))?;
    let xs = Span::of(&x);
    let refs: Vec<&DeviceWeight> = ws.iter().collect();
    let mut mismatches = [0usize; 3];
    let outs = |n: usize| -> Result<_> { dev.alloc::<f32>(s, batch * n) };
    let many: Vec<_> = shapes.iter().map(|&n| outs(n)).collect::<Result<_>>()?;
    let many_spans: Vec<Span<f32>> = many.iter().map(Span::of).collect();
    dev.matvec_many(s, &refs, &xs, None, chunks, &many_spans)?;
    let mut res = outs(shapes[0])?;
    dev.matvec_residual(s, &ws[0], &xs, chunks, &residual, &mut res)?;
    let mut glu = outs(shapes[0])?;
    dev.matvec_swiglu(s, &ws[0], &up, &xs, None, chunks, None, &mut glu)?;
    let (want_many, want_res, want_glu) = {
        let many1: Vec<_> = shapes.iter().map(|&n| outs(n)).collect::<Result<_>>()?;
        let many1_spans: Vec<Span<f32>> = many1.iter().map(Span::of).collect();
        let (res1_buf, glu1_buf) = (outs(shapes[0])?, outs(shapes[0])?);
        let (res1, glu1) = (Span::of(&res1_buf), Span::of(&glu1_buf));
        let res_in = Span::of(&residual);
        for r in 0..batch {
            let xr = xs.sub(r * k, k);
            let ys: Vec<Span<f32>> = many1_spans
                .iter()
                .zip(shapes)
                .map(|(y, n)| y.sub(r * n, n))
                .collect();
            dev.matvec_many(s, &refs, &xr, None, chunks, &ys)?;
            let n = shapes[0];
            dev.matvec_residual(
                s,
                &ws[0],
                &xr,
                chunks,
                &res_in.sub(r * n, n),
                &mut res1.sub(r * n, n),
            )?;
            dev.matvec_swiglu(
                s,
                &ws[0],
                &up,
                &xr,
                None,
                chunks,
                None,
                &mut glu1.sub(r * n, n),
            )?;
        }
        let mut m = Vec::new();
        for y in &many1 {
            m.extend(dev.download(s, y)?);
        }
        (m, dev.download(s, &res1)?, dev.download(s, &glu1)?)
    };
    let mut got_many = Vec::new();
    for y in &many {
        got_many.extend(dev.download(s, y)?);
    }
    mismatches[0] = bit_mismatches(&got_many, &want_many);
    mismatches[1] = bit_mismatches(&dev.download(s, &res)?, &want_res);
    mismatches[2] = bit_mismatches(&dev.download(s, &glu)?, &want_glu);
    for (form, m) in ["q/k/v", "residual", "swiglu"].iter().zip(mismatches) {
        cx.report.exact(
            &format!("matvec_rows8_{}", dtype.name()),
            format!("{form} {batch} rows k={k} c={chunks} == per row"),
            m,
        );
    }
    if !has_mma(dtype, k) {
        return Ok(());
    }
    // the same three forms on tensor cores, over the rows quantized once, in every tile
    let xq_buf = dev.alloc::<u8>(s, quantized_bytes(batch, k))?;
    let xq = Span::of(&xq_buf);
    dev.quantize_rows(s, &xs, k, &xq, None)?;
    for tile in MmaTile::ALL.into_iter().filter(|t| t.fits(chunks)) {
        let many: Vec<_> = shapes.iter().map(|&n| outs(n)).collect::<Result<_>>()?;
        let ys: Vec<(u64, usize)> = many.iter().map(|y| (Span::of(y).addr(), y.len())).collect();
        let on = Some(tile);
        dev.matvec_mma(s, &refs, &xq, batch, chunks, &ys, Epilogue::Plain, on)?;
        let (res, glu) = (outs(shapes[0])?, outs(shapes[0])?);
        let (res_y, glu_y) = (
            (Span::of(&res).addr(), res.len()),
            (Span::of(&glu).addr(), glu.len()),
        );
        let into = Epilogue::Residual(Span::of(&residual).addr());
        dev.matvec_mma(s, &refs[..1], &xq, batch, chunks, &[res_y], into, on)?;
        let swiglu = Epilogue::SwiGlu { limit: None };
        dev.matvec_mma(
            s,
            &[&ws[0], &up],
            &xq,
            batch,
            chunks,
            &[glu_y; 2],
            swiglu,
            on,
        )?;
        let mut got_many = Vec::new();
        for y in &many {
            got_many.extend(dev.download(s, y)?);
        }
        let mismatches = [
            bit_mismatches(&got_many, &want_many),
            bit_mismatches(&dev.download(s, &res)?, &want_res),
            bit_mismatches(&dev.download(s, &glu)?, &want_glu),
        ];
        for (form, m) in ["q/k/v", "residual", "swiglu"].iter().zip(mismatches) {
            cx.report.exact(
                &format!("matvec_mma_{}", dtype.name()),
                format!("{form} {batch} rows k={k} c={chunks} {tile:?} tile == per row"),
                m,
            );
        }
    }
    Ok(())
}

/// Rows at (slot, position) of a cache of slots, attended together, against each row's decode
/// attention over a one-slot cache that holds its slot's rows before it; pad rows write no
/// slot's cache and give zeros. Two launches: 3 slots (two pad rows, a prompt chunk of two
/// rows in slot 1, decode rows elsewhere), whose rows split their chunks across blocks, and a
/// decode row in each of more slots than a split takes, whose rows walk them.
fn attention_slots(cx: &mut Ctx) -> Result<()> {
    // positions over several chunks of the canonical order: the few rows split each row's
    // chunks across blocks, the many walk them, and the one-slot calls split
    let few = [
        (PAD_SLOT, 0),
        (PAD_SLOT, 0),
        (2, 7),
        (0, 0),
        (1, 300),
        (1, 301),
        (0, 533),
    ];
    attention_slots_at(cx, &few)?;
    let n = 2 * ATTN_SPLIT_ROWS + 3;
    let many: Vec<(u32, u32)> = std::iter::once((PAD_SLOT, 0))
        .chain((0..n as u32).map(|slot| (slot, (97 * slot + 3) % 650)))
        .collect();
    anyhow::ensure!(
        many.len() > ATTN_SPLIT_ROWS,
        "selftest: {} rows take the split attention, not the walk",
        many.len()
    );
    attention_slots_at(cx, &many)
}

/// The heads, KV heads, head dimension and cache capacity of `attention_slots`' launches.
const SLOTS_HEADS: usize = 8;
const SLOTS_KV_HEADS: usize = 2;
const SLOTS_HEAD_DIM: usize = 64;
const SLOTS_CAPACITY: usize = 700;

fn attention_slots_at(cx: &mut Ctx, at: &[(u32, u32)]) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (n_heads, n_kv, hd, cap) = (SLOTS_HEADS, SLOTS_KV_HEADS, SLOTS_HEAD_DIM, SLOTS_CAPACITY);
    let (row, qrow) = (n_kv * hd, n_heads * hd);
    let rope = (10000.0, RopeStyle::Normal);
    let slots = at
        .iter()
        .filter(|a| a.0 != PAD_SLOT)
        .map(|a| a.0 as usize + 1)
        .max()
        .unwrap_or(0);
    let rows = at.len();
    let prefix: Vec<usize> = (0..slots)
        .map(|slot| {
            at.iter()
                .filter(|a| a.0 as usize == slot)
                .map(|a| a.1 as usize)
                .min()
                .unwrap_or(0)
        })
        .collect();
    // the slots' earlier rows, written as decode steps of each slot would have
    let mut kv = DeviceKv::new(dev, s, n_kv, hd, cap, slots)?;
    let mut singles = Vec::new();
    for (slot, &p0) in prefix.iter().enumerate() {
        let mut one = DeviceKv::new(dev, s, n_kv, hd, cap, 1)?;
        if p0 > 0 {
            let (k, v) = (
                random(&mut cx.rng, p0 * row, 2.0),
                random(&mut cx.rng, p0 * row, 1.0),
            );
            let (kd, vd) = (dev.upload(s, &k)?, dev.upload(s, &v)?);
            let pos: Vec<u32> = (0..p0 as u32).collect();
            let pd = dev.upload(s, &pos)?;
            let sd = dev.upload(s, &vec![slot as u32; p0])?;
            let (pos_span, slot_span) = (Span::of(&pd), Span::of(&sd));
            dev.kv_store_rows(s, &kd, &vd, &mut kv, &pos_span, Some(&slot_span), rope)?;
            let zero = dev.upload(s, &[0u32])?;
            dev.kv_store_rows(s, &kd, &vd, &mut one, &zero, None, rope)?;
        }
        singles.push(one);
    }
    let q = random(&mut cx.rng, rows * qrow, 1.0);
    let (k, v) = (
        random(&mut cx.rng, rows * row, 2.0),
        random(&mut cx.rng, rows * row, 1.0),
    );
    let (kd, vd) = (dev.upload(s, &k)?, dev.upload(s, &v)?);
    let pd = dev.upload(s, &at.iter().map(|a| a.1).collect::<Vec<_>>())?;
    let sd = dev.upload(s, &at.iter().map(|a| a.0).collect::<Vec<_>>())?;
    let (pos_span, slot_span) = (Span::of(&pd), Span::of(&sd));
    let mut qd = dev.upload(s, &q)?;
    let parts = dev.alloc::<f32>(s, attention_parts_len(rows, n_heads, hd, cap))?;
    let mut out = dev.alloc::<f32>(s, rows * qrow)?;
    let xq = dev.alloc::<u8>(s, quantized_bytes(rows, qrow))?;
    dev.kv_store_rows(s, &kd, &vd, &mut kv, &pos_span, Some(&slot_span), rope)?;
    dev.attention(
        s,
        &mut qd,
        &kd,
        &vd,
        &mut kv,
        &pos_span,
        Some(&slot_span),
        rope,
        &Span::of(&parts),
        &mut out,
        Some(&Span::of(&xq)),
        None,
    )?;
    let got = dev.download(s, &out)?;
    // the output's 8-bit copy, made in the launch, against quantize_rows of the output
    let xq_want = dev.alloc::<u8>(s, quantized_bytes(rows, qrow))?;
    dev.quantize_rows(s, &Span::of(&out), qrow, &Span::of(&xq_want), None)?;
    let (xq_got, xq_want) = (dev.download(s, &xq)?, dev.download(s, &xq_want)?);
    let xq_diff = xq_got.iter().zip(&xq_want).filter(|(a, b)| a != b).count();
    let mut want = Vec::new();
    for (r, &(slot, p)) in at.iter().enumerate() {
        if slot == PAD_SLOT {
            want.extend(vec![0.0f32; qrow]);
            continue;
        }
        let one = &mut singles[slot as usize];
        let mut q1 = dev.upload(s, &q[r * qrow..(r + 1) * qrow])?;
        let (k1, v1) = (
            dev.upload(s, &k[r * row..(r + 1) * row])?,
            dev.upload(s, &v[r * row..(r + 1) * row])?,
        );
        let p1 = dev.upload(s, &[p])?;
        let mut o1 = dev.alloc::<f32>(s, qrow)?;
        attend(
            (dev, s),
            &mut q1,
            (&k1, &v1),
            one,
            &p1,
            rope,
            &parts,
            &mut o1,
            None,
        )?;
        want.extend(dev.download(s, &o1)?);
    }
    // every slot's cache rows, batched against one at a time
    let (kb, vb) = (dev.download(s, &kv.k)?, dev.download(s, &kv.v)?);
    let per = cap * row;
    let mut cache_diff = 0;
    for (slot, one) in singles.iter().enumerate() {
        let (k1, v1) = (dev.download(s, &one.k)?, dev.download(s, &one.v)?);
        let base = slot * per;
        cache_diff += (0..per)
            .filter(|&i| kb[base + i] != k1[i] || vb[base + i] != v1[i])
            .count();
    }
    cx.report.exact(
        "attention_f16",
        format!(
            "{rows} rows of {slots} slots ({} pad rows, {}) == decode per slot, 8-bit copy == quantize_rows, h={n_heads} kv={n_kv} hd={hd}",
            rows - at.iter().filter(|a| a.0 != PAD_SLOT).count(),
            if rows > ATTN_SPLIT_ROWS { "walked" } else { "split" }
        ),
        bit_mismatches(&got, &want) + cache_diff + xq_diff,
    );
    Ok(())
}
