//! The FFN half of a layer on a CUDA rank: a dense gated FFN, or a mixture of experts (router,
//! this rank's experts, optional shared experts), with their weights, buffers and segments.
//! The router picks the top-k on the device (kernels/moe.cu) and the expert matvecs read the
//! chosen ids and weights from device memory (matvec.cu's expert mode), so an MoE layer has
//! no host round trip and is captured like any other. The combine keeps the CPU backend's
//! contract (`cpu/kernels/moe.rs`): the selected experts' weighted rows (`-0.0` for experts
//! held elsewhere), then the shared experts' row, are summed by the group's all-reduce over a
//! zeroed buffer, and every rank adds the rows in one fixed order. A prefill step's routed
//! experts are in `rows`; its rows are slot-major, so the all-reduce and the combine take
//! every token row at once.

use std::sync::Arc;

use anyhow::{bail, Result};
use cudarc::driver::{CudaStream, DeviceRepr, DeviceSlice, LaunchConfig};
use memra_compiler::plan::{ClampedFfn, FfnKind, Gating, MoeSummary};

use super::device::{CudaDevice, DeviceBuffer};
use super::matvec::{ExpertSel, Norm, Pick};
use super::span::Span;
use super::weights::{device_matrix, full_chunks, int, DeviceStack, DeviceWeight, LayerLoad};
use crate::weights::RankWeights;
pub(super) use rows::{unfit, MoeRows};

mod rows;

/// Most experts the device router takes (MOE_MAX_EXPERTS in kernels/moe.cu).
pub const MAX_EXPERTS: usize = 512;
/// Threads of `moe_order_i32`'s one block (MOE_ORDER_THREADS in kernels/moe.cu).
const MOE_ORDER_THREADS: u32 = 1024;
/// Most selected experts and expert groups (one warp lane each in kernels/moe.cu).
pub const MAX_SELECTED: usize = 32;

/// How a router picks its experts from its logits (`Route` in kernels/route.cuh, C layout).
#[repr(C)]
#[derive(Clone, Copy, PartialEq)]
pub(super) struct RouteParams {
    /// The selection bias, one value per expert, or 0.
    bias: u64,
    pub n: i32,
    k: i32,
    sigmoid: i32,
    groups: i32,
    groups_used: i32,
    norm: i32,
    scale: f32,
}

// SAFETY: plain C data, passed by value as a kernel parameter.
unsafe impl DeviceRepr for RouteParams {}

impl RouteParams {
    /// The parameters of `r`'s pick with the selection bias `bias`.
    fn of(r: &MoeSummary, bias: Option<Span<f32>>) -> RouteParams {
        let (n, k) = (r.experts as usize, r.top_k as usize);
        assert!(
            n <= MAX_EXPERTS && (1..=n.min(MAX_SELECTED)).contains(&k),
            "moe route: top-k {k} of {n} experts"
        );
        if let Some(b) = &bias {
            assert_eq!(b.len(), n, "moe route: one bias per expert");
        }
        RouteParams {
            bias: bias.map_or(0, |b| b.addr()),
            n: int(n),
            k: int(k),
            sigmoid: i32::from(r.gating == Gating::Sigmoid),
            groups: int(r.groups.max(1) as usize),
            groups_used: int(r.groups_used as usize),
            norm: i32::from(r.norm_weights),
            scale: r.weights_scale as f32,
        }
    }
}

/// A gated SiLU FFN: a dense layer's, or the shared experts'.
pub(super) struct Gated {
    pub gate: DeviceWeight,
    pub up: DeviceWeight,
    pub down: DeviceWeight,
    /// The SwiGLU clamp limit (glm5-next).
    pub clamp: Option<f32>,
}

/// Routed experts: the router (whole on every rank) and this rank's experts.
pub(super) struct MoeWeights {
    pub router: DeviceWeight,
    pub bias: Option<DeviceBuffer<f32>>,
    pub gate: DeviceStack,
    pub up: DeviceStack,
    pub down: DeviceStack,
    pub shared: Option<Gated>,
    /// The routed experts' SwiGLU clamp limit (glm5-next).
    pub clamp: Option<f32>,
}

/// A layer's FFN weights.
pub(super) enum FfnWeights {
    Dense(Box<Gated>),
    Moe(Box<MoeWeights>),
}

impl FfnWeights {
    /// Takes layer `l`'s FFN shards out of `w`, as the plan's layer schema says it is made.
    pub fn take(ld: &mut LayerLoad) -> Result<FfnWeights> {
        let (plan, l, dev, s) = (ld.plan, ld.l, ld.dev, ld.s);
        let w = &mut *ld.w;
        let name = |x: &str| format!("blk.{l}.{x}");
        let limit = |which| plan.model.moe.as_ref().and_then(|m| m.swiglu_limit(which));
        let gated = |w: &mut RankWeights, suffix: &str| -> Result<Gated> {
            let mut m = |x: &str| device_matrix(dev, s, w, &name(x));
            Ok(Gated {
                gate: m(&format!("ffn_gate{suffix}.weight"))?,
                up: m(&format!("ffn_up{suffix}.weight"))?,
                down: m(&format!("ffn_down{suffix}.weight"))?,
                clamp: limit(ClampedFfn::Shared),
            })
        };
        Ok(match plan.model.layer_kind(l).ffn {
            FfnKind::Dense => FfnWeights::Dense(Box::new(gated(w, "")?)),
            FfnKind::Moe { shared } => {
                let shared = if shared {
                    Some(gated(w, "_shexp")?)
                } else {
                    None
                };
                let probs_bias = plan.model.moe.as_ref().is_some_and(|m| m.probs_bias);
                let mut stack = |x: &str| DeviceStack::take(dev, s, w, &name(x));
                let (gate, up, down) = (
                    stack("ffn_gate_exps.weight")?,
                    stack("ffn_up_exps.weight")?,
                    stack("ffn_down_exps.weight")?,
                );
                if (up.first, up.count, down.first, down.count)
                    != (gate.first, gate.count, gate.first, gate.count)
                {
                    bail!("layer {l}: the rank holds different experts of gate, up and down");
                }
                FfnWeights::Moe(Box::new(MoeWeights {
                    router: device_matrix(dev, s, w, &name("ffn_gate_inp.weight"))?,
                    bias: if probs_bias {
                        Some(dev.upload(s, &w.take_vector(&name("exp_probs_b.bias"))?)?)
                    } else {
                        None
                    },
                    gate,
                    up,
                    down,
                    shared,
                    clamp: limit(ClampedFfn::Experts),
                }))
            }
        })
    }

    /// The widest gated activation a dense layer or the shared experts need.
    pub fn gate_rows(&self) -> usize {
        match self {
            FfnWeights::Dense(g) => g.gate.rows,
            FfnWeights::Moe(e) => e.shared.as_ref().map_or(0, |g| g.gate.rows),
        }
    }
}

/// Where an expert pass finds its token rows' picks (`k` ids and weights a row, as the
/// router writes them; the order its products take them in, if any) and leaves their gated
/// activations (`k * expert_ffn` a row).
pub(super) struct Picks {
    pub ids: Span<i32>,
    pub weights: Span<f32>,
    pub order: Option<Span<i32>>,
    pub gate: Span<f32>,
}

/// A rank's MoE state: the router's settings and the buffers of its MoE layers.
pub(super) struct MoeState {
    pub router: MoeSummary,
    /// Router logits, then the selected ids and their weights.
    pub logits: DeviceBuffer<f32>,
    pub ids: DeviceBuffer<i32>,
    pub weights: DeviceBuffer<f32>,
    /// The router launch's count of its finished blocks (`Pick::done`).
    done: DeviceBuffer<i32>,
    gate: DeviceBuffer<f32>,
    /// The selected experts' weighted rows, then the shared experts' row; a block of them per
    /// slot, of every token row of the step.
    pub rows: DeviceBuffer<f32>,
    /// The group's sum of `rows`, zero between all-reduces.
    pub sum: DeviceBuffer<f32>,
    /// The routing and expert buffers of a step of several token rows (none when every step
    /// has one).
    pub wide: Option<MoeRows>,
}

impl MoeState {
    /// The state for `moe` with hidden size `d` and steps of up to `max_rows` token rows, if
    /// the rank has MoE layers.
    pub fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        moe: &MoeSummary,
        d: usize,
        max_rows: usize,
    ) -> Result<MoeState> {
        let (n, k) = (moe.experts as usize, moe.top_k as usize);
        if n > MAX_EXPERTS || k > MAX_SELECTED || moe.groups as usize > MAX_SELECTED {
            bail!("model.moe has {n} experts, top-k {k} and {} groups; the cuda backend takes up to {MAX_EXPERTS} experts and {MAX_SELECTED} selected experts and groups", moe.groups);
        }
        let rows = (k + usize::from(moe.shared_expert_ffn > 0)) * d * max_rows;
        Ok(MoeState {
            router: moe.clone(),
            logits: dev.alloc(s, n)?,
            ids: dev.alloc(s, k)?,
            weights: dev.alloc(s, k)?,
            done: dev.alloc(s, 1)?,
            gate: dev.alloc(
                s,
                (k * moe.expert_ffn as usize).max(moe.shared_expert_ffn as usize),
            )?,
            rows: dev.alloc(s, rows)?,
            sum: dev.alloc(s, rows)?,
            wide: if max_rows > 1 {
                Some(MoeRows::new(dev, s, moe, max_rows, d)?)
            } else {
                None
            },
        })
    }

    /// Router: the logits of `rms_norm(x) * norm` (the norm folded into the product), and the
    /// top-k ids and weights.
    pub fn route(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        e: &MoeWeights,
        norm: Norm,
        x: &Span<f32>,
    ) -> Result<()> {
        let pick = Pick {
            route: RouteParams::of(&self.router, e.bias.as_ref().map(Span::of)),
            done: Span::of(&self.done).addr(),
            ids: Span::of(&self.ids).addr(),
            weights: Span::of(&self.weights).addr(),
        };
        let chunks = full_chunks(&e.router);
        dev.matvec_picking(s, &e.router, x, norm, chunks, &Span::of(&self.logits), pick)
    }

    /// The picks of a one-row step: the router's ids and weights, and the experts' gated
    /// activations.
    pub fn picks(&self) -> Picks {
        Picks {
            ids: Span::of(&self.ids),
            weights: Span::of(&self.weights),
            order: None,
            gate: Span::of(&self.gate),
        }
    }

    /// The selected experts this rank holds over `rms_norm(x) * norm` for each of the `rows`
    /// token rows of x (their picks in `picks`), each weighted, into `rows` slot-major (pick
    /// `s` of token row `t` at `(s * rows + t) * hidden`; `-0.0` for experts held elsewhere).
    /// Every pick is a one-row decode matvec of its own grid row, so a token row's values do
    /// not depend on the other rows of the step.
    #[allow(clippy::too_many_arguments)]
    pub fn experts(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        e: &MoeWeights,
        norm: Norm,
        x: &Span<f32>,
        picks: &Picks,
        rows: usize,
    ) -> Result<()> {
        let k = self.router.top_k as usize;
        let (ff, d) = (e.gate.weight.rows, e.down.weight.rows);
        let gate = picks.gate.sub(0, rows * k * ff);
        let sel = ExpertSel {
            ids: picks.ids.addr(),
            weights: 0,
            order: picks.order.as_ref().map_or(0, Span::addr),
            slots: rows * k,
            first: e.gate.first,
            count: e.gate.count,
            stride: e.gate.stride,
            x_stride: 0,
            y_stride: ff,
            token_rows: rows,
            x_row_stride: d,
        };
        let chunks = full_chunks(&e.gate.weight);
        let gu = [&e.gate.weight, &e.up.weight];
        dev.matvec_experts(s, &gu, x, Some(norm), chunks, &gate, e.clamp, sel)?;
        let down = ExpertSel {
            weights: picks.weights.addr(),
            stride: e.down.stride,
            x_stride: ff,
            y_stride: d,
            x_row_stride: 0,
            ..sel
        };
        let chunks = full_chunks(&e.down.weight);
        dev.matvec_experts(
            s,
            &[&e.down.weight],
            &gate,
            None,
            chunks,
            &Span::of(&self.rows).sub(0, rows * k * d),
            None,
            down,
        )
    }

    /// The shared experts over `rms_norm(x) * norm` (this rank's columns, `chunks` for down)
    /// into the last row.
    pub fn shared(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        g: &Gated,
        norm: Norm,
        x: &Span<f32>,
        chunks: Option<usize>,
    ) -> Result<()> {
        let d = g.down.rows;
        let k = self.router.top_k as usize;
        let act = Span::of(&self.gate).sub(0, g.gate.rows);
        dev.matvec_swiglu(
            s,
            &g.gate,
            &g.up,
            x,
            Some(norm),
            full_chunks(&g.gate),
            g.clamp,
            &mut act.clone(),
        )?;
        let chunks = chunks.unwrap_or_else(|| full_chunks(&g.down)).max(1);
        let out = Span::of(&self.rows).sub(k * d, d);
        dev.matvec(s, &g.down, &act, chunks, &mut out.clone())
    }

    /// Rows the layer leaves in `rows`.
    pub fn row_count(&self) -> usize {
        self.router.top_k as usize + usize::from(self.router.shared_expert_ffn > 0)
    }

    /// `x += ((r0 + r1) + ...)` over `rows` (a lone rank) or the group's `sum` (zeroed again),
    /// for every token row of `x`.
    pub fn combine(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        x: &Span<f32>,
        reduced: bool,
    ) -> Result<()> {
        let rows = if reduced { &self.sum } else { &self.rows };
        dev.moe_combine(s, &Span::of(rows), self.row_count(), x, reduced)
    }
}

impl CudaDevice {
    /// The top-k experts of each row of the router `logits` (selection bias `bias`) with their
    /// weights, as `Router::route` of the CPU backend picks them, into `k` values a row of
    /// `ids` and `weights`.
    pub(super) fn moe_route(
        &self,
        s: &CudaStream,
        logits: &Span<f32>,
        bias: Option<Span<f32>>,
        r: &MoeSummary,
        ids: &Span<i32>,
        weights: &Span<f32>,
    ) -> Result<()> {
        let route = RouteParams::of(r, bias);
        let (n, k) = (route.n as usize, route.k as usize);
        let rows = logits.len() / n;
        assert!(
            rows > 0 && logits.len() == rows * n,
            "moe_route: whole rows of logits"
        );
        assert!(
            ids.len() >= rows * k && weights.len() >= rows * k,
            "moe_route: k outputs a row"
        );
        let pick = Pick {
            route,
            done: 0,
            ids: ids.addr(),
            weights: weights.addr(),
        };
        self.pick(s, logits.addr(), rows, &pick)
    }

    /// The picks of `ids` (`k` a token row) grouped by expert into `order` (`moe_order_i32`):
    /// the order in which a batched step's expert products take them.
    pub(super) fn moe_order(
        &self,
        s: &CudaStream,
        ids: &Span<i32>,
        experts: usize,
        order: &Span<i32>,
    ) -> Result<()> {
        let count = ids.len();
        assert!(
            order.len() == count && experts <= MAX_EXPERTS,
            "moe_order: one place a pick, up to {MAX_EXPERTS} experts"
        );
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (MOE_ORDER_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ip, op, c, n) = (ids.addr(), order.addr(), int(count), int(experts));
        self.launch(s, "moe_order_i32", cfg, |a| {
            a.arg(&ip).arg(&c).arg(&n).arg(&op);
        })
    }

    /// `pick` over `rows` rows of logits at `logits`, a block a row.
    pub(super) fn pick(&self, s: &CudaStream, logits: u64, rows: usize, pick: &Pick) -> Result<()> {
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(s, "moe_route_f32", cfg, |a| {
            a.arg(&logits)
                .arg(&pick.route)
                .arg(&pick.ids)
                .arg(&pick.weights);
        })
    }

    /// `x += ((r0 + r1) + ...)` over the first `count` rows of `rows`; with `clear`, the rows
    /// are zeroed after they are read.
    pub(super) fn moe_combine(
        &self,
        s: &CudaStream,
        rows: &Span<f32>,
        count: usize,
        x: &Span<f32>,
        clear: bool,
    ) -> Result<()> {
        let n = x.len();
        assert!(rows.len() >= count * n && count > 0, "moe_combine: rows");
        let (rp, xp) = (rows.addr(), x.addr());
        let (c, ni, clear) = (int(count), int(n), i32::from(clear));
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(s, "moe_combine_f32", cfg, |a| {
            a.arg(&rp).arg(&c).arg(&ni).arg(&xp).arg(&clear);
        })
    }
}
