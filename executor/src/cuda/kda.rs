//! Kimi delta attention (kimi-linear) on a CUDA rank: the layer's weights (loaded and checked by
//! the CPU backend's `KdaWeights::take`, then uploaded), the rank's KDA buffers and per-layer
//! state, and the `kda_pre` and `kda_core` segments with the math of the CPU backend's
//! `segments::kda_pre` and `kda_core`. The projections are ordinary matvecs with the canonical
//! chunk counts of a whole K (`attn_q/k/v`, `ssm_f_a`, `ssm_beta`, `ssm_g_a` read the normed
//! input; `ssm_f_b` and `ssm_g_b` their low-rank outputs), all of them in `kda_pre`; the
//! convolutions and q/k norms are `kda_conv_f32`, the gates, delta rule and gated output norm
//! `kda_delta_f32` (kernels/kda.cu), so `kda_core` is one launch. The segments split the work
//! differently from the CPU's, the values are the same.
//!
//! State: one buffer per KDA layer, the q, k and v convolution windows (per channel, oldest
//! first, as the CPU's) then each held head's `d x d` recurrent state, key-major (the transpose
//! of the CPU's layout, see kernels/kda.cu). It is updated in place on the rank's compute
//! stream, so its address never alternates and a step is capturable; a step at position 0
//! starts from zeros (the kernels read the step's position), as the CPU's state does. A
//! tensor-parallel rank holds whole heads (its shards of the head-split tensors) and their
//! state, and every head is computed alone, so its bits are the 1-rank plan's.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice, LaunchConfig};

use super::batched::{RowProducts, RowsAt};
use super::device::{CudaDevice, DeviceBuffer};
use super::matvec::Norm;
use super::span::Span;
use super::weights::{full_chunks, grid, upload_matrix, DeviceWeight, LayerLoad};
use crate::layer_weights::KdaWeights as HostKda;

/// The widest KDA head the kernels take (KDA_MAX_DIM in kernels/kda.cu).
pub const MAX_KDA_HEAD_DIM: usize = 256;
/// The most convolution taps (KDA_MAX_TAPS), and the tokens a block of `kda_conv_f32` takes
/// (KDA_CONV_ROWS).
const MAX_KDA_TAPS: usize = 8;
const KDA_CONV_ROWS: usize = 8;
/// The state entries of its row a `kda_delta_f32` thread holds in registers (KDA_HELD); the
/// rest of the row sits in the block's dynamic shared memory.
const KDA_HELD: usize = 64;

/// One KDA layer's weights on the device (all but `attn_output`, which the rank keeps).
pub(super) struct KdaWeights {
    pub q: DeviceWeight,
    pub k: DeviceWeight,
    pub v: DeviceWeight,
    /// The q, k and v convolutions' taps, channel after channel, q channels first.
    conv: DeviceBuffer<f32>,
    taps: usize,
    pub f_a: DeviceWeight,
    pub f_b: DeviceWeight,
    dt_bias: DeviceBuffer<f32>,
    a: DeviceBuffer<f32>,
    pub beta: DeviceWeight,
    pub g_a: DeviceWeight,
    pub g_b: DeviceWeight,
    o_norm: DeviceBuffer<f32>,
    /// The bounded decay's lower bound (glm5-next), else softplus decay.
    bound: Option<f32>,
    /// The q/k L2 norms' own epsilon (glm5-next), else the model's.
    l2_eps: Option<f32>,
    heads: usize,
    head_dim: usize,
}

impl KdaWeights {
    /// Takes layer `l`'s KDA shards out of `w` and uploads them; the second value is the
    /// layer's `attn_output` columns.
    pub fn take(ld: &mut LayerLoad) -> Result<(KdaWeights, DeviceWeight)> {
        let (plan, l, dev, s) = (ld.plan, ld.l, ld.dev, ld.s);
        let w = &mut *ld.w;
        let host = HostKda::take(plan, l, w)?;
        let (heads, head_dim) = (host.heads(), host.head_dim());
        if head_dim == 0 || head_dim > MAX_KDA_HEAD_DIM {
            bail!("layer {l}: KDA heads of {head_dim} values; the cuda backend takes heads of 1 to {MAX_KDA_HEAD_DIM}");
        }
        if !(2..=MAX_KDA_TAPS).contains(&host.taps) {
            bail!(
                "layer {l}: KDA convolutions of {} taps; the cuda backend takes 2 to {MAX_KDA_TAPS}",
                host.taps
            );
        }
        let HostKda {
            q,
            k,
            v,
            conv,
            taps,
            f_a,
            f_b,
            dt_bias,
            a,
            beta,
            g_a,
            g_b,
            o_norm,
            o,
            bound,
            l2_eps,
        } = host;
        let up = |m| upload_matrix(dev, s, m);
        let kda = KdaWeights {
            q: up(q)?,
            k: up(k)?,
            v: up(v)?,
            conv: dev.upload(s, &conv.concat())?,
            taps,
            f_a: up(f_a)?,
            f_b: up(f_b)?,
            dt_bias: dev.upload(s, &dt_bias)?,
            a: dev.upload(s, &a)?,
            beta: up(beta)?,
            g_a: up(g_a)?,
            g_b: up(g_b)?,
            o_norm: dev.upload(s, &o_norm)?,
            bound,
            l2_eps,
            heads,
            head_dim,
        };
        Ok((kda, up(o)?))
    }

    /// Channels of q (and of k, v): the held heads' values.
    fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Values of the layer's state: the three windows, then the recurrent states.
    fn state_len(&self) -> usize {
        3 * self.width() * (self.taps - 1) + self.heads * self.head_dim * self.head_dim
    }
}

/// A rank's KDA buffers (sized for its widest KDA layer) and one state per KDA layer.
pub(super) struct KdaState {
    /// The buffers of prefill steps over token rows, on a rank that takes them.
    rows: Option<KdaRows>,
    xn: DeviceBuffer<f32>,
    /// q, k, v projections, one after the other, before their convolutions.
    projected: DeviceBuffer<f32>,
    /// q, k, v after the convolutions (q and k normalized).
    qkv: DeviceBuffer<f32>,
    f_low: DeviceBuffer<f32>,
    g_low: DeviceBuffer<f32>,
    /// The raw decay (`ssm_f_b` output), the raw rate (`ssm_beta`) and the raw output gate.
    f: DeviceBuffer<f32>,
    beta: DeviceBuffer<f32>,
    gate: DeviceBuffer<f32>,
    /// By the rank's layer index (`None` for other layers): a state per sequence slot.
    states: Vec<Option<DeviceBuffer<f32>>>,
    /// A speculative plan's kept states (`keeps - 1` a slot) and spans taken in, per layer as
    /// `states` (kernels/kda.cu).
    kept: Vec<Option<(DeviceBuffer<f32>, DeviceBuffer<u32>)>>,
    /// Most rows of a span whose states are kept (0: none are).
    keeps: usize,
    sequences: usize,
    eps: f32,
}

impl KdaState {
    /// The state of a rank whose layers are `layers` (`Some` for KDA layers), if any is KDA;
    /// `d` is the model's embedding width and `eps` its norms' epsilon.
    /// Prefill steps of up to `max_rows` token rows run over the rows at once.
    /// A speculative plan's verify spans of up to `keeps` rows keep the state after each row
    /// but the last (0: none are kept).
    pub fn new(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        (d, eps): (usize, f32),
        layers: &[Option<&KdaWeights>],
        (max_rows, sequences, keeps): (usize, usize, usize),
    ) -> Result<Option<KdaState>> {
        let held: Vec<&KdaWeights> = layers.iter().flatten().copied().collect();
        if held.is_empty() {
            return Ok(None);
        }
        let most = |f: fn(&KdaWeights) -> usize| held.iter().map(|&k| f(k)).max().unwrap_or(1);
        let sequences = sequences.max(1);
        let mut states = Vec::new();
        for k in layers {
            states.push(match k {
                // a state per sequence slot, slot after slot
                Some(k) => Some(dev.alloc(s, k.state_len() * sequences)?),
                None => None,
            });
        }
        let mut kept = Vec::new();
        for k in layers {
            kept.push(match k {
                Some(k) if keeps > 1 => Some((
                    dev.alloc(s, k.state_len() * (keeps - 1) * sequences)?,
                    dev.alloc(s, 3 * sequences)?,
                )),
                _ => None,
            });
        }
        let rows = match max_rows {
            0 | 1 => None,
            n => Some(KdaRows {
                rows: n,
                projected: dev.alloc(s, 3 * n * most(KdaWeights::width))?,
                qkv: dev.alloc(s, 3 * n * most(KdaWeights::width))?,
                f_low: dev.alloc(s, n * most(|k| k.f_a.rows))?,
                g_low: dev.alloc(s, n * most(|k| k.g_a.rows))?,
                f: dev.alloc(s, n * most(KdaWeights::width))?,
                beta: dev.alloc(s, n * most(|k| k.heads))?,
                gate: dev.alloc(s, n * most(KdaWeights::width))?,
            }),
        };
        Ok(Some(KdaState {
            rows,
            xn: dev.alloc(s, d)?,
            projected: dev.alloc(s, 3 * most(KdaWeights::width))?,
            qkv: dev.alloc(s, 3 * most(KdaWeights::width))?,
            f_low: dev.alloc(s, most(|k| k.f_a.rows))?,
            g_low: dev.alloc(s, most(|k| k.g_a.rows))?,
            f: dev.alloc(s, most(KdaWeights::width))?,
            beta: dev.alloc(s, most(|k| k.heads))?,
            gate: dev.alloc(s, most(KdaWeights::width))?,
            states,
            kept,
            keeps,
            sequences,
            eps,
        }))
    }

    /// `kda_pre` of a batched step's rows (each in its sequence slot, `at`): every projection
    /// over the rows with the one-row decode's bits, then the convolutions and q/k norms of
    /// each sequence's rows in order on its slot's windows.
    pub fn pre_batched(
        &self,
        p: RowProducts,
        k: &KdaWeights,
        layer: usize,
        norm: Norm,
        x: (&Span<f32>, &Span<f32>),
        at: RowsAt,
    ) -> Result<()> {
        let (dev, s) = (p.dev, p.s);
        let rows = at.pos.len();
        let sp = self.row_spans(k, rows)?;
        // as the one-row `products`
        p.normed(&[&k.q, &k.k, &k.v], x, norm, &[&sp.q, &sp.k, &sp.v])?;
        let low = [&sp.f_low, &sp.beta, &sp.g_low];
        p.normed(&[&k.f_a, &k.beta, &k.g_a], x, norm, &low)?;
        p.plain(&k.f_b, &sp.f_low, &sp.f)?;
        p.plain(&k.g_b, &sp.g_low, &sp.gate)?;
        self.conv_rows(dev, s, k, layer, &sp, (at.pos, Some(at.slots)))
    }

    /// `kda_core` of a batched step's rows: the gates, the delta rule of each sequence's rows
    /// in order on its slot's states and the gated output norm, into the rows of `att`.
    pub fn core_batched(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        k: &KdaWeights,
        layer: usize,
        at: RowsAt,
        att: &Span<f32>,
    ) -> Result<()> {
        let sp = self.row_spans(k, at.pos.len())?;
        self.core_rows(dev, s, k, layer, &sp, att, (at.pos, Some(at.slots)))
    }

    /// Layer `layer`'s keeping for its kernels (none outside a speculative plan); `windows`
    /// offsets the kept states to the part a kernel holds (the delta rule's states).
    fn keeping(&self, k: &KdaWeights, layer: usize, windows: usize) -> Option<Keeping> {
        let (kept, track) = self.kept.get(layer)?.as_ref()?;
        let kept = Span::of(kept);
        Some(Keeping {
            kept: kept.sub(windows, kept.len() - windows),
            track: Span::of(track),
            keeps: self.keeps,
            state_len: k.state_len(),
        })
    }

    /// Records, after layer `layer`'s kernels, the spans of the step's rows at `pos` (in
    /// `slots` for a batched step; else one span of slot 0) as taken in by its state.
    fn track(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        k: &KdaWeights,
        layer: usize,
        (pos, slots): (&Span<u32>, Option<&Span<u32>>),
        rows: usize,
    ) -> Result<()> {
        match self.keeping(k, layer, 0) {
            Some(keep) => dev.kda_track(s, (pos, slots), rows, &keep),
            None => Ok(()),
        }
    }

    /// The rows in sequence slots `slots` (a batched step's), for layer `k`'s kernels; `None`
    /// for a prefill step's rows, all of slot 0.
    fn slotted<'a>(&self, k: &KdaWeights, slots: Option<&'a Span<u32>>) -> Option<Slotted<'a>> {
        slots.map(|slots| Slotted {
            slots,
            stride: k.state_len(),
            sequences: self.sequences,
        })
    }

    /// `kda_pre`: every projection (the normed input's, then the low-rank gates' second
    /// halves), then the convolutions (advancing layer `layer`'s windows, from zeros at
    /// position `pos[0]` 0) and the q/k norms.
    #[allow(clippy::too_many_arguments)]
    pub fn pre(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        k: &KdaWeights,
        layer: usize,
        norm: Norm,
        x: &Span<f32>,
        pos: &Span<u32>,
    ) -> Result<()> {
        let width = k.width();
        let projected = Span::of(&self.projected).sub(0, 3 * width);
        let xn = Span::of(&self.xn).sub(0, x.len());
        let (f_low, g_low) = (
            Span::of(&self.f_low).sub(0, k.f_a.rows),
            Span::of(&self.g_low).sub(0, k.g_a.rows),
        );
        let qkv_out = [0, 1, 2].map(|i| projected.sub(i * width, width));
        self.products(dev, s, &[&k.q, &k.k, &k.v], x, norm, &xn, &qkv_out)?;
        let low_out = [
            f_low.clone(),
            Span::of(&self.beta).sub(0, k.heads),
            g_low.clone(),
        ];
        self.products(dev, s, &[&k.f_a, &k.beta, &k.g_a], x, norm, &xn, &low_out)?;
        let f = Span::of(&self.f).sub(0, width);
        dev.matvec(s, &k.f_b, &f_low, full_chunks(&k.f_b), &mut f.clone())?;
        let gate = Span::of(&self.gate).sub(0, width);
        dev.matvec(s, &k.g_b, &g_low, full_chunks(&k.g_b), &mut gate.clone())?;
        let state = self.state(layer)?;
        dev.kda_conv(
            s,
            &projected,
            &Span::of(&k.conv),
            &state.sub(0, 3 * width * (k.taps - 1)),
            &Span::of(&self.qkv).sub(0, 3 * width),
            (k.heads, k.head_dim, k.taps),
            k.l2_eps.unwrap_or(self.eps),
            pos,
            None,
            self.keeping(k, layer, 0).as_ref(),
        )
    }

    /// `kda_core`: the gates, the delta rule on layer `layer`'s recurrent states (zeros at
    /// position `pos[0]` 0) and the gated output norm, into `att`.
    pub fn core(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        k: &KdaWeights,
        layer: usize,
        att: &Span<f32>,
        pos: &Span<u32>,
    ) -> Result<()> {
        let width = k.width();
        if att.len() != width {
            bail!(
                "kda_core: {} output values for {} heads of {}",
                att.len(),
                k.heads,
                k.head_dim
            );
        }
        let state = self.state(layer)?;
        let windows = 3 * width * (k.taps - 1);
        let gates = KdaGates {
            f: Span::of(&self.f).sub(0, width),
            dt_bias: Span::of(&k.dt_bias),
            a: Span::of(&k.a),
            beta: Span::of(&self.beta).sub(0, k.heads),
            gate: Span::of(&self.gate).sub(0, width),
            norm: Span::of(&k.o_norm),
            bound: k.bound,
        };
        dev.kda_delta(
            s,
            &state.sub(windows, k.heads * k.head_dim * k.head_dim),
            &Span::of(&self.qkv).sub(0, 3 * width),
            &gates,
            att,
            (k.heads, k.head_dim),
            self.eps,
            pos,
            None,
            self.keeping(k, layer, windows).as_ref(),
        )?;
        self.track(dev, s, k, layer, (pos, None), 1)
    }

    /// The spans of a prefill step's `rows` token rows for layer `k`: what the products
    /// write, before [`Self::conv_rows`] and [`Self::core_rows`].
    pub fn row_spans(&self, k: &KdaWeights, rows: usize) -> Result<KdaRowSpans> {
        let b = self
            .rows
            .as_ref()
            .filter(|b| rows <= b.rows)
            .ok_or_else(|| {
                anyhow!("a KDA prefill step of {rows} rows on a rank allocated for fewer")
            })?;
        let width = k.width();
        let projected = Span::of(&b.projected).sub(0, 3 * rows * width);
        Ok(KdaRowSpans {
            q: projected.sub(0, rows * width),
            k: projected.sub(rows * width, rows * width),
            v: projected.sub(2 * rows * width, rows * width),
            projected,
            qkv: Span::of(&b.qkv).sub(0, 3 * rows * width),
            f_low: Span::of(&b.f_low).sub(0, rows * k.f_a.rows),
            g_low: Span::of(&b.g_low).sub(0, rows * k.g_a.rows),
            f: Span::of(&b.f).sub(0, rows * width),
            beta: Span::of(&b.beta).sub(0, rows * k.heads),
            gate: Span::of(&b.gate).sub(0, rows * width),
        })
    }

    /// The convolutions and q/k norms of a step's rows (after its products into `spans`),
    /// advancing layer `layer`'s windows token by token: a prefill step's from its position
    /// `pos[0]` in slot 0, a batched step's (`slots`) each sequence's rows on its slot's.
    pub fn conv_rows(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        k: &KdaWeights,
        layer: usize,
        spans: &KdaRowSpans,
        (pos, slots): (&Span<u32>, Option<&Span<u32>>),
    ) -> Result<()> {
        let state = self.state(layer)?;
        let slotted = self.slotted(k, slots);
        // a batched step's kernels take every slot's windows, a prefill step's slot 0's
        let windows = match slotted {
            Some(_) => state,
            None => state.sub(0, 3 * k.width() * (k.taps - 1)),
        };
        dev.kda_conv(
            s,
            &spans.projected,
            &Span::of(&k.conv),
            &windows,
            &spans.qkv,
            (k.heads, k.head_dim, k.taps),
            k.l2_eps.unwrap_or(self.eps),
            pos,
            slotted,
            self.keeping(k, layer, 0).as_ref(),
        )
    }

    /// The gates, the delta rule and the gated output norm of a step's rows (a prefill step's
    /// token by token from its position `pos[0]` in slot 0, a batched step's each sequence's
    /// on its slot's states), into the rows of `att`.
    #[allow(clippy::too_many_arguments)]
    pub fn core_rows(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        k: &KdaWeights,
        layer: usize,
        spans: &KdaRowSpans,
        att: &Span<f32>,
        (pos, slots): (&Span<u32>, Option<&Span<u32>>),
    ) -> Result<()> {
        let (width, state) = (k.width(), self.state(layer)?);
        let windows = 3 * width * (k.taps - 1);
        let slotted = self.slotted(k, slots);
        let states = match slotted {
            Some(_) => state.sub(windows, state.len() - windows),
            None => state.sub(windows, k.heads * k.head_dim * k.head_dim),
        };
        let gates = KdaGates {
            f: spans.f.clone(),
            dt_bias: Span::of(&k.dt_bias),
            a: Span::of(&k.a),
            beta: spans.beta.clone(),
            gate: spans.gate.clone(),
            norm: Span::of(&k.o_norm),
            bound: k.bound,
        };
        dev.kda_delta(
            s,
            &states,
            &spans.qkv,
            &gates,
            att,
            (k.heads, k.head_dim),
            self.eps,
            pos,
            slotted,
            self.keeping(k, layer, windows).as_ref(),
        )?;
        self.track(dev, s, k, layer, (pos, slots), att.len() / width)
    }

    fn state(&self, layer: usize) -> Result<Span<f32>> {
        self.states[layer]
            .as_ref()
            .map(Span::of)
            .ok_or_else(|| anyhow!("a KDA segment on a layer without KDA state"))
    }

    /// `ys[i] = ws[i] (rms_norm(x))`: one launch when the weights share dtype and chunk count
    /// (the norm folded in), else the norm into `xn` and a matvec each; the same bits.
    #[allow(clippy::too_many_arguments)]
    fn products(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        ws: &[&DeviceWeight],
        x: &Span<f32>,
        norm: Norm,
        xn: &Span<f32>,
        ys: &[Span<f32>],
    ) -> Result<()> {
        let chunks = full_chunks(ws[0]);
        if ws
            .iter()
            .all(|w| w.dtype == ws[0].dtype && full_chunks(w) == chunks)
        {
            return dev.matvec_many(s, ws, x, Some(norm), chunks, ys);
        }
        dev.rms_norm(s, x, norm.weight, norm.eps, &mut xn.clone())?;
        for (w, y) in ws.iter().zip(ys) {
            dev.matvec(s, w, xn, full_chunks(w), &mut y.clone())?;
        }
        Ok(())
    }
}

/// A rank's KDA buffers for prefill steps of up to `rows` token rows (each as `KdaState`'s
/// one-row buffers, a row per token).
struct KdaRows {
    rows: usize,
    projected: DeviceBuffer<f32>,
    qkv: DeviceBuffer<f32>,
    f_low: DeviceBuffer<f32>,
    g_low: DeviceBuffer<f32>,
    f: DeviceBuffer<f32>,
    beta: DeviceBuffer<f32>,
    gate: DeviceBuffer<f32>,
}

/// A prefill step's KDA rows of one layer: the products' outputs (q, k and v are the three
/// parts of `projected`, each `rows` rows), then the convolved `qkv` in the same layout.
pub(super) struct KdaRowSpans {
    pub q: Span<f32>,
    pub k: Span<f32>,
    pub v: Span<f32>,
    projected: Span<f32>,
    qkv: Span<f32>,
    pub f_low: Span<f32>,
    pub g_low: Span<f32>,
    pub f: Span<f32>,
    pub beta: Span<f32>,
    pub gate: Span<f32>,
}

/// The per-channel and per-head inputs of `kda_delta` besides q, k, v and the state.
pub(super) struct KdaGates {
    /// The raw decay, `heads * d` (`ssm_f_b`'s output).
    pub f: Span<f32>,
    /// `ssm_dt.bias`, `heads * d`.
    pub dt_bias: Span<f32>,
    /// `ssm_a` (`-exp(A_log)`), one per head.
    pub a: Span<f32>,
    /// The raw rate, one per head (`ssm_beta`'s output).
    pub beta: Span<f32>,
    /// The raw output gate, `heads * d` (`ssm_g_b`'s output).
    pub gate: Span<f32>,
    /// `ssm_norm.weight`, `d`.
    pub norm: Span<f32>,
    /// The bounded decay's lower bound (the CPU kernel `decay_gate_bounded`), else softplus.
    pub bound: Option<f32>,
}

fn int(n: usize) -> i32 {
    i32::try_from(n).expect("invariant: kernel sizes fit in i32")
}

/// Threads of a block with one thread per value of a head.
fn head_block(d: usize) -> u32 {
    assert!(
        (1..=MAX_KDA_HEAD_DIM).contains(&d),
        "kda: heads of {d} values; 1 to {MAX_KDA_HEAD_DIM} are supported"
    );
    d.next_multiple_of(32) as u32
}

impl CudaDevice {
    /// Tokens in order through the q, k and v convolutions (the CPU kernel `conv_step` on
    /// each, `x` and `out` holding q, k and v one after the other, each as many rows of
    /// `heads * hd` as there are tokens; `window` the three windows, `w` their taps), then
    /// `l2_norm_heads` on the q and k heads, as the CPU runs them for `heads` heads of `hd`.
    /// The first token is at position `pos[0]`; at 0 the windows are read as zeros.
    /// With `slotted` (a batched step), row `r` is at `pos[r]` in its slot, whose windows
    /// start `slotted.stride` values past the previous slot's in `window` (kernels/kda.cu).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kda_conv(
        &self,
        s: &CudaStream,
        x: &Span<f32>,
        w: &Span<f32>,
        window: &Span<f32>,
        out: &Span<f32>,
        (heads, hd, taps): (usize, usize, usize),
        eps: f32,
        pos: &Span<u32>,
        slotted: Option<Slotted>,
        keep: Option<&Keeping>,
    ) -> Result<()> {
        let channels = 3 * heads * hd;
        let rows = x.len() / channels.max(1);
        assert!(
            (2..=MAX_KDA_TAPS).contains(&taps)
                && rows > 0
                && x.len() == rows * channels
                && out.len() == x.len()
                && w.len() == channels * taps
                && slotted
                    .as_ref()
                    .map_or(window.len() == channels * (taps - 1), |sl| sl.holds(
                        window,
                        channels * (taps - 1),
                        rows,
                        pos
                    ))
                && !pos.is_empty(),
            "kda_conv: {heads} heads of {hd}, {taps} taps: x {}, weights {}, window {}, out {}",
            x.len(),
            w.len(),
            window.len(),
            out.len()
        );
        // the CPU's l2_norm_heads constants, computed as it computes them
        let n = hd as f32;
        let (l2_eps, after) = (eps / n, 1.0 / n.sqrt());
        let (xp, wp, winp, op, pp) = (x.addr(), w.addr(), window.addr(), out.addr(), pos.addr());
        let (h, d, t, r) = (int(heads), int(hd), int(taps), int(rows));
        let (sp, stride) = Slotted::args(slotted.as_ref());
        let (tp, kp, keeps, state_len) = Keeping::args(keep);
        // a block per span of a batched step (one starting at each row, at most), else per
        // KDA_CONV_ROWS tokens
        let blocks = if slotted.is_some() {
            rows
        } else {
            rows.div_ceil(KDA_CONV_ROWS)
        };
        let cfg = LaunchConfig {
            grid_dim: (3 * heads as u32, blocks as u32, 1),
            block_dim: (head_block(hd), 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(s, "kda_conv_f32", cfg, |a| {
            a.arg(&xp).arg(&wp).arg(&winp).arg(&op);
            a.arg(&h)
                .arg(&d)
                .arg(&t)
                .arg(&l2_eps)
                .arg(&after)
                .arg(&r)
                .arg(&pp)
                .arg(&sp)
                .arg(&stride);
            a.arg(&tp).arg(&kp).arg(&keeps).arg(&state_len);
        })
    }

    /// The decay gate and rate (the CPU kernel `decay_gate`, or `decay_gate_bounded` with
    /// `g.bound`, and `sigmoid`), the gated delta rule
    /// on `heads` key-major states of `d x d` in `states` (the CPU kernel `delta_rule`, in
    /// place) and `gated_norm` with `eps`, of the q, k, v in `qkv`, into `out`: for each of
    /// the tokens in order (`kda_conv`'s layout of `qkv`; a row a token of the gates and
    /// `out`). The first token is at position `pos[0]`; at 0 the states are read as zeros.
    /// With `slotted` (a batched step), row `r` is at `pos[r]` in its slot, whose states
    /// start `slotted.stride` values past the previous slot's in `states`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kda_delta(
        &self,
        s: &CudaStream,
        states: &Span<f32>,
        qkv: &Span<f32>,
        g: &KdaGates,
        out: &Span<f32>,
        (heads, d): (usize, usize),
        eps: f32,
        pos: &Span<u32>,
        slotted: Option<Slotted>,
        keep: Option<&Keeping>,
    ) -> Result<()> {
        let width = heads * d;
        let rows = out.len() / width.max(1);
        assert!(
            slotted
                .as_ref()
                .map_or(states.len() == heads * d * d, |sl| sl.holds(
                    states,
                    heads * d * d,
                    rows,
                    pos
                ))
                && rows > 0
                && qkv.len() == 3 * rows * width
                && [g.f.len(), g.gate.len(), out.len()] == [rows * width; 3]
                && g.dt_bias.len() == width
                && g.a.len() == heads
                && g.beta.len() == rows * heads
                && g.norm.len() == d
                && !pos.is_empty(),
            "kda_delta: {heads} heads of {d}: states {}, qkv {}, out {}",
            states.len(),
            qkv.len(),
            out.len()
        );
        let scale = 1.0 / (d as f32).sqrt();
        let (sp, qp, op) = (states.addr(), qkv.addr(), out.addr());
        let (fp, dtp, ap, bp) = (g.f.addr(), g.dt_bias.addr(), g.a.addr(), g.beta.addr());
        let (gp, np, pp) = (g.gate.addr(), g.norm.addr(), pos.addr());
        let (h, dd, r) = (int(heads), int(d), int(rows));
        let (bounded, lb) = (i32::from(g.bound.is_some()), g.bound.unwrap_or(0.0));
        let threads = head_block(d);
        // the rows' entries past the held ones, a column per thread
        let smem = d.saturating_sub(KDA_HELD) * threads as usize * 4;
        self.allow_dynamic_shared("kda_delta_f32", 3 * MAX_KDA_HEAD_DIM * 4, smem)?;
        let (slp, stride) = Slotted::args(slotted.as_ref());
        let (tp, kp, keeps, state_len) = Keeping::args(keep);
        // a block per head and span of a batched step (one starting at each row, at most)
        let spans = if slotted.is_some() { rows } else { 1 };
        let cfg = LaunchConfig {
            grid_dim: (heads as u32, spans as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        self.launch(s, "kda_delta_f32", cfg, |a| {
            a.arg(&sp).arg(&qp).arg(&fp).arg(&dtp).arg(&ap).arg(&bp);
            a.arg(&gp)
                .arg(&np)
                .arg(&op)
                .arg(&h)
                .arg(&dd)
                .arg(&scale)
                .arg(&eps)
                .arg(&bounded)
                .arg(&lb)
                .arg(&r)
                .arg(&pp)
                .arg(&slp)
                .arg(&stride);
            a.arg(&tp).arg(&kp).arg(&keeps).arg(&state_len);
        })
    }

    /// After a KDA layer's kernels: the spans of the `rows` rows at `pos` (in `slots` for a
    /// batched step; else one span of slot 0) as taken in by the state `keep` tracks
    /// (`kda_track_u32`).
    pub(super) fn kda_track(
        &self,
        s: &CudaStream,
        (pos, slots): (&Span<u32>, Option<&Span<u32>>),
        rows: usize,
        keep: &Keeping,
    ) -> Result<()> {
        assert!(
            rows > 0 && pos.len() >= rows && slots.is_none_or(|x| x.len() >= rows),
            "kda_track: {rows} rows"
        );
        let (pp, sp, tp) = (pos.addr(), slots.map_or(0, Span::addr), keep.track.addr());
        let (r, keeps) = (int(rows), int(keep.keeps));
        self.launch(s, "kda_track_u32", grid(rows, 128), |a| {
            a.arg(&pp).arg(&sp).arg(&r).arg(&tp).arg(&keeps);
        })
    }
}

/// A speculative plan's keeping of one KDA layer, for its kernels: the kept states (`keeps -
/// 1` a slot, each `state_len` values, from the part the kernel holds), and the spans each
/// slot took in last.
pub(super) struct Keeping {
    pub kept: Span<f32>,
    pub track: Span<u32>,
    pub keeps: usize,
    pub state_len: usize,
}

impl Keeping {
    /// The kernels' `track`, `kept`, `keeps` and `state_len` arguments (null addresses
    /// without keeping).
    fn args(keep: Option<&Keeping>) -> (u64, u64, i32, i64) {
        keep.map_or((0, 0, 0, 0), |k| {
            let len = i64::try_from(k.state_len).expect("invariant: state sizes fit in i64");
            (k.track.addr(), k.kept.addr(), int(k.keeps), len)
        })
    }
}

/// The rows of a batched step in sequence slots, for the KDA kernels: row `r` belongs to slot
/// `slots[r]` (or is a pad row, `PAD_SLOT`), whose windows and state are `stride` values past
/// the previous slot's, `sequences` slots in all.
pub(super) struct Slotted<'a> {
    pub slots: &'a Span<u32>,
    pub stride: usize,
    pub sequences: usize,
}

impl Slotted<'_> {
    /// Whether `buffer` holds every slot's `len` values and the rows' slots and positions are
    /// there.
    fn holds(&self, buffer: &Span<f32>, len: usize, rows: usize, pos: &Span<u32>) -> bool {
        self.sequences > 0
            && self.stride >= len
            && buffer.len() >= (self.sequences - 1) * self.stride + len
            && self.slots.len() >= rows
            && pos.len() >= rows
    }

    /// The kernels' `slots` and `slot_len` arguments (a null address without slots).
    fn args(slotted: Option<&Slotted>) -> (u64, i64) {
        slotted.map_or((0, 0), |sl| {
            let stride = i64::try_from(sl.stride).expect("invariant: state offsets fit in i64");
            (sl.slots.addr(), stride)
        })
    }
}
