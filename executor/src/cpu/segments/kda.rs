//! The KDA segments (`kda_pre`, `kda_core`) of the CPU backend: the products over every row at
//! once, the convolutions and the delta rule row after row over each row's slot state. A
//! slot's span starts from the state its position follows (`KdaState::begin`: after a
//! rejected draft, a kept verify row's) and keeps its rows' states when it is a verify step.

use super::{full_k, norm_rows, sized, view, Activations, Ctx};
use crate::cpu::kernels::{self, KdaState};
use crate::layer_weights::KdaWeights;

/// KDA over every row of the step: norm, q/k/v each through its projection (one product
/// over the rows) and its causal convolution (row after row, advancing the window state of
/// the row's slot; a sequence starting at position 0 starts from zero state), q/k L2 norms,
/// the decay gate per channel and beta per head. `states` holds every slot's state.
pub(in crate::cpu) fn kda_pre(
    c: &Ctx,
    norm: &[f32],
    k: &KdaWeights,
    states: &mut [KdaState],
    a: &mut Activations,
) -> anyhow::Result<()> {
    let t = a.rows.max(1);
    // a slot's rows are consecutive positions: its first row starts its span
    let mut row_in_span = Vec::with_capacity(c.at.len());
    for (i, at) in c.at.iter().enumerate() {
        let first = i == 0 || c.at[i - 1].slot != at.slot;
        if first {
            let rows = c.at[i..].iter().take_while(|r| r.slot == at.slot).count();
            states[at.slot].begin(at.pos, rows)?;
        }
        row_in_span.push(if first { 0 } else { row_in_span[i - 1] + 1 });
    }
    norm_rows(&a.x, norm, c.geo.eps, &mut a.xn);
    let (hd, width) = (k.head_dim(), k.q.rows);
    for (which, proj) in [&k.q, &k.k, &k.v].into_iter().enumerate() {
        full_k(c.pool, &view(proj), &a.xn, sized(&mut a.kda_x, t * width));
        let out = match which {
            0 => sized(&mut a.q, t * width),
            1 => sized(&mut a.k, t * width),
            _ => sized(&mut a.v, t * width),
        };
        let rows = a.kda_x.chunks_exact(width).zip(out.chunks_exact_mut(width));
        for ((at, &row), (x, y)) in c.at.iter().zip(&row_in_span).zip(rows) {
            let state = &mut states[at.slot];
            kernels::conv_step(state.window_mut(which), &k.conv[which], k.taps, x, y);
            state.keep_window(row, which);
        }
    }
    let l2_eps = k.l2_eps.unwrap_or(c.geo.eps);
    kernels::l2_norm_heads(&mut a.q, hd, l2_eps);
    kernels::l2_norm_heads(&mut a.k, hd, l2_eps);
    let low = sized(&mut a.kda_low, t * k.f_a.rows);
    full_k(c.pool, &view(&k.f_a), &a.xn, low);
    full_k(
        c.pool,
        &view(&k.f_b),
        &a.kda_low,
        sized(&mut a.kda_g, t * width),
    );
    for g in a.kda_g.chunks_exact_mut(width) {
        match k.bound {
            Some(lb) => kernels::decay_gate_bounded(g, &k.dt_bias, &k.a, hd, lb),
            None => kernels::decay_gate(g, &k.dt_bias, &k.a, hd),
        }
    }
    let beta = sized(&mut a.kda_beta, t * k.beta.rows);
    full_k(c.pool, &view(&k.beta), &a.xn, beta);
    beta.iter_mut().for_each(|b| *b = kernels::sigmoid(*b));
    Ok(())
}

/// KDA: the gated delta rule of each row, row after row, over each held head's recurrent
/// state of the row's slot (updated in place), then the per-head output norm times the
/// sigmoid of the low-rank output gate over every row.
pub(in crate::cpu) fn kda_core(
    c: &Ctx,
    k: &KdaWeights,
    states: &mut [KdaState],
    a: &mut Activations,
) {
    let t = a.rows.max(1);
    let (width, heads) = (k.q.rows, k.beta.rows);
    let att = sized(&mut a.att, t * width);
    for (r, (at, out)) in c.at.iter().zip(att.chunks_exact_mut(width)).enumerate() {
        let row = c.at[..r]
            .iter()
            .rev()
            .take_while(|p| p.slot == at.slot)
            .count();
        let inputs = kernels::DeltaInputs {
            q: &a.q[r * width..(r + 1) * width],
            k: &a.k[r * width..(r + 1) * width],
            v: &a.v[r * width..(r + 1) * width],
            g: &a.kda_g[r * width..(r + 1) * width],
            beta: &a.kda_beta[r * heads..(r + 1) * heads],
        };
        kernels::delta_rule(&mut states[at.slot], &inputs, out);
        states[at.slot].keep_states(row);
    }
    full_k(
        c.pool,
        &view(&k.g_a),
        &a.xn,
        sized(&mut a.kda_low, t * k.g_a.rows),
    );
    full_k(
        c.pool,
        &view(&k.g_b),
        &a.kda_low,
        sized(&mut a.kda_x, t * width),
    );
    kernels::gated_norm(&mut a.att, &k.o_norm, &a.kda_x, c.geo.eps);
}
