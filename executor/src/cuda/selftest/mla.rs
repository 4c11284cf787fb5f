//! MLA on the device against the CPU backend: the rope of the rope parts (plain and YaRN,
//! strided source and destination) against `rope_part`, and their unrotated copy (kimi-linear), the latent attention (cache write of
//! the current row, f16 cache, DeepSeek-sized and awkward shapes, a position past earlier
//! rows) against `latent_attention`, its sparse form over DSA cells (some pools out of order,
//! then the tail from the position down) against `latent_attention_at`, a prefill step's
//! rows (cache rows stored first, a grid row per token row) against decode steps, and rope plus
//! attention captured in a graph, replayed
//! against eager bit for bit with the position read from device memory.

use anyhow::Result;
use memra_compiler::plan::{mla_parts_len, YarnSummary};
use memra_gguf::f16::{f16_to_f32, f32_to_f16};

use super::{bit_mismatches, random, Ctx};
use crate::cpu::kernels::{
    latent_attention, latent_attention_at, rope_part, KvDtype, LatentCache, RopeStyle, Rotation,
};
use crate::cuda::dsa::Cells;
use crate::cuda::ops::PAD_SLOT;
use crate::cuda::{capture, Span};
use crate::rope::Yarn;

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    let yarn = YarnSummary {
        factor: 40.0,
        original_context: 4096,
        mscale_all_dim: 1.0,
    };
    // (vectors, rotated dims, source stride, destination stride, position, yarn)
    for (n, rot, ss, ds, pos, y) in [
        (1, 64, 576, 576, 0, true),
        (16, 64, 192, 576, 77, true),
        (4, 32, 96, 288, 255, false),
        (128, 64, 192, 576, 4000, true),
        (3, 16, 40, 80, 9, false),
    ] {
        let yarn = y.then(|| Yarn::of(&yarn, rot, 10000.0, true));
        rope(cx, (n, rot, ss, ds, pos), true, yarn)?;
    }
    // kimi-linear's MLA rotates nothing: the rope parts are copied bit for bit
    rope(cx, (4, 32, 96, 288, 37), false, None)?;
    // (heads, kv_lora, rope, position, capacity)
    for case in [
        (4, 256, 32, 0, 16),
        (3, 64, 16, 40, 64),
        (16, 512, 64, 300, 512),
        (128, 512, 64, 1023, 1024),
        (5, 96, 32, 7, 9),
    ] {
        attention(cx, case, false)?;
    }
    // glm5-next's nope MLA over the indexer's cells
    for case in [(4, 64, 0, 37, 64), (16, 512, 0, 300, 512)] {
        attention(cx, case, true)?;
    }
    heads_per_block(cx)?;
    // (heads, kv_lora, rope, first position, rows, capacity)
    for case in [
        (16, 512, 64, 0, 70, 256),
        (5, 96, 32, 130, 9, 160),
        (4, 256, 32, 3, 1, 16),
    ] {
        prefill_rows(cx, case)?;
    }
    graph(cx)?;
    Ok(())
}

/// A prefill step's latent attention (`mla_store_rows`, then `mla_attention` with a grid row
/// per token row, in launches of fewer rows than the step) against decode steps at the same
/// positions with the same queries: outputs and cache bit for bit.
fn prefill_rows(
    cx: &mut Ctx,
    (heads, kvl, rope, p0, rows, capacity): (usize, usize, usize, usize, usize, usize),
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let width = kvl + rope;
    let q = random(&mut cx.rng, rows * heads * width, 1.0);
    let cache_rows = random(&mut cx.rng, rows * width, 1.0);
    let earlier: Vec<u16> = random(&mut cx.rng, capacity * width, 1.0)
        .into_iter()
        .map(f32_to_f16)
        .collect();
    let parts = dev.alloc::<f32>(s, 2 * mla_parts_len(heads, kvl, capacity))?;
    let shape = (heads, kvl, width, capacity);
    let scale = 0.07;
    // decode: a step a row, each writing its row
    let cache = dev.upload(s, &earlier)?;
    let mut decoded = Vec::new();
    for r in 0..rows {
        let (qr, row) = (
            dev.upload(s, &q[r * heads * width..(r + 1) * heads * width])?,
            dev.upload(s, &cache_rows[r * width..(r + 1) * width])?,
        );
        let (out, pos) = (
            dev.alloc::<f32>(s, heads * kvl)?,
            dev.upload(s, &[(p0 + r) as u32])?,
        );
        let (qs, rs) = (Span::of(&qr), Span::of(&row));
        let (cs, os, ps) = (Span::of(&cache), Span::of(&out), Span::of(&pos));
        dev.mla_attention(
            s,
            &qs,
            Some(&rs),
            &cs,
            &os,
            &Span::of(&parts),
            (&ps, None),
            shape,
            scale,
            None,
        )?;
        decoded.extend(dev.download(s, &out)?);
    }
    let decoded_cache = dev.download(s, &cache)?;
    // prefill: the rows stored, then attention in launches of two rows
    let cache = dev.upload(s, &earlier)?;
    let (qd, rows_d) = (dev.upload(s, &q)?, dev.upload(s, &cache_rows)?);
    let positions: Vec<u32> = (0..rows).map(|r| (p0 + r) as u32).collect();
    let pos = dev.upload(s, &positions)?;
    let out = dev.alloc::<f32>(s, rows * heads * kvl)?;
    let (cs, ps) = (Span::of(&cache), Span::of(&pos));
    dev.mla_store_rows(s, &Span::of(&rows_d), &cs, (&ps, None), (width, capacity))?;
    for r0 in (0..rows).step_by(2) {
        let n = 2.min(rows - r0);
        let (qs, os) = (
            Span::of(&qd).sub(r0 * heads * width, n * heads * width),
            Span::of(&out).sub(r0 * heads * kvl, n * heads * kvl),
        );
        dev.mla_attention(
            s,
            &qs,
            None,
            &cs,
            &os,
            &Span::of(&parts),
            (&ps.sub(r0, n), None),
            shape,
            scale,
            None,
        )?;
    }
    let mut got = dev.download(s, &out)?;
    let mut want = decoded.clone();
    got.extend(dev.download(s, &cache)?.into_iter().map(f16_to_f32));
    want.extend(decoded_cache.iter().copied().map(f16_to_f32));
    cx.report.exact(
        "mla rows",
        format!(
            "{heads} heads, latent {kvl} + {rope}, rows {p0}..{} = decode steps",
            p0 + rows
        ),
        bit_mismatches(&got, &want),
    );
    // a batched step: the rows in sequence slot 2 of 3 behind a pad row, stored and attended
    // in one launch each; slots 0 and 1 keep what they held
    let others: Vec<u16> = random(&mut cx.rng, 2 * capacity * width, 1.0)
        .into_iter()
        .map(f32_to_f16)
        .collect();
    let slotted = dev.upload(s, &[&others[..], &earlier[..]].concat())?;
    let mut at: Vec<u32> = vec![0];
    at.extend(&positions);
    let in_slot: Vec<u32> = std::iter::once(PAD_SLOT)
        .chain(std::iter::repeat_n(2, rows))
        .collect();
    let (pos, slots) = (dev.upload(s, &at)?, dev.upload(s, &in_slot)?);
    let (ps, ss) = (Span::of(&pos), Span::of(&slots));
    let mut padded_q = random(&mut cx.rng, heads * width, 1.0);
    padded_q.extend(&q);
    let mut padded_rows = random(&mut cx.rng, width, 1.0);
    padded_rows.extend(&cache_rows);
    let (qd, rows_d) = (dev.upload(s, &padded_q)?, dev.upload(s, &padded_rows)?);
    let out = dev.alloc::<f32>(s, (rows + 1) * heads * kvl)?;
    let parts = dev.alloc::<f32>(s, (rows + 1) * mla_parts_len(heads, kvl, capacity))?;
    let cs = Span::of(&slotted);
    let slot_rows = (&ps, Some(&ss));
    dev.mla_store_rows(s, &Span::of(&rows_d), &cs, slot_rows, (width, capacity))?;
    dev.mla_attention(
        s,
        &Span::of(&qd),
        None,
        &cs,
        &Span::of(&out),
        &Span::of(&parts),
        slot_rows,
        shape,
        scale,
        None,
    )?;
    let mut got = dev.download(s, &out)?.split_off(heads * kvl);
    let mut want = decoded;
    got.extend(dev.download(s, &slotted)?.into_iter().map(f16_to_f32));
    want.extend(others.into_iter().chain(decoded_cache).map(f16_to_f32));
    cx.report.exact(
        "mla rows",
        format!(
            "{heads} heads, latent {kvl} + {rope}, rows {p0}..{} in slot 2 of 3 behind a pad row = decode steps",
            p0 + rows
        ),
        bit_mismatches(&got, &want),
    );
    Ok(())
}

/// A head's bits do not depend on the heads beside it in a block: of 32 heads (two tiles of
/// 16), the first 12 against 12 heads alone (a tile of 12 and 4 empty rows) and the last 16
/// against 16 alone (the first tile), as tensor-parallel ranks hold them.
fn heads_per_block(cx: &mut Ctx) -> Result<()> {
    let (kvl, rope, pos, capacity) = (512, 64, 700, 1024);
    let width = kvl + rope;
    let l = latent(cx, 32, width, pos);
    let mut halves = vec![0u16; capacity * width];
    for (h, &x) in halves.iter_mut().zip(l.rows[..pos].iter().flatten()) {
        *h = f32_to_f16(x);
    }
    let mut outs = Vec::new();
    for heads in [0..32, 0..12, 16..32] {
        let shape = (heads.len(), kvl, capacity);
        let q = &l.q[heads.start * width..heads.end * width];
        outs.push(on_device(cx, q, &l.rows[pos], &halves, pos, shape, l.scale, None)?.0);
    }
    cx.report.exact(
        "mla attention",
        format!("heads 0..12 and 16..32 of 32 == alone, pos {pos}"),
        bit_mismatches(&outs[0][..12 * kvl], &outs[1])
            + bit_mismatches(&outs[0][16 * kvl..], &outs[2]),
    );
    Ok(())
}

fn rope(
    cx: &mut Ctx,
    (n, rot, ss, ds, pos): (usize, usize, usize, usize, u32),
    rotate: bool,
    yarn: Option<Yarn>,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let theta = 10000.0f32;
    let src = random(&mut cx.rng, n * ss, 1.0);
    let mut want = src.clone();
    let r = Rotation {
        theta,
        style: RopeStyle::Normal,
        yarn,
    };
    if rotate {
        rope_part(&mut want, ss, 0..rot, pos as usize, &r);
    }
    let d_src = dev.upload(s, &src)?;
    let d_dst = dev.alloc::<f32>(s, n * ds)?;
    let d_pos = dev.upload(s, &[pos])?;
    let theta_scale = theta.powf(-2.0 / rot as f32);
    dev.mla_rope(
        s,
        (&Span::of(&d_src), ss),
        (&Span::of(&d_dst), ds),
        n,
        rot,
        (&Span::of(&d_pos), n),
        rotate.then_some((theta_scale, 0, yarn)),
    )?;
    let got = dev.download(s, &d_dst)?;
    let mut err = 0f64;
    for v in 0..n {
        for j in 0..rot {
            let (g, w) = (got[v * ds + j], want[v * ss + j]);
            err = err.max(f64::from((g - w).abs()));
        }
    }
    let case = |kind: &str| format!("{n}x{rot} pos {pos} {kind}");
    if !rotate {
        cx.report
            .tol("mla rope", case("unrotated copy"), err, 0.0, "abs");
    } else {
        let kind = if yarn.is_some() { "yarn" } else { "plain" };
        cx.report.tol("mla rope", case(kind), err, 2e-5, "abs");
    }
    Ok(())
}

/// A latent cache state on host and device: rows `0..pos` in the cache, row `pos` given.
struct Latent {
    rows: Vec<Vec<f32>>,
    q: Vec<f32>,
    scale: f32,
}

fn latent(cx: &mut Ctx, heads: usize, width: usize, pos: usize) -> Latent {
    Latent {
        rows: (0..=pos).map(|_| random(&mut cx.rng, width, 1.0)).collect(),
        q: random(&mut cx.rng, heads * width, 1.0),
        scale: 1.0 / ((width - 64).max(32) as f32).sqrt(),
    }
}

/// DSA-like cells of position `pos`: every third pool of 4 from the last complete one down,
/// then the incomplete pool's tokens from `pos` down.
fn cells_of(pos: usize) -> Vec<usize> {
    let complete = (pos + 1) / 4;
    let mut cells: Vec<usize> = (0..complete)
        .rev()
        .step_by(3)
        .flat_map(|j| 4 * j..4 * j + 4)
        .collect();
    cells.extend((0..(pos + 1) % 4).map(|k| pos - k));
    cells
}

fn attention(
    cx: &mut Ctx,
    (heads, kvl, rope, pos, capacity): (usize, usize, usize, usize, usize),
    sparse: bool,
) -> Result<()> {
    let width = kvl + rope;
    let l = latent(cx, heads, width, pos);
    let mut cache = LatentCache::new(KvDtype::F16, kvl, rope, capacity);
    let mut halves = vec![0u16; capacity * width];
    for (p, r) in l.rows.iter().enumerate() {
        cache.write(p, r);
        if p < pos {
            for (h, &x) in halves[p * width..].iter_mut().zip(r) {
                *h = f32_to_f16(x);
            }
        }
    }
    let mut want = vec![0f32; heads * kvl];
    let cells = sparse.then(|| cells_of(pos));
    match &cells {
        Some(c) => latent_attention_at(&l.q, &cache, heads, c, l.scale, &mut want),
        None => latent_attention(&l.q, &cache, heads, pos + 1, l.scale, &mut want),
    }
    let mut cell_ints = vec![0i32; capacity + 1];
    if let Some(c) = &cells {
        cell_ints[0] = c.len() as i32;
        for (d, &p) in cell_ints[1..].iter_mut().zip(c) {
            *d = p as i32;
        }
    }
    let cells = sparse.then_some(&cell_ints[..]);
    let shape = (heads, kvl, capacity);
    let (got, written) = on_device(cx, &l.q, &l.rows[pos], &halves, pos, shape, l.scale, cells)?;
    let err = got
        .iter()
        .zip(&want)
        .map(|(g, w)| f64::from((g - w).abs()) / (1.0 + f64::from(w.abs())))
        .fold(0.0, f64::max);
    let case = match &cells {
        Some(c) => format!(
            "{heads}h {kvl}+{rope} pos {pos} of {capacity}, {} dsa cells",
            c.len()
        ),
        None => format!("{heads}h {kvl}+{rope} pos {pos} of {capacity}"),
    };
    // both narrow the weights to f16, the CPU (as llama.cpp does) against the row's max, the
    // kernel against each chunk's: up to 2^-11 of the weighted values apart
    cx.report
        .tol("mla attention", case.clone(), err, 1e-3, "rel");
    let slot: Vec<f32> = written[pos * width..(pos + 1) * width]
        .iter()
        .map(|&h| f16_to_f32(h))
        .collect();
    let narrowed: Vec<f32> = l.rows[pos]
        .iter()
        .map(|&x| f16_to_f32(f32_to_f16(x)))
        .collect();
    cx.report
        .exact("mla cache write", case, bit_mismatches(&slot, &narrowed));
    Ok(())
}

/// `mla_attention` of the host queries `q` over the f16 cache `halves` at `pos`, the current
/// position's row `row`, over DSA's `cells` (count, then positions) when given: the output
/// and the cache after the launch.
#[allow(clippy::too_many_arguments)]
fn on_device(
    cx: &Ctx,
    q: &[f32],
    row: &[f32],
    halves: &[u16],
    pos: usize,
    (heads, kvl, capacity): (usize, usize, usize),
    scale: f32,
    cells: Option<&[i32]>,
) -> Result<(Vec<f32>, Vec<u16>)> {
    let (dev, s) = (cx.dev, cx.s);
    let (q, row, cache) = (
        dev.upload(s, q)?,
        dev.upload(s, row)?,
        dev.upload(s, halves)?,
    );
    let out = dev.alloc::<f32>(s, heads * kvl)?;
    let parts = dev.alloc::<f32>(s, mla_parts_len(heads, kvl, capacity))?;
    let pos = dev.upload(s, &[pos as u32])?;
    let cells = cells.map(|c| dev.upload(s, c)).transpose()?;
    dev.mla_attention(
        s,
        &Span::of(&q),
        Some(&Span::of(&row)),
        &Span::of(&cache),
        &Span::of(&out),
        &Span::of(&parts),
        (&Span::of(&pos), None),
        (heads, kvl, row.len(), capacity),
        scale,
        cells
            .as_ref()
            .map(|c| Cells {
                span: Span::of(c),
                stride: c.len(),
            })
            .as_ref(),
    )?;
    Ok((dev.download(s, &out)?, dev.download(s, &cache)?))
}

fn graph(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (heads, kvl, rope, nope, capacity) = (8, 256, 32, 64, 16);
    let width = kvl + rope;
    let head_q = nope + rope;
    let q = dev.upload(s, &random(&mut cx.rng, heads * head_q, 1.0))?;
    let q_lat = dev.upload(s, &random(&mut cx.rng, heads * width, 1.0))?;
    let row = dev.upload(s, &random(&mut cx.rng, width, 1.0))?;
    let out = dev.alloc::<f32>(s, heads * kvl)?;
    let parts = dev.alloc::<f32>(s, mla_parts_len(heads, kvl, capacity))?;
    let mut pos = dev.alloc::<u32>(s, 1)?;
    let yarn = YarnSummary {
        factor: 40.0,
        original_context: 4096,
        mscale_all_dim: 1.0,
    };
    let yarn = Some(Yarn::of(&yarn, rope, 10000.0, true));
    let theta_scale = 10000f32.powf(-2.0 / rope as f32);
    let steps = 6u32;
    let pos_at = Span::of(&pos);
    let run = |cache: &Span<u16>| -> Result<()> {
        let q = Span::of(&q);
        let q_lat = Span::of(&q_lat);
        dev.mla_rope(
            s,
            (&q.sub(nope, heads * head_q - nope), head_q),
            (&q_lat.sub(kvl, heads * width - kvl), width),
            heads,
            rope,
            (&pos_at, heads),
            Some((theta_scale, 0, yarn)),
        )?;
        dev.mla_attention(
            s,
            &q_lat,
            Some(&Span::of(&row)),
            cache,
            &Span::of(&out),
            &Span::of(&parts),
            (&pos_at, None),
            (heads, kvl, width, capacity),
            0.1,
            None,
        )
    };
    let cache_a = dev.alloc::<u16>(s, capacity * width)?;
    let mut eager = Vec::new();
    for t in 0..steps {
        dev.write(s, &[t], &mut pos)?;
        run(&Span::of(&cache_a))?;
        eager.extend(dev.download(s, &out)?);
    }
    let cache_b = dev.alloc::<u16>(s, capacity * width)?;
    let cb = Span::of(&cache_b);
    match capture(s, || run(&cb)) {
        Ok(g) => {
            let mut replayed = Vec::new();
            for t in 0..steps {
                dev.write(s, &[t], &mut pos)?;
                g.replay()?;
                replayed.extend(dev.download(s, &out)?);
            }
            cx.report.exact(
                "mla graph",
                format!("replay == eager, {steps} steps"),
                bit_mismatches(&replayed, &eager),
            );
        }
        Err(e) => {
            println!("mla graph capture failed: {e}");
            cx.report.exact("mla graph", "capture".to_string(), 1);
        }
    }
    Ok(())
}
