//! The routed experts of a step of several token rows on a CUDA rank. The router runs over
//! every token row in one launch (the decode matvec, so each row is routed as its decode step
//! routes it), the top-k of every row in another (`route`). A batched decode step then runs
//! the decode experts over the rows' picks (`picks`, `MoeState::experts`), each pick a one-row
//! matvec with its decode step's bits. A prefill step's ids come back to the host, which
//! groups the rows by expert (`experts`). The rows of every expert this rank holds are
//! gathered at once, gate and up then run as one grouped tensor-core GEMM launch (an expert's
//! matrices read once for the chunk), the SiLU gate and down as one launch each, and each
//! product row, times its routing weight, lands in its slot's block of the layer's rows
//! (`MoeState::rows`, slot-major: slot `s` of token row `t` at `(s * rows + t) * hidden`); the
//! blocks of experts held elsewhere hold `-0.0`. That is the decode combine's structure row for
//! row: the group's all-reduce and `moe_combine` then give every plan the 1-rank bits
//! (`cuda::moe`). A row's product does not depend on the other rows of its expert's group, and
//! every rank routes the same rows the same way, so any rank holding an expert computes its
//! rows' bits.

use std::sync::Arc;

use anyhow::{bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice};
use memra_compiler::plan::MoeSummary;

use super::{MoeWeights, Picks};
use crate::cuda::device::{CudaDevice, DeviceBuffer};
use crate::cuda::matvec::{ExpertSel, Norm};
use crate::cuda::rows::{Groups, Matrix, GEMM_DEPTH};
use crate::cuda::span::Span;
use crate::cuda::weights::{full_chunks, grid, int, DeviceStack};

/// The buffers of the routed experts over several token rows (a prefill or batched decode
/// step), for up to `rows` of them.
pub(crate) struct MoeRows {
    /// Experts, and experts selected per row.
    experts: usize,
    k: usize,
    /// Router logits of every row.
    logits: DeviceBuffer<f32>,
    /// The selected ids and weights of every row (`k` a row).
    pub ids: DeviceBuffer<i32>,
    weights: DeviceBuffer<f32>,
    /// A batched decode step's picks grouped by expert (`CudaDevice::moe_order`).
    order: DeviceBuffer<i32>,
    /// One zero per row: every router slot names the one router matrix.
    router_ids: DeviceBuffer<i32>,
    /// The assignments `row * k + slot`, grouped by expert.
    assign: DeviceBuffer<i32>,
    /// Each held expert's (first, count) in `assign`.
    spans: DeviceBuffer<i32>,
    /// The assigned rows: the input narrowed to f16, then the activation.
    a16: DeviceBuffer<u16>,
    gate: DeviceBuffer<f32>,
    up: DeviceBuffer<f32>,
    /// The assigned rows' outputs before they are weighted and scattered.
    y: DeviceBuffer<f32>,
}

impl MoeRows {
    /// The buffers for `rows` token rows of hidden size `d`.
    pub fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        moe: &MoeSummary,
        rows: usize,
        d: usize,
    ) -> Result<MoeRows> {
        let (n, k, ff) = (
            moe.experts as usize,
            moe.top_k as usize,
            moe.expert_ffn as usize,
        );
        Ok(MoeRows {
            experts: n,
            k,
            logits: dev.alloc(s, rows * n)?,
            ids: dev.alloc(s, rows * k)?,
            weights: dev.alloc(s, rows * k)?,
            order: dev.alloc(s, rows * k)?,
            router_ids: dev.alloc(s, rows)?,
            assign: dev.alloc(s, rows * k)?,
            spans: dev.alloc(s, 2 * n)?,
            a16: dev.alloc(s, rows * k * d.max(ff))?,
            gate: dev.alloc(s, rows * k * ff)?,
            up: dev.alloc(s, rows * k * ff)?,
            y: dev.alloc(s, rows * k * d)?,
        })
    }

    /// The picks of a batched decode step of `rows` token rows routed by `route`, for the
    /// decode experts (`MoeState::experts`): over several rows grouped by expert first, so
    /// that the rows which chose an expert run side by side and share its reads.
    pub fn picks(&self, dev: &CudaDevice, s: &CudaStream, rows: usize) -> Result<Picks> {
        let n = rows * self.k;
        let ids = Span::of(&self.ids).sub(0, n);
        let order = if rows > 1 {
            let order = Span::of(&self.order).sub(0, n);
            dev.moe_order(s, &ids, self.experts, &order)?;
            Some(order)
        } else {
            None
        };
        Ok(Picks {
            ids,
            weights: Span::of(&self.weights).sub(0, n),
            order,
            gate: Span::of(&self.gate),
        })
    }

    /// The router logits and the top-k ids and weights of each of the `rows` rows of
    /// `rms_norm(x) * norm` (of x itself without a norm), each row routed by the decode matvec
    /// as its decode step routes it.
    #[allow(clippy::too_many_arguments)]
    pub fn route(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        e: &MoeWeights,
        r: &MoeSummary,
        x: &Span<f32>,
        norm: Option<Norm>,
        rows: usize,
    ) -> Result<()> {
        let (n, k, d) = (e.router.rows, self.k, e.router.cols);
        let logits = Span::of(&self.logits).sub(0, rows * n);
        let sel = ExpertSel {
            ids: Span::of(&self.router_ids).addr(),
            weights: 0,
            order: 0,
            slots: rows,
            first: 0,
            count: 1,
            stride: 0,
            x_stride: d,
            y_stride: n,
            token_rows: 1,
            x_row_stride: 0,
        };
        dev.matvec_experts(
            s,
            &[&e.router],
            x,
            norm,
            full_chunks(&e.router),
            &logits,
            None,
            sel,
        )?;
        dev.moe_route(
            s,
            &logits,
            e.bias.as_ref().map(Span::of),
            r,
            &Span::of(&self.ids).sub(0, rows * k),
            &Span::of(&self.weights).sub(0, rows * k),
        )
    }

    /// The selected experts this rank holds over their rows of `xn`, each row weighted, into
    /// the first `k` slot blocks of `out` (`-0.0` for experts held elsewhere).
    pub fn experts(
        &self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        e: &MoeWeights,
        xn: &Span<f32>,
        rows: usize,
        out: &Span<f32>,
    ) -> Result<()> {
        let (d, ff) = (e.down.weight.rows, e.gate.weight.rows);
        let k = self.k;
        let ids = dev.download(s, &Span::of(&self.ids).sub(0, rows * k))?;
        let (assign, spans) = group(&ids, e.gate.first, e.gate.count);
        let blocks = out.sub(0, k * rows * d);
        dev.moe_unheld(s, &blocks)?;
        if assign.is_empty() {
            // none of the rows chose an expert this rank holds
            return Ok(());
        }
        let total = assign.len();
        let a = Span::of(&self.assign).sub(0, total);
        dev.write(s, &assign, &mut a.clone())?;
        let flat: Vec<i32> = spans.iter().flat_map(|&(f, c)| [int(f), int(c)]).collect();
        let groups = Groups {
            spans: Span::of(&self.spans).sub(0, flat.len()),
            count: spans.len(),
            stride: e.gate.stride,
            most_rows: spans.iter().map(|s| s.1).max().unwrap_or(0),
        };
        dev.write(s, &flat, &mut groups.spans.clone())?;
        if e.up.count != e.gate.count || e.down.count != e.gate.count {
            bail!("the gate, up and down stacks of the experts hold different experts");
        }
        let a16 = Span::of(&self.a16);
        let (gate, up) = (
            Span::of(&self.gate).sub(0, total * ff),
            Span::of(&self.up).sub(0, total * ff),
        );
        let y = Span::of(&self.y).sub(0, total * d);
        dev.moe_gather(s, xn, &a, k, &a16.sub(0, total * d))?;
        if e.up.stride == e.gate.stride {
            let gate_up = [(e.gate.matrix(0), &gate), (e.up.matrix(0), &up)];
            dev.gemm_grouped(s, &gate_up, &a16, total, &groups)?;
        } else {
            // stacks of different dtypes (a mixed-quant file): a launch each
            for (w, y) in [(&e.gate, &gate), (&e.up, &up)] {
                let groups = Groups {
                    stride: w.stride,
                    ..groups.clone()
                };
                dev.gemm_grouped(s, &[(w.matrix(0), y)], &a16, total, &groups)?;
            }
        }
        dev.swiglu_rows(s, &gate, &up, e.clamp, &mut gate.clone(), Some(&a16))?;
        let groups = Groups {
            stride: e.down.stride,
            ..groups
        };
        dev.gemm_grouped(s, &[(e.down.matrix(0), &y)], &a16, total, &groups)?;
        dev.moe_scatter(s, &y, &a, &Span::of(&self.weights), (k, rows), &blocks)
    }
}

/// Why the routed experts of `moe` (hidden size `d`) cannot take the prefill GEMMs, if so.
pub(crate) fn unfit(moe: &MoeSummary, d: u64) -> Option<&'static str> {
    let depth = GEMM_DEPTH as u64;
    if !d.is_multiple_of(depth) || !u64::from(moe.expert_ffn).is_multiple_of(depth) {
        return Some("the cuda prefill runs experts as GEMMs over whole 64-value steps; this model's hidden or expert width is not a multiple of 64");
    }
    None
}

/// The assignments `row * k + slot` of the selected `ids` (`k` a row) whose expert is one of
/// `first..first + count`, grouped by expert in row order, and each held expert's
/// `(start, count)` in them.
fn group(ids: &[i32], first: usize, count: usize) -> (Vec<i32>, Vec<(usize, usize)>) {
    let mut by_expert = vec![Vec::new(); count];
    for (a, &id) in ids.iter().enumerate() {
        let held = usize::try_from(id).ok().and_then(|e| e.checked_sub(first));
        if let Some(list) = held.and_then(|i| by_expert.get_mut(i)) {
            list.push(int(a));
        }
    }
    let mut spans = Vec::with_capacity(count);
    let mut assign = Vec::with_capacity(ids.len());
    for list in by_expert {
        spans.push((assign.len(), list.len()));
        assign.extend(list);
    }
    (assign, spans)
}

impl DeviceStack {
    /// The matrix of the `i`-th expert this stack holds.
    pub fn matrix(&self, i: usize) -> Matrix {
        let w = Matrix::from(&self.weight);
        Matrix {
            addr: w.addr + (i * self.stride) as u64,
            ..w
        }
    }
}

impl CudaDevice {
    /// Row `j` of `out` = the row `assign[j] / k` of `x` narrowed to f16.
    fn moe_gather(
        &self,
        s: &CudaStream,
        x: &Span<f32>,
        assign: &Span<i32>,
        k: usize,
        out: &Span<u16>,
    ) -> Result<()> {
        let (count, d) = (assign.len(), out.len() / assign.len());
        assert!(
            out.len() == count * d && x.len().is_multiple_of(d),
            "moe_gather: out must hold one row of x per assignment"
        );
        let (xp, ap, op) = (x.addr(), assign.addr(), out.addr());
        let (ki, di, ci) = (int(k), int(d), int(count));
        self.launch(s, "moe_gather_f16", grid(count * d, 256), |l| {
            l.arg(&xp).arg(&ap).arg(&ki).arg(&di).arg(&ci).arg(&op);
        })
    }

    /// For each assignment `a = assign[j] = row * k + slot`: block (slot, row) of `out` (slot
    /// major, `rows` rows) = row `j` of `y` times `weights[a]`.
    fn moe_scatter(
        &self,
        s: &CudaStream,
        y: &Span<f32>,
        assign: &Span<i32>,
        weights: &Span<f32>,
        (k, rows): (usize, usize),
        out: &Span<f32>,
    ) -> Result<()> {
        let (count, d) = (assign.len(), y.len() / assign.len());
        assert!(
            y.len() == count * d && out.len() == k * rows * d && weights.len() >= rows * k,
            "moe_scatter: y must hold a row per assignment and out k blocks of {rows} rows"
        );
        let (yp, ap, wp, op) = (y.addr(), assign.addr(), weights.addr(), out.addr());
        let (ki, ri, di, ci) = (int(k), int(rows), int(d), int(count));
        self.launch(s, "moe_scatter_f32", grid(count * d, 256), |l| {
            l.arg(&yp).arg(&ap).arg(&wp).arg(&ki).arg(&ri);
            l.arg(&di).arg(&ci).arg(&op);
        })
    }

    /// Fills `rows` with `-0.0`.
    fn moe_unheld(&self, s: &CudaStream, rows: &Span<f32>) -> Result<()> {
        let (rp, n) = (rows.addr(), int(rows.len()));
        self.launch(s, "moe_unheld_f32", grid(rows.len(), 256), |l| {
            l.arg(&rp).arg(&n);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_group_held_experts_in_row_order() {
        // two rows, top-2: row 0 picks experts 3 and 1, row 1 picks 1 and 2
        let ids = [3, 1, 1, 2];
        let (assign, spans) = group(&ids, 1, 2);
        // expert 1: row 0 slot 1 (a = 1), row 1 slot 0 (a = 2); expert 2: row 1 slot 1
        assert_eq!(assign, [1, 2, 3]);
        assert_eq!(spans, [(0, 2), (2, 1)]);
        let (all, spans) = group(&ids, 0, 4);
        assert_eq!(all, [1, 2, 3, 0]);
        assert_eq!(spans, [(0, 0), (0, 2), (2, 1), (3, 1)]);
    }
}
