//! KDA on the device against the CPU backend: `kda_conv_f32` against `conv_step` and
//! `l2_norm_heads`, `kda_delta_f32` against `decay_gate` (or `decay_gate_bounded` with
//! glm5-next's lower bound and its own L2 epsilon), `sigmoid`, `delta_rule` and
//! `gated_norm`, over several tokens so that the windows and recurrent states carry (awkward
//! head counts and dims, 2 to 4 taps, decays on both branches of softplus); the windows must
//! match bit for bit (they are copies of the inputs), the rest within a normwise relative
//! bound (CUDA's expf and logf may round an ulp away from the host's). Then both kernels
//! captured in a graph and replayed token by token against eager, bit for bit, the state
//! included; and a prefill step's tokens in one launch of each against a launch pair a token,
//! bit for bit. Each row names the case, the worst token and value, and how many values differ
//! in their bits, so a failure can be read from the table alone.

use std::sync::Arc;

use anyhow::Result;
use cudarc::driver::DeviceSlice;

use super::exact::report_replay;
use super::{bit_mismatches, random, Ctx};
use crate::cpu::kernels::{
    conv_step, decay_gate, decay_gate_bounded, delta_rule, gated_norm, l2_norm_heads, sigmoid,
    DeltaInputs, KdaState,
};
use crate::cuda::device::DeviceBuffer;
use crate::cuda::kda::{KdaGates, Keeping, Slotted};
use crate::cuda::ops::PAD_SLOT;
use crate::cuda::{capture, CudaDevice, CudaStream, Span};

/// The epsilon of the q/k L2 norms and of the output norm (the model's `rms_eps`).
const EPS: f32 = 1e-5;

/// glm5-next's decay: its lower bound and its q/k L2 norms' own epsilon.
const GLM5_DECAY: Decay = Decay {
    bound: Some(-5.0),
    l2_eps: 1e-6,
};

/// kimi-linear's decay: softplus, the model's epsilon for the L2 norms.
const KIMI_DECAY: Decay = Decay {
    bound: None,
    l2_eps: EPS,
};

/// How a layer decays its state and normalizes q and k.
#[derive(Clone, Copy)]
struct Decay {
    bound: Option<f32>,
    l2_eps: f32,
}

impl Decay {
    /// The case name's suffix.
    fn name(self) -> &'static str {
        match self.bound {
            Some(_) => ", bounded decay (glm5-next)",
            None => "",
        }
    }
}

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    // (heads, head dim, taps, tokens)
    for case in [
        (1, 32, 4, 6),
        (4, 32, 4, 8),
        (3, 64, 2, 5),
        (2, 128, 4, 8),
        (5, 96, 3, 6),
        (2, 17, 4, 5),
        (1, 256, 4, 4),
    ] {
        tokens(cx, case, KIMI_DECAY)?;
    }
    for case in [(4, 32, 4, 8), (3, 128, 4, 6), (2, 17, 3, 5)] {
        tokens(cx, case, GLM5_DECAY)?;
    }
    graph(cx, KIMI_DECAY)?;
    graph(cx, GLM5_DECAY)?;
    // more tokens than a convolution block (8), fewer than the window (taps - 1), a state past
    // the held registers (head dim 256)
    for (case, decay) in [
        ((4, 32, 4, 37), KIMI_DECAY),
        ((2, 128, 4, 9), KIMI_DECAY),
        ((2, 128, 4, 2), KIMI_DECAY),
        ((1, 256, 4, 11), KIMI_DECAY),
        ((3, 96, 3, 5), GLM5_DECAY),
    ] {
        rows(cx, case, decay)?;
    }
    for (case, decay) in [((4, 32, 4), KIMI_DECAY), ((2, 128, 3), GLM5_DECAY)] {
        slotted(cx, case, decay)?;
        // (batched, drafted rows, accepted, most rows kept): a verify step; a prefill chunk of
        // more rows than a convolution block that returns past its first block's rows
        kept(cx, case, decay, (true, 4, 2, 4))?;
        kept(cx, case, decay, (false, 10, 9, 12))?;
    }
    Ok(())
}

/// A speculative plan's keeping after three tokens, in sequence slot 1 of 2 (a batched step's
/// launches) or in the one slot of a prefill step's launches (`slotted` false): a span of
/// `drafted` rows, then one of three rows at the position after its first `accepted` (the
/// rest rejected), with states kept for spans of up to `keeps` rows, against the
/// token-by-token runs of the drafted rows and of the accepted and new rows: outputs and the
/// states after, bit for bit; then a span at a position before the rows kept, whose outputs
/// must all be NaN.
fn kept(
    cx: &mut Ctx,
    (heads, hd, taps): (usize, usize, usize),
    decay: Decay,
    (slotted, drafted, accepted, keeps): (bool, usize, usize, usize),
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let l = Layer::new(cx, heads, hd, taps, decay);
    let w = l.width();
    let slot_len = windows(&l) + heads * hd * hd;
    let before: Vec<Token> = (0..3).map(|_| Token::new(cx, &l)).collect();
    let drafted: Vec<Token> = (0..drafted).map(|_| Token::new(cx, &l)).collect();
    let again: Vec<Token> = (0..3).map(|_| Token::new(cx, &l)).collect();
    // token by token after `before`: the outputs of `extra`'s tokens, and the state after
    let run = |extra: &[&Token]| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut one = OnDevice::new(dev, s, &l)?;
        let mut outs = Vec::new();
        for (p, t) in before.iter().chain(extra.iter().copied()).enumerate() {
            one.feed(dev, s, t, p)?;
            one.enqueue(dev, s, &l)?;
            if p >= before.len() {
                outs.push(dev.download(s, &one.out)?);
            }
        }
        Ok((outs.concat(), dev.download(s, &one.state)?))
    };
    let drafted_refs: Vec<&Token> = drafted.iter().collect();
    let (want_drafted, _) = run(&drafted_refs)?;
    let taken: Vec<&Token> = drafted[..accepted].iter().chain(&again).collect();
    let (want_again, want_state) = run(&taken)?;
    let want_again = want_again[accepted * w..].to_vec();
    let (_, before_state) = run(&[])?;
    // slot 1 of 2 beside another sequence's state, or the one slot
    let (slot, sequences) = if slotted { (1, 2) } else { (0, 1) };
    let other = random(&mut cx.rng, slot_len, 1.0);
    let others = if slotted { other.clone() } else { Vec::new() };
    let live = dev.upload(s, &[others.clone(), before_state].concat())?;
    let kept_states = dev.alloc::<f32>(s, sequences * (keeps - 1) * slot_len)?;
    let track = dev.alloc::<u32>(s, sequences * 3)?;
    let weights = OnDevice::new(dev, s, &l)?;
    let step = Batched {
        l: &l,
        weights: &weights,
        live: (&live, sequences),
        slotted,
    };
    // one span of `toks` at `first`, with keeping; its outputs
    let span = |toks: &[&Token], first: usize| -> Result<Vec<f32>> {
        let pos: Vec<u32> = (first..first + toks.len()).map(|p| p as u32).collect();
        let slots = vec![slot; toks.len()];
        let keep = (&kept_states, &track, keeps);
        Ok(step.run(dev, s, toks, (&pos, &slots), Some(keep))?.1)
    };
    let mut got = span(&drafted_refs, 3)?;
    let mut want = want_drafted;
    let again_refs: Vec<&Token> = again.iter().collect();
    got.extend(span(&again_refs, 3 + accepted)?);
    want.extend(want_again);
    got.extend(dev.download(s, &live)?);
    want.extend([others, want_state].concat());
    let how = if slotted {
        "in slot 1 of 2"
    } else {
        "in a prefill step's launches"
    };
    cx.report.exact(
        "kda kept",
        format!(
            "{heads} heads of {hd}, {taps} taps, {how}: a span of {}, then 3 rows after its {accepted} accepted = a launch a token{}",
            drafted.len(),
            decay.name()
        ),
        bit_mismatches(&got, &want),
    );
    // the state has taken in the positions to the new span's end and kept the last two: 4 is
    // before them
    let lost = span(&again_refs[..1], 4)?;
    cx.report.exact(
        "kda kept",
        format!("{heads} heads of {hd}, {how}: a span where no state is kept gives NaN"),
        lost.iter().filter(|v| !v.is_nan()).count(),
    );
    Ok(())
}

/// A batched step in one launch of each kernel over sequence slots, against each sequence's
/// launches a token alone: a pad row first, then sequence C's second token in slot 3 (at the
/// position after the pad row's), A's fourth in slot 1, B's first five in slot 2 (over another
/// sequence's state, from zeros at position 0) and E's sixth in slot 0 (at the position after
/// B's last): every row's convolved q, k, v and output (the pad row's zeros), and every slot's
/// state after, bit for bit.
fn slotted(cx: &mut Ctx, (heads, hd, taps): (usize, usize, usize), decay: Decay) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let l = Layer::new(cx, heads, hd, taps, decay);
    let w = l.width();
    let slot_len = windows(&l) + heads * hd * hd;
    // (slot, tokens before the step, tokens in it): the rows in this order, after the pad row
    let seqs = [(3usize, 1usize, 1usize), (1, 3, 1), (2, 0, 5), (0, 5, 1)];
    let mut states = vec![Vec::new(); 4];
    // B starts over what another sequence left in its slot
    states[2] = random(&mut cx.rng, slot_len, 1.0);
    let (mut want_qkv, mut want_out) = (vec![vec![0f32; 3 * w]], vec![vec![0f32; w]]);
    let mut after = vec![Vec::new(); 4];
    let (mut toks, mut pos, mut slots) = (vec![Token::new(cx, &l)], vec![0u32], vec![PAD_SLOT]);
    for &(slot, before, n) in &seqs {
        let mut one = OnDevice::new(dev, s, &l)?;
        for p in 0..before {
            one.feed(dev, s, &Token::new(cx, &l), p)?;
            one.enqueue(dev, s, &l)?;
        }
        if before > 0 {
            states[slot] = dev.download(s, &one.state)?;
        }
        for p in before..before + n {
            let t = Token::new(cx, &l);
            one.feed(dev, s, &t, p)?;
            one.enqueue(dev, s, &l)?;
            want_qkv.push(dev.download(s, &one.qkv)?);
            want_out.push(dev.download(s, &one.out)?);
            toks.push(t);
            pos.push(p as u32);
            slots.push(slot as u32);
        }
        after[slot] = dev.download(s, &one.state)?;
    }
    let n = toks.len();
    let live = dev.upload(s, &states.concat())?;
    let weights = OnDevice::new(dev, s, &l)?;
    let step = Batched {
        l: &l,
        weights: &weights,
        live: (&live, 4),
        slotted: true,
    };
    let refs: Vec<&Token> = toks.iter().collect();
    let (qkv, out) = step.run(dev, s, &refs, (&pos, &slots), None)?;
    let mut got = Vec::new();
    let mut want = Vec::new();
    for r in 0..n {
        for part in 0..3 {
            got.extend_from_slice(&qkv[(part * n + r) * w..][..w]);
        }
        want.extend_from_slice(&want_qkv[r]);
        got.extend_from_slice(&out[r * w..][..w]);
        want.extend_from_slice(&want_out[r]);
    }
    got.extend(dev.download(s, &live)?);
    want.extend(after.concat());
    cx.report.exact(
        "kda slots",
        format!(
            "{heads} heads of {hd}, {taps} taps: a pad row and four sequences' spans (one of five rows) in one launch = a launch a token{}",
            decay.name()
        ),
        bit_mismatches(&got, &want),
    );
    Ok(())
}

/// A prefill step's tokens in one launch of each kernel (`kda_conv` and `kda_delta` over
/// rows) against a launch pair a token: every row's convolved q, k, v and output, and the
/// state after the last token, bit for bit.
fn rows(
    cx: &mut Ctx,
    (heads, hd, taps, n): (usize, usize, usize, usize),
    decay: Decay,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let l = Layer::new(cx, heads, hd, taps, decay);
    let w = l.width();
    let toks: Vec<Token> = (0..n).map(|_| Token::new(cx, &l)).collect();
    let mut one = OnDevice::new(dev, s, &l)?;
    let (mut want_qkv, mut want_out) = (vec![0f32; 3 * n * w], Vec::new());
    for (r, t) in toks.iter().enumerate() {
        one.feed(dev, s, t, r)?;
        one.enqueue(dev, s, &l)?;
        let qkv = dev.download(s, &one.qkv)?;
        for part in 0..3 {
            want_qkv[(part * n + r) * w..][..w].copy_from_slice(&qkv[part * w..][..w]);
        }
        want_out.extend(dev.download(s, &one.out)?);
    }
    let want_state = dev.download(s, &one.state)?;
    // the rows start a second sequence, at position 0 over the state a first one left
    let mut many = OnDevice::new(dev, s, &l)?;
    for (r, t) in toks.iter().enumerate() {
        many.feed(dev, s, t, r)?;
        many.enqueue(dev, s, &l)?;
    }
    let step = Batched {
        l: &l,
        weights: &many,
        live: (&many.state, 1),
        slotted: false,
    };
    let refs: Vec<&Token> = toks.iter().collect();
    let pos: Vec<u32> = (0..n as u32).collect();
    let (qkv, out) = step.run(dev, s, &refs, (&pos, &vec![0; n]), None)?;
    let mut got = qkv;
    got.extend(out);
    got.extend(dev.download(s, &many.state)?);
    let mut want = want_qkv;
    want.extend(want_out);
    want.extend(want_state);
    cx.report.exact(
        "kda rows",
        format!(
            "{heads} heads of {hd}, {taps} taps, {n} tokens in one launch = a launch a token, after another sequence{}",
            decay.name()
        ),
        bit_mismatches(&got, &want),
    );
    Ok(())
}

/// A layer's fixed weights: the q, k, v taps (q channels first), `dt_bias`, `a` per head and
/// the output norm.
struct Layer {
    heads: usize,
    hd: usize,
    taps: usize,
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    norm: Vec<f32>,
    decay: Decay,
}

impl Layer {
    fn new(cx: &mut Ctx, heads: usize, hd: usize, taps: usize, decay: Decay) -> Layer {
        let w = heads * hd;
        Layer {
            heads,
            hd,
            taps,
            conv: random(&mut cx.rng, 3 * w * taps, 1.0),
            dt_bias: random(&mut cx.rng, w, 1.0),
            // -exp(A_log): negative, so every decay is at most 1
            a: (0..heads)
                .map(|_| -(0.525 + 0.475 * cx.rng.uniform()))
                .collect(),
            norm: random(&mut cx.rng, hd, 1.0),
            decay,
        }
    }

    fn width(&self) -> usize {
        self.heads * self.hd
    }
}

/// One token's inputs: the q, k, v projections, the raw decay, rate and output gate.
struct Token {
    x: Vec<f32>,
    f: Vec<f32>,
    b: Vec<f32>,
    gate: Vec<f32>,
}

impl Token {
    fn new(cx: &mut Ctx, l: &Layer) -> Token {
        let w = l.width();
        let mut f = random(&mut cx.rng, w, 2.0);
        // the first channel of every head past softplus's linear threshold (x > 20)
        for h in 0..l.heads {
            f[h * l.hd] = 23.0 + cx.rng.uniform();
        }
        Token {
            x: random(&mut cx.rng, 3 * w, 1.0),
            f,
            b: random(&mut cx.rng, l.heads, 3.0),
            gate: random(&mut cx.rng, w, 3.0),
        }
    }
}

/// The CPU backend's token: the convolved q, k, v (q and k normalized) and the output.
fn cpu_token(l: &Layer, st: &mut KdaState, t: &Token) -> (Vec<f32>, Vec<f32>) {
    let (w, hd, taps) = (l.width(), l.hd, l.taps);
    let mut qkv = vec![0f32; 3 * w];
    for (which, out) in qkv.chunks_exact_mut(w).enumerate() {
        let taps_of = &l.conv[which * w * taps..(which + 1) * w * taps];
        let x = &t.x[which * w..(which + 1) * w];
        conv_step(st.window_mut(which), taps_of, taps, x, out);
    }
    l2_norm_heads(&mut qkv[..2 * w], hd, l.decay.l2_eps);
    let mut g = t.f.clone();
    match l.decay.bound {
        Some(lb) => decay_gate_bounded(&mut g, &l.dt_bias, &l.a, hd, lb),
        None => decay_gate(&mut g, &l.dt_bias, &l.a, hd),
    }
    let beta: Vec<f32> = t.b.iter().map(|&b| sigmoid(b)).collect();
    let mut out = vec![0f32; w];
    let inputs = DeltaInputs {
        q: &qkv[..w],
        k: &qkv[w..2 * w],
        v: &qkv[2 * w..],
        g: &g,
        beta: &beta,
    };
    delta_rule(st, &inputs, &mut out);
    gated_norm(&mut out, &l.norm, &t.gate, EPS);
    (qkv, out)
}

/// A layer's weights, token inputs, outputs and state on the device.
struct OnDevice {
    conv: DeviceBuffer<f32>,
    dt_bias: DeviceBuffer<f32>,
    a: DeviceBuffer<f32>,
    norm: DeviceBuffer<f32>,
    x: DeviceBuffer<f32>,
    f: DeviceBuffer<f32>,
    b: DeviceBuffer<f32>,
    gate: DeviceBuffer<f32>,
    qkv: DeviceBuffer<f32>,
    out: DeviceBuffer<f32>,
    /// The windows, then the key-major recurrent states (the layout of `cuda::kda`).
    state: DeviceBuffer<f32>,
    /// The step's position.
    pos: DeviceBuffer<u32>,
}

impl OnDevice {
    fn new(dev: &CudaDevice, s: &Arc<CudaStream>, l: &Layer) -> Result<OnDevice> {
        let w = l.width();
        Ok(OnDevice {
            conv: dev.upload(s, &l.conv)?,
            dt_bias: dev.upload(s, &l.dt_bias)?,
            a: dev.upload(s, &l.a)?,
            norm: dev.upload(s, &l.norm)?,
            x: dev.alloc(s, 3 * w)?,
            f: dev.alloc(s, w)?,
            b: dev.alloc(s, l.heads)?,
            gate: dev.alloc(s, w)?,
            qkv: dev.alloc(s, 3 * w)?,
            out: dev.alloc(s, w)?,
            state: dev.alloc(s, windows(l) + l.heads * l.hd * l.hd)?,
            pos: dev.alloc(s, 1)?,
        })
    }

    /// Token `t` at position `pos`.
    fn feed(&mut self, dev: &CudaDevice, s: &Arc<CudaStream>, t: &Token, pos: usize) -> Result<()> {
        dev.write(s, &[pos as u32], &mut self.pos)?;
        dev.write(s, &t.x, &mut self.x)?;
        dev.write(s, &t.f, &mut self.f)?;
        dev.write(s, &t.b, &mut self.b)?;
        dev.write(s, &t.gate, &mut self.gate)
    }

    /// The two launches of a token, as `KdaState::pre` and `core` make them.
    fn enqueue(&self, dev: &CudaDevice, s: &CudaStream, l: &Layer) -> Result<()> {
        let state = Span::of(&self.state);
        let win = windows(l);
        dev.kda_conv(
            s,
            &Span::of(&self.x),
            &Span::of(&self.conv),
            &state.sub(0, win),
            &Span::of(&self.qkv),
            (l.heads, l.hd, l.taps),
            l.decay.l2_eps,
            &Span::of(&self.pos),
            None,
            None,
        )?;
        let gates = KdaGates {
            f: Span::of(&self.f),
            dt_bias: Span::of(&self.dt_bias),
            a: Span::of(&self.a),
            beta: Span::of(&self.b),
            gate: Span::of(&self.gate),
            norm: Span::of(&self.norm),
            bound: l.decay.bound,
        };
        dev.kda_delta(
            s,
            &state.sub(win, l.heads * l.hd * l.hd),
            &Span::of(&self.qkv),
            &gates,
            &Span::of(&self.out),
            (l.heads, l.hd),
            EPS,
            &Span::of(&self.pos),
            None,
            None,
        )
    }
}

/// A batched step's launches over the sequence slots' states in `live` (`sequences` of them,
/// each windows then states) with `l`'s weights.
struct Batched<'a> {
    l: &'a Layer,
    weights: &'a OnDevice,
    live: (&'a DeviceBuffer<f32>, usize),
    /// A batched step's launches over the slots (else a prefill step's, in slot 0).
    slotted: bool,
}

impl Batched<'_> {
    /// `toks` as one step, row `r` at `pos[r]` in slot `slots[r]`, through both kernels (with
    /// `keep`'s kept states, tracks and most rows kept, and the track launch after them):
    /// the convolved q, k, v (`kda_conv`'s layout) and the outputs.
    fn run(
        &self,
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        toks: &[&Token],
        (pos, slots): (&[u32], &[u32]),
        keep: Option<(&DeviceBuffer<f32>, &DeviceBuffer<u32>, usize)>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let l = self.l;
        let (n, w, win) = (toks.len(), l.width(), windows(l));
        let slot_len = win + l.heads * l.hd * l.hd;
        let mut x = vec![0f32; 3 * n * w];
        for (r, t) in toks.iter().enumerate() {
            for part in 0..3 {
                x[(part * n + r) * w..][..w].copy_from_slice(&t.x[part * w..][..w]);
            }
        }
        let cat = |f: fn(&Token) -> &Vec<f32>| -> Vec<f32> {
            toks.iter().flat_map(|&t| f(t).clone()).collect()
        };
        let (pos_d, slots_d) = (dev.upload(s, pos)?, dev.upload(s, slots)?);
        let (xd, fd, bd, gd) = (
            dev.upload(s, &x)?,
            dev.upload(s, &cat(|t| &t.f))?,
            dev.upload(s, &cat(|t| &t.b))?,
            dev.upload(s, &cat(|t| &t.gate))?,
        );
        let (qkv, out) = (dev.alloc::<f32>(s, 3 * n * w)?, dev.alloc::<f32>(s, n * w)?);
        let slot_span = Span::of(&slots_d);
        let slotted = || {
            self.slotted.then_some(Slotted {
                slots: &slot_span,
                stride: slot_len,
                sequences: self.live.1,
            })
        };
        let keeping = |offset: usize| {
            keep.map(|(kept, track, keeps)| {
                let k = Span::of(kept);
                Keeping {
                    kept: k.sub(offset, k.len() - offset),
                    track: Span::of(track),
                    keeps,
                    state_len: slot_len,
                }
            })
        };
        let (live, pos_s) = (Span::of(self.live.0), Span::of(&pos_d));
        // a batched step's kernels take every slot's windows and states, a prefill step's
        // slot 0's
        let (windows_of, states_of) = if self.slotted {
            (live.clone(), live.sub(win, live.len() - win))
        } else {
            (live.sub(0, win), live.sub(win, slot_len - win))
        };
        let wt = self.weights;
        dev.kda_conv(
            s,
            &Span::of(&xd),
            &Span::of(&wt.conv),
            &windows_of,
            &Span::of(&qkv),
            (l.heads, l.hd, l.taps),
            l.decay.l2_eps,
            &pos_s,
            slotted(),
            keeping(0).as_ref(),
        )?;
        let gates = KdaGates {
            f: Span::of(&fd),
            dt_bias: Span::of(&wt.dt_bias),
            a: Span::of(&wt.a),
            beta: Span::of(&bd),
            gate: Span::of(&gd),
            norm: Span::of(&wt.norm),
            bound: l.decay.bound,
        };
        dev.kda_delta(
            s,
            &states_of,
            &Span::of(&qkv),
            &gates,
            &Span::of(&out),
            (l.heads, l.hd),
            EPS,
            &pos_s,
            slotted(),
            keeping(win).as_ref(),
        )?;
        if let Some(k) = keeping(0) {
            let slots = self.slotted.then_some(&slot_span);
            dev.kda_track(s, (&pos_s, slots), n, &k)?;
        }
        Ok((dev.download(s, &qkv)?, dev.download(s, &out)?))
    }
}

/// Values of the three convolution windows.
fn windows(l: &Layer) -> usize {
    3 * l.width() * (l.taps - 1)
}

/// The worst normwise relative error seen so far: where, and how many values differ in bits.
#[derive(Default)]
struct Worst {
    err: f64,
    at: String,
    differ: usize,
    values: usize,
}

impl Worst {
    /// Adds `got` against `want`; `at(i)` names value `i`.
    fn add(&mut self, got: &[f32], want: &[f32], at: impl Fn(usize) -> String) {
        let scale = want.iter().fold(0f64, |m, &w| m.max(f64::from(w.abs())));
        let scale = if scale > 0.0 { scale } else { 1.0 };
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let e = f64::from((g - w).abs()) / scale;
            if e > self.err || e.is_nan() {
                self.err = if e.is_nan() { f64::INFINITY } else { e };
                self.at = format!("{} ({g} vs cpu {w})", at(i));
            }
        }
        self.differ += bit_mismatches(got, want);
        self.values += want.len();
    }

    fn case(&self, case: &str) -> String {
        let at = if self.at.is_empty() {
            String::new()
        } else {
            format!("; worst {}", self.at)
        };
        format!(
            "{case}; {} of {} values differ in bits{at}",
            self.differ, self.values
        )
    }
}

fn tokens(
    cx: &mut Ctx,
    (heads, hd, taps, n): (usize, usize, usize, usize),
    decay: Decay,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let l = Layer::new(cx, heads, hd, taps, decay);
    let w = l.width();
    let mut host = KdaState::new(heads, hd, taps);
    let mut d = OnDevice::new(dev, s, &l)?;
    let (mut conv, mut out) = (Worst::default(), Worst::default());
    for t in 0..n {
        let tok = Token::new(cx, &l);
        let (want_qkv, want_out) = cpu_token(&l, &mut host, &tok);
        d.feed(dev, s, &tok, t)?;
        d.enqueue(dev, s, &l)?;
        let got_qkv = dev.download(s, &d.qkv)?;
        let got_out = dev.download(s, &d.out)?;
        conv.add(&got_qkv, &want_qkv, |i| {
            let part = ["q", "k", "v"][i / w];
            format!("token {t} {part} head {} value {}", i % w / hd, i % hd)
        });
        out.add(&got_out, &want_out, |i| {
            format!("token {t} head {} value {}", i / hd, i % hd)
        });
    }
    let case = format!("{heads}h x {hd}, {taps} taps, {n} tokens{}", decay.name());
    cx.report
        .tol("kda conv", conv.case(&case), conv.err, 2e-6, "rel");
    cx.report
        .tol("kda delta", out.case(&case), out.err, 5e-5, "rel");
    // the state after the last token: windows bit for bit, the recurrent states transposed
    let got = dev.download(s, &d.state)?;
    let win = windows(&l);
    let want_windows: Vec<f32> = (0..3).flat_map(|k| host.window_mut(k).to_vec()).collect();
    cx.report.exact(
        "kda window",
        format!("{case}, after the last token"),
        bit_mismatches(&got[..win], &want_windows),
    );
    let cpu = host.states_mut();
    let key_major: Vec<f32> = (0..heads * hd * hd)
        .map(|n| {
            let (h, r) = (n / (hd * hd), n % (hd * hd));
            let (i, j) = (r / hd, r % hd);
            cpu[h * hd * hd + j * hd + i]
        })
        .collect();
    let mut state = Worst::default();
    state.add(&got[win..], &key_major, |n| {
        let (h, r) = (n / (hd * hd), n % (hd * hd));
        format!("head {h} S[{}][{}]", r % hd, r / hd)
    });
    cx.report
        .tol("kda state", state.case(&case), state.err, 2e-5, "rel");
    Ok(())
}

fn graph(cx: &mut Ctx, decay: Decay) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let (heads, hd, taps, steps) = (4, 64, 4, 6);
    let l = Layer::new(cx, heads, hd, taps, decay);
    let toks: Vec<Token> = (0..steps).map(|_| Token::new(cx, &l)).collect();
    let mut eager_run = OnDevice::new(dev, s, &l)?;
    let mut eager = Vec::new();
    for (pos, t) in toks.iter().enumerate() {
        eager_run.feed(dev, s, t, pos)?;
        eager_run.enqueue(dev, s, &l)?;
        eager.extend(dev.download(s, &eager_run.out)?);
    }
    eager.extend(dev.download(s, &eager_run.state)?);
    let mut replay_run = OnDevice::new(dev, s, &l)?;
    s.synchronize()?;
    let captured = capture(s, || replay_run.enqueue(dev, s, &l));
    report_replay(
        cx,
        "kda graph",
        format!(
            "replay == eager, {steps} tokens and the state, {heads}h x {hd}, a second sequence after the first{}",
            decay.name()
        ),
        captured,
        &eager,
        |g| {
            // the sequence twice: the second starts at position 0 over the state the first
            // left, and must start from zeros as the eager run did
            let mut replayed = Vec::new();
            for _ in 0..2 {
                replayed.clear();
                for (pos, t) in toks.iter().enumerate() {
                    replay_run.feed(dev, s, t, pos)?;
                    g.replay()?;
                    replayed.extend(dev.download(s, &replay_run.out)?);
                }
            }
            replayed.extend(dev.download(s, &replay_run.state)?);
            Ok(replayed)
        },
    )
}
