//! The MLA segments (`mla_pre`, `mla_core`) and DSA's selection (`dsa_select`) of the CPU
//! backend, over one or more token rows, each row computed as alone.

use anyhow::{anyhow, bail, Result};

use super::{full_k, gather, norm_rows, scatter, sized, stacked, view, Activations, Ctx};
use crate::cpu::kernels::{
    latent_attention, latent_attention_at, layer_norm, rms_norm, rope_part, IndexerCache,
    LatentCache, Selection,
};
use crate::cpu::layer::{MlaWeights, QueryPath};
use crate::engine::RowAt;

/// MLA: norm, query, latent and rope key, rope on the rope parts, and each head's no-rope
/// query absorbed into the latent space through its `attn_k_b` matrix; row `i` at position
/// its own position, each head's matrix read once for all rows.
pub(in crate::cpu) fn mla_pre(c: &Ctx, norm: &[f32], m: &MlaWeights, a: &mut Activations) {
    let t = a.rows.max(1);
    norm_rows(&a.x, norm, c.geo.eps, &mut a.xn);
    match &m.q {
        QueryPath::Direct(q) => full_k(c.pool, &view(q), &a.xn, sized(&mut a.q, t * q.rows)),
        QueryPath::LowRank { a: qa, norm, b } => {
            full_k(c.pool, &view(qa), &a.xn, sized(&mut a.k, t * qa.rows));
            norm_rows(&a.k, norm, c.geo.eps, &mut a.q_a);
            full_k(c.pool, &view(b), &a.q_a, sized(&mut a.q, t * b.rows));
        }
    }
    let (heads, kvl, nope) = (m.k_b.count, m.k_b.rows, m.k_b.cols);
    let width = m.kv_a.rows;
    full_k(c.pool, &view(&m.kv_a), &a.xn, sized(&mut a.v, t * width));
    let rows = sized(&mut a.kv_row, t * width);
    let q_width = a.q.len() / t;
    let head_q = q_width / heads;
    let r = c.rotation();
    for (i, ((row, v), q)) in rows
        .chunks_exact_mut(width)
        .zip(a.v.chunks_exact(width))
        .zip(a.q.chunks_exact_mut(q_width))
        .enumerate()
    {
        rms_norm(&v[..kvl], &m.kv_a_norm, c.geo.eps, &mut row[..kvl]);
        row[kvl..].copy_from_slice(&v[kvl..]);
        if m.rope {
            rope_part(row, width, kvl..width, c.at[i].pos, &r);
            rope_part(q, head_q, nope..head_q, c.at[i].pos, &r);
        }
    }
    let lat_width = heads * width;
    sized(&mut a.q_lat, t * lat_width);
    let (mut q_nope, mut absorbed) = (Vec::new(), Vec::new());
    for h in 0..heads {
        let k_b = stacked(&m.k_b, m.k_b.first + h).expect("invariant: a held head");
        let head = h * head_q;
        gather(&a.q, q_width, head..head + nope, &mut q_nope);
        full_k(c.pool, &k_b, &q_nope, sized(&mut absorbed, t * kvl));
        let out = h * width;
        scatter(&absorbed, &mut a.q_lat, lat_width, out..out + kvl);
        gather(&a.q, q_width, head + nope..head + head_q, &mut q_nope);
        scatter(&q_nope, &mut a.q_lat, lat_width, out + kvl..out + width);
    }
}

/// MLA: every row's latent row into its slot's cache, then each row's attention over its
/// slot's latent cache up to its own position (causal, rows spread over the pool's threads),
/// and each head's latent outputs mapped to its values through its `attn_v_b` matrix.
pub(in crate::cpu) fn mla_core(
    c: &Ctx,
    m: &MlaWeights,
    cache: &mut [LatentCache],
    kq_scale: f32,
    a: &mut Activations,
) {
    let t = a.rows.max(1);
    let width = a.kv_row.len() / t;
    for (row, at) in a.kv_row.chunks_exact(width).zip(c.at) {
        cache[at.slot].write(at.pos, row);
    }
    let (heads, kvl) = (m.v_b.count, m.v_b.cols);
    let lat_row = heads * kvl;
    let lat = sized(&mut a.lat, t * lat_row);
    let (q_lat, cache, at) = (&a.q_lat, &*cache, c.at);
    let q_row = q_lat.len() / t;
    // DSA attends to the selection of the row (its indexer's or the one it shares), MLA to
    // every position up to its own
    let cells = m
        .sparse
        .then_some((a.cells.as_slice(), a.cell_ends.as_slice()));
    c.pool.split_mut(lat, lat_row, &|off, piece| {
        let first = off / lat_row;
        for (i, out) in piece.chunks_exact_mut(lat_row).enumerate() {
            let row = first + i;
            let q = &q_lat[row * q_row..(row + 1) * q_row];
            let RowAt { slot, pos } = at[row];
            match cells {
                Some((cells, ends)) => {
                    let start = if row == 0 { 0 } else { ends[row - 1] };
                    let cells = &cells[start..ends[row]];
                    latent_attention_at(q, &cache[slot], heads, cells, kq_scale, out)
                }
                None => latent_attention(q, &cache[slot], heads, pos + 1, kq_scale, out),
            }
        }
    });
    let v = m.v_b.rows;
    let att_row = heads * v;
    sized(&mut a.att, t * att_row);
    let (mut l, mut o) = (Vec::new(), Vec::new());
    for h in 0..heads {
        let v_b = stacked(&m.v_b, m.v_b.first + h).expect("invariant: a held head");
        gather(&a.lat, lat_row, h * kvl..(h + 1) * kvl, &mut l);
        full_k(c.pool, &v_b, &l, sized(&mut o, t * v));
        scatter(&o, &mut a.att, att_row, h * v..(h + 1) * v);
    }
}

/// DSA, each row in turn: its indexer key (layer-normed) and pool gate into its slot's
/// indexer cache (pooling a completed pool), then the cells its MLA softmax runs over, chosen
/// from its indexer queries (from MLA's q-LoRA activations) and head weights over the pools
/// complete at its position: a row sees the rows before it, as it would decoding alone. The
/// products run over every row at once. Runs after `mla_pre` (its normed input and q-LoRA
/// activations).
pub(in crate::cpu) fn dsa_select(
    c: &Ctx,
    m: &MlaWeights,
    caches: &mut [IndexerCache],
    (how, norm_eps): (&Selection, f32),
    a: &mut Activations,
) -> Result<()> {
    let Some(x) = &m.indexer else {
        bail!("dsa_select on an MLA layer without an indexer");
    };
    if !matches!(m.q, QueryPath::LowRank { .. }) {
        bail!("the DSA indexer reads the q-LoRA activations; this layer has a direct query");
    }
    let t = a.rows.max(1);
    let (id, ih) = (x.k.rows, x.proj.rows);
    full_k(c.pool, &view(&x.k), &a.xn, sized(&mut a.idx_k, t * id));
    full_k(c.pool, &view(&x.gate), &a.xn, sized(&mut a.idx_g, t * id));
    full_k(
        c.pool,
        &view(&x.q_b),
        &a.q_a,
        sized(&mut a.idx_q, t * ih * id),
    );
    let w = sized(&mut a.idx_w, t * ih);
    full_k(c.pool, &view(&x.proj), &a.xn, w);
    let scale = 1.0 / ((id * ih) as f32).sqrt();
    w.iter_mut().for_each(|v| *v *= scale);
    a.cells.clear();
    a.cell_ends.clear();
    let (mut key, mut row_cells) = (vec![0.0; id], Vec::new());
    for (r, at) in c.at.iter().enumerate().take(t) {
        let cache = caches.get_mut(at.slot).ok_or_else(|| {
            anyhow!(
                "sequence slot {} has no indexer cache on this rank",
                at.slot
            )
        })?;
        layer_norm(
            &a.idx_k[r * id..(r + 1) * id],
            &x.k_norm.0,
            &x.k_norm.1,
            norm_eps,
            &mut key,
        );
        cache.write(at.pos, &key, &a.idx_g[r * id..(r + 1) * id], &x.ape);
        let (q, w) = (
            &a.idx_q[r * ih * id..(r + 1) * ih * id],
            &a.idx_w[r * ih..(r + 1) * ih],
        );
        cache.select(q, w, at.pos, how, &mut row_cells);
        if row_cells.is_empty() {
            bail!(
                "position {}: the indexer selects no cell (no complete pool, and the plan's model.dsa.select_tail is false)",
                at.pos
            );
        }
        a.cells.extend_from_slice(&row_cells);
        a.cell_ends.push(a.cells.len());
    }
    Ok(())
}
