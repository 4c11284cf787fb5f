//! MoE on the device against the CPU backend: the router's top-k (ids exact, weights within
//! 1e-6 relative) for softmax and sigmoid gating, bias and groups; a whole MoE layer (norm,
//! router, experts, combine) per expert dtype against the CPU kernels; expert parallelism
//! (a rank holding half the experts writes the full run's rows bit for bit, `-0.0` for the
//! rest); a batched decode step's routing and experts over many token rows against each row's
//! one-row decode, bit for bit (and with half the experts held); a prefill step's experts over many token rows (grouped by expert, GEMMs) against
//! exact products row by row, with the same expert-parallel check; glm5-next's clamped SwiGLU in
//! the experts against `silu_mul_clamped`; and the layer captured in a graph, replayed against
//! eager, bit for bit.

use std::sync::Arc;

use anyhow::Result;
use memra_compiler::plan::{Gating, MoeSummary};
use memra_gguf::GgmlType;

use super::exact::report_replay;
use super::{bit_mismatches, random, random_weight, Ctx};
use crate::cpu::kernels::{self, combine_into, silu_mul, silu_mul_clamped, Pool, Router, Weight};
use crate::cuda::moe::{MoeState, MoeWeights};
use crate::cuda::weights::{full_chunks, DeviceStack};
use crate::cuda::{capture, CudaDevice, CudaStream, DeviceBuffer, DeviceWeight, Norm, Span};
use crate::weights::Stack;

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    // (gating, experts, top-k, groups, groups used, bias, norm, scale)
    let cases = [
        (Gating::Softmax, 8, 4, 1, 1, false, true, 1.0),
        (Gating::Softmax, 128, 8, 1, 1, false, true, 1.0),
        (Gating::Softmax, 64, 6, 1, 1, false, false, 1.0),
        (Gating::Sigmoid, 256, 8, 8, 4, true, true, 2.5),
        (Gating::Sigmoid, 16, 4, 4, 2, true, true, 2.5),
        (Gating::Softmax, 512, 32, 1, 1, false, true, 1.0),
    ];
    for (gating, n, k, groups, groups_used, bias, norm, scale) in cases {
        let moe = summary(gating, n, k, (groups, groups_used), norm, scale);
        route(cx, &moe, bias)?;
    }
    for dtype in [
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::F16,
    ] {
        layer(cx, dtype, None)?;
        decode_rows(cx, dtype)?;
        prefill(cx, dtype)?;
    }
    layer(cx, GgmlType::Q8_0, Some(CLAMP))?;
    graph(cx)?;
    Ok(())
}

fn summary(
    gating: Gating,
    n: u32,
    k: u32,
    groups: (u32, u32),
    norm: bool,
    scale: f64,
) -> MoeSummary {
    MoeSummary {
        experts: n,
        top_k: k,
        expert_ffn: FF as u32,
        shared_expert_ffn: 0,
        dense_layers: 0,
        gating,
        probs_bias: false,
        groups: groups.0,
        groups_used: groups.1,
        norm_weights: norm,
        weights_scale: scale,
        clamp: None,
    }
}

fn route(cx: &mut Ctx, m: &MoeSummary, with_bias: bool) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (n, k) = (m.experts as usize, m.top_k as usize);
    let logits = random(&mut cx.rng, n, 3.0);
    let bias = with_bias.then(|| random(&mut cx.rng, n, 0.5));
    let ld = dev.upload(s, &logits)?;
    let bd = bias.as_ref().map(|b| dev.upload(s, b)).transpose()?;
    let ids: DeviceBuffer<i32> = dev.alloc(s, k)?;
    let weights: DeviceBuffer<f32> = dev.alloc(s, k)?;
    let spans = (Span::of(&ids), Span::of(&weights));
    dev.moe_route(
        s,
        &Span::of(&ld),
        bd.as_ref().map(Span::of),
        m,
        &spans.0,
        &spans.1,
    )?;
    let (got_ids, got_w) = (dev.download(s, &ids)?, dev.download(s, &weights)?);
    let want = Router::of(m).route(&logits, bias.as_deref());
    let case = format!(
        "{:?} {n} experts top-{k} groups {}/{}",
        m.gating, m.groups, m.groups_used
    );
    let wrong = got_ids
        .iter()
        .zip(&want)
        .filter(|(&g, &(e, _))| g as usize != e)
        .count();
    cx.report.exact("moe_route ids", case.clone(), wrong);
    let err = got_w
        .iter()
        .zip(&want)
        .map(|(&g, &(_, w))| (f64::from(g) - f64::from(w)).abs() / f64::from(w).abs().max(1e-30))
        .fold(0f64, f64::max);
    cx.report.tol("moe_route weights", case, err, 1e-6, "rel");
    Ok(())
}

const D: usize = 256;
const FF: usize = 512;
const EXPERTS: usize = 8;
const TOP_K: usize = 3;
/// A SwiGLU clamp limit that clamps many of the layer's gate and up values.
const CLAMP: f32 = 0.25;

/// One MoE layer's weights on the host and on the device, and its device state.
struct Layer {
    host: [Stack; 3],
    router: Vec<f32>,
    norm: Vec<f32>,
    norm_d: DeviceBuffer<f32>,
    w: MoeWeights,
    st: MoeState,
    x: DeviceBuffer<f32>,
    xn: DeviceBuffer<f32>,
}

fn stack(
    rng: &mut memra_gguf::rng::Rng,
    dtype: GgmlType,
    rows: usize,
    cols: usize,
) -> Result<Stack> {
    let mut data = Vec::new();
    for _ in 0..EXPERTS {
        data.extend(random_weight(rng, dtype, rows, cols)?.0);
    }
    Ok(Stack {
        dtype,
        data,
        first: 0,
        count: EXPERTS,
        rows,
        cols,
    })
}

/// The experts `first..first + count` of `s`.
fn part(s: &Stack, first: usize, count: usize) -> Stack {
    let n = s.matrix_bytes();
    Stack {
        data: s.data[first * n..(first + count) * n].to_vec(),
        first,
        count,
        ..*s
    }
}

impl Layer {
    /// A layer over `rows` token rows of random input.
    fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        rng: &mut memra_gguf::rng::Rng,
        dtype: GgmlType,
        rows: usize,
        clamp: Option<f32>,
    ) -> Result<Layer> {
        let host = [
            stack(rng, dtype, FF, D)?,
            stack(rng, dtype, FF, D)?,
            stack(rng, dtype, D, FF)?,
        ];
        let router = random(rng, EXPERTS * D, 0.2);
        let norm = random(rng, D, 1.0);
        let x = random(rng, rows * D, 1.0);
        let moe = summary(
            Gating::Softmax,
            EXPERTS as u32,
            TOP_K as u32,
            (1, 1),
            true,
            1.0,
        );
        let router_bytes: Vec<u8> = router.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(Layer {
            w: MoeWeights {
                router: DeviceWeight::upload(dev, s, GgmlType::F32, &router_bytes, EXPERTS, D)?,
                bias: None,
                gate: DeviceStack::upload(dev, s, &host[0])?,
                up: DeviceStack::upload(dev, s, &host[1])?,
                down: DeviceStack::upload(dev, s, &host[2])?,
                shared: None,
                clamp,
            },
            st: MoeState::new(dev, s, &moe, D, rows)?,
            host,
            router,
            norm_d: dev.upload(s, &norm)?,
            norm,
            x: dev.upload(s, &x)?,
            xn: dev.alloc(s, rows * D)?,
        })
    }

    /// Keeps experts `first..first + count` only (an expert-parallel rank's share).
    fn hold(
        &mut self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        first: usize,
        count: usize,
    ) -> Result<()> {
        self.w.gate = DeviceStack::upload(dev, s, &part(&self.host[0], first, count))?;
        self.w.up = DeviceStack::upload(dev, s, &part(&self.host[1], first, count))?;
        self.w.down = DeviceStack::upload(dev, s, &part(&self.host[2], first, count))?;
        Ok(())
    }

    /// Norm, router and experts; then the combine into x when `combine`.
    fn enqueue(&self, dev: &CudaDevice, s: &CudaStream, combine: bool) -> Result<()> {
        let norm = Norm {
            weight: &self.norm_d,
            eps: 1e-6,
        };
        let x = Span::of(&self.x);
        self.st.route(dev, s, &self.w, norm, &x)?;
        self.st
            .experts(dev, s, &self.w, norm, &x, &self.st.picks(), 1)?;
        if combine {
            self.st.combine(dev, s, &x, false)?;
        }
        Ok(())
    }
}

/// How the reference's expert products take their activations.
#[derive(Clone, Copy)]
enum Products<'a> {
    /// As the CPU backend does (8-bit quantized for quantized weights): the decode layer's
    /// reference, which the device's matvecs follow to within rounding.
    Cpu,
    /// Exact: f32 activations against the dequantized weights (`dequantized`, per expert its
    /// gate, up and down), so that what a prefill step's f16 activations lose is measured
    /// alone and not beside the CPU's own quantization error.
    Exact(&'a [Vec<Vec<f32>>]),
}

/// Every expert's gate, up and down matrices of `l`, dequantized.
fn dequantized(l: &Layer) -> Vec<Vec<Vec<f32>>> {
    (0..EXPERTS)
        .map(|e| {
            l.host
                .iter()
                .map(|st| {
                    let bytes = st.matrix(e).expect("invariant: every expert held");
                    let mut out = vec![0f32; st.rows * st.cols];
                    memra_gguf::dequantize(st.dtype, bytes, &mut out)
                        .expect("invariant: a whole matrix of its own dtype");
                    out
                })
                .collect()
        })
        .collect()
}

/// The CPU backend's layer on one token row `x`: its route and the weighted expert rows.
fn reference(
    l: &Layer,
    pool: &Pool,
    x: &[f32],
    products: Products,
) -> (Vec<(usize, f32)>, Vec<f32>) {
    let mut xn = vec![0f32; D];
    kernels::rms_norm(x, &l.norm, 1e-6, &mut xn);
    let router = Weight {
        dtype: GgmlType::F32,
        data: bytemuck_f32(&l.router),
        rows: EXPERTS,
        cols: D,
    };
    let mut logits = vec![0f32; EXPERTS];
    kernels::matvec(pool, &router, &xn, full_chunks(&l.w.router), &mut logits);
    let route = Router::of(&l.st.router).route(&logits, None);
    let mut rows = vec![0f32; TOP_K * D];
    for (row, &(e, w)) in rows.chunks_exact_mut(D).zip(&route) {
        let m = |i: usize| {
            let st = &l.host[i];
            let (dtype, data) = match products {
                Products::Cpu => (
                    st.dtype,
                    st.matrix(e).expect("invariant: every expert held"),
                ),
                Products::Exact(all) => (GgmlType::F32, bytemuck_f32(&all[e][i])),
            };
            Weight {
                dtype,
                data,
                rows: st.rows,
                cols: st.cols,
            }
        };
        let (mut g, mut u) = (vec![0f32; FF], vec![0f32; FF]);
        kernels::matvec(pool, &m(0), &xn, full_chunks(&l.w.gate.weight), &mut g);
        kernels::matvec(pool, &m(1), &xn, full_chunks(&l.w.up.weight), &mut u);
        match l.w.clamp {
            Some(c) => silu_mul_clamped(&mut g, &u, c),
            None => silu_mul(&mut g, &u),
        }
        kernels::matvec(pool, &m(2), &g, full_chunks(&l.w.down.weight), row);
        row.iter_mut().for_each(|v| *v *= w);
    }
    (route, rows)
}

/// Selected ids of `got` (`TOP_K` a row) that differ from the routes of `want`.
fn wrong_ids(got: &[i32], want: &[Vec<(usize, f32)>]) -> usize {
    got.chunks_exact(TOP_K)
        .zip(want)
        .map(|(g, w)| {
            g.iter()
                .zip(w)
                .filter(|(&g, &(e, _))| g as usize != e)
                .count()
        })
        .sum()
}

/// Largest difference of `got` from `want`, relative to the largest expert value of `rows`.
fn rel_err(got: &[f32], want: &[f32], rows: &[f32]) -> f64 {
    let scale = rows.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    got.iter()
        .zip(want)
        .map(|(&a, &b)| f64::from(a - b).abs() / scale.max(1e-30))
        .fold(0f64, |m, e| if e.is_nan() { f64::NAN } else { m.max(e) })
}

fn layer(cx: &mut Ctx, dtype: GgmlType, clamp: Option<f32>) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let mut l = Layer::new(dev, s, &mut cx.rng, dtype, 1, clamp)?;
    let name = match clamp {
        Some(c) => format!("{dtype}, swiglu clamped at {c}"),
        None => format!("{dtype}"),
    };
    let x0 = dev.download(s, &l.x)?;
    l.enqueue(dev, s, false)?;
    let rows = dev.download(s, &l.st.rows)?;
    l.st.combine(dev, s, &Span::of(&l.x), false)?;
    let x1 = dev.download(s, &l.x)?;
    // the CPU backend's layer from the same input
    let (route, want_rows) = reference(&l, &Pool::new(2), &x0, Products::Cpu);
    let ids = dev.download(s, &l.st.ids)?;
    let wrong = wrong_ids(&ids, std::slice::from_ref(&route));
    cx.report.exact("moe_layer ids", name.clone(), wrong);
    let mut want_x = x0.clone();
    combine_into(&want_rows, TOP_K, false, &mut want_x);
    cx.report.tol(
        "moe_layer",
        format!("{name} {EXPERTS}x{FF}x{D} top-{TOP_K}"),
        rel_err(&x1, &want_x, &want_rows),
        1e-4,
        "rel max",
    );
    // an expert-parallel rank holding half the experts: its rows are the full run's or -0.0
    for first in [0, EXPERTS / 2] {
        l.hold(dev, s, first, EXPERTS / 2)?;
        dev.write(s, &x0, &mut l.x)?;
        l.enqueue(dev, s, false)?;
        let got = dev.download(s, &l.st.rows)?;
        let mut want = rows.clone();
        for (row, &e) in want.chunks_exact_mut(D).zip(&ids) {
            if !(first..first + EXPERTS / 2).contains(&(e as usize)) {
                row.fill(-0.0);
            }
        }
        cx.report.exact(
            "moe_experts ep",
            format!("{name} experts {first}..{}", first + EXPERTS / 2),
            bit_mismatches(&got[..TOP_K * D], &want[..TOP_K * D]),
        );
    }
    Ok(())
}

/// f32 values as their little-endian bytes.
fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte pattern is a valid u8
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), size_of_val(v)) }
}

fn graph(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let mut l = Layer::new(dev, s, &mut cx.rng, GgmlType::Q4_1, 1, None)?;
    let x0 = dev.download(s, &l.x)?;
    let steps = 5;
    // x carries over, so every step routes a new input
    let mut eager = Vec::new();
    for _ in 0..steps {
        l.enqueue(dev, s, true)?;
        eager.extend(dev.download(s, &l.x)?);
    }
    dev.write(s, &x0, &mut l.x)?;
    let captured = capture(s, || l.enqueue(dev, s, true));
    report_replay(
        cx,
        "moe graph",
        format!("replay == eager, {steps} steps"),
        captured,
        &eager,
        |g| {
            let mut replayed = Vec::new();
            for _ in 0..steps {
                g.replay()?;
                replayed.extend(dev.download(s, &l.x)?);
            }
            Ok(replayed)
        },
    )?;
    Ok(())
}

/// Token rows of the batched decode case.
const DECODE_ROWS: usize = 13;

/// A batched decode step's routed experts over `DECODE_ROWS` token rows (`MoeRows::route`,
/// then the decode experts over the rows' picks) against each row decoded alone: the ids and
/// every pick's weighted row bit for bit, also on an expert-parallel rank holding half the
/// experts (`-0.0` for the rest); the picks' expert order against a stable sort.
fn decode_rows(cx: &mut Ctx, dtype: GgmlType) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let mut l = Layer::new(dev, s, &mut cx.rng, dtype, DECODE_ROWS, None)?;
    let n = TOP_K * DECODE_ROWS * D;
    let together = |l: &Layer| -> Result<(Vec<i32>, Vec<i32>, Vec<f32>)> {
        let norm = Norm {
            weight: &l.norm_d,
            eps: 1e-6,
        };
        let (x, wide) = (Span::of(&l.x), l.st.wide.as_ref().expect("invariant"));
        wide.route(dev, s, &l.w, &l.st.router, &x, Some(norm), DECODE_ROWS)?;
        let picks = wide.picks(dev, s, DECODE_ROWS)?;
        l.st.experts(dev, s, &l.w, norm, &x, &picks, DECODE_ROWS)?;
        let order = picks
            .order
            .as_ref()
            .expect("invariant: several rows are ordered");
        Ok((
            dev.download(s, &picks.ids)?,
            dev.download(s, order)?,
            dev.download(s, &Span::of(&l.st.rows).sub(0, n))?,
        ))
    };
    let alone = |l: &Layer| -> Result<(Vec<i32>, Vec<f32>)> {
        let norm = Norm {
            weight: &l.norm_d,
            eps: 1e-6,
        };
        let (mut ids, mut blocks) = (Vec::new(), vec![0f32; n]);
        for t in 0..DECODE_ROWS {
            let x = Span::of(&l.x).sub(t * D, D);
            l.st.route(dev, s, &l.w, norm, &x)?;
            l.st.experts(dev, s, &l.w, norm, &x, &l.st.picks(), 1)?;
            ids.extend(dev.download(s, &l.st.ids)?);
            let rows = dev.download(s, &l.st.rows)?;
            for (slot, row) in rows.chunks_exact(D).take(TOP_K).enumerate() {
                blocks[(slot * DECODE_ROWS + t) * D..][..D].copy_from_slice(row);
            }
        }
        Ok((ids, blocks))
    };
    let case = |what: &str| format!("{dtype} {DECODE_ROWS} rows{what}");
    for held in [None, Some(0), Some(EXPERTS / 2)] {
        if let Some(first) = held {
            l.hold(dev, s, first, EXPERTS / 2)?;
        }
        let what = held.map_or(String::new(), |f| {
            format!(", experts {f}..{}", f + EXPERTS / 2)
        });
        let (got_ids, order, got) = together(&l)?;
        // the picks grouped by expert, in pick order within one: a sorted permutation
        let mut want_order: Vec<i32> = (0..got_ids.len() as i32).collect();
        want_order.sort_by_key(|&p| got_ids[p as usize]);
        let misplaced = order
            .iter()
            .zip(&want_order)
            .filter(|(a, b)| a != b)
            .count();
        cx.report.exact("moe_order", case(&what), misplaced);
        let (want_ids, want) = alone(&l)?;
        let wrong = got_ids
            .iter()
            .zip(&want_ids)
            .filter(|(a, b)| a != b)
            .count();
        cx.report.exact("moe decode rows ids", case(&what), wrong);
        cx.report
            .exact("moe decode rows", case(&what), bit_mismatches(&got, &want));
    }
    Ok(())
}

/// Token rows of the prefill case: a GEMM tile and a cut one.
const PREFILL_ROWS: usize = 77;

/// A prefill step's routed experts (`MoeRows`) over `PREFILL_ROWS` rows against the CPU
/// layer's route and exact products row by row; an expert-parallel rank's slot blocks are the full run's bit for bit,
/// `-0.0` for the experts it does not hold.
fn prefill(cx: &mut Ctx, dtype: GgmlType) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let mut l = Layer::new(dev, s, &mut cx.rng, dtype, PREFILL_ROWS, None)?;
    let x0 = dev.download(s, &l.x)?;
    let run = |l: &Layer| -> Result<Vec<f32>> {
        let pre = l.st.wide.as_ref().expect("invariant: rows above one");
        let (x, xn) = (Span::of(&l.x), Span::of(&l.xn));
        dev.rms_norm(s, &x, &l.norm_d, 1e-6, &mut xn.clone())?;
        pre.route(dev, s, &l.w, &l.st.router, &xn, None, PREFILL_ROWS)?;
        pre.experts(dev, s, &l.w, &xn, PREFILL_ROWS, &Span::of(&l.st.rows))?;
        dev.download(s, &l.st.rows)
    };
    let blocks = run(&l)?;
    l.st.combine(dev, s, &Span::of(&l.x), false)?;
    let x1 = dev.download(s, &l.x)?;
    let pool = Pool::new(2);
    let exact = dequantized(&l);
    let (mut routes, mut want_x, mut want_rows) = (Vec::new(), x0.clone(), Vec::new());
    for (t, x) in want_x.chunks_exact_mut(D).enumerate() {
        let (route, rows) = reference(&l, &pool, &x0[t * D..(t + 1) * D], Products::Exact(&exact));
        combine_into(&rows, TOP_K, false, x);
        routes.push(route);
        want_rows.extend(rows);
    }
    let ids = dev.download(s, &l.st.wide.as_ref().expect("invariant").ids)?;
    let case = format!("{dtype} {PREFILL_ROWS} rows");
    cx.report
        .exact("moe_rows ids", case.clone(), wrong_ids(&ids, &routes));
    // f16 activations on the tensor cores against exact products: f16's unit roundoff is
    // 4.9e-4, grown by sums of D and FF terms and the SwiGLU between them; a wrong expert, row
    // or weight is off by the whole row
    cx.report.tol(
        "moe_rows",
        case,
        rel_err(&x1, &want_x, &want_rows),
        5e-3,
        "rel max",
    );
    let n = TOP_K * PREFILL_ROWS * D;
    dev.write(s, &x0, &mut l.x)?;
    for first in [0, EXPERTS / 2] {
        l.hold(dev, s, first, EXPERTS / 2)?;
        let got = run(&l)?;
        let mut want = blocks[..n].to_vec();
        for (a, &e) in ids.iter().enumerate() {
            if !(first..first + EXPERTS / 2).contains(&(e as usize)) {
                let (t, slot) = (a / TOP_K, a % TOP_K);
                want[(slot * PREFILL_ROWS + t) * D..][..D].fill(-0.0);
            }
        }
        cx.report.exact(
            "moe_rows ep",
            format!("{dtype} experts {first}..{}", first + EXPERTS / 2),
            bit_mismatches(&got[..n], &want),
        );
    }
    Ok(())
}
