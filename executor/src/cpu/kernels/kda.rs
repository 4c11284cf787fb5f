//! Kimi delta attention (KDA) at decode, one token at a time, with llama.cpp's semantics
//! (`kimi-linear.cpp`, `delta-net-base.cpp`, ggml's `ssm_conv` and fused `gated_delta_net`):
//!
//! - a depthwise causal convolution of `taps` taps per channel over the channel's last
//!   `taps - 1` inputs (its window, the layer's conv state) and the new input, then SiLU;
//! - q and k L2-normalized per head (llama.cpp's `rms_norm(x, eps / n) / sqrt(n)`);
//! - the per-channel decay `g = A[head] * softplus(f + dt_bias)` and the per-head rate
//!   `beta = sigmoid(b)`;
//! - the gated delta rule on each head's `d x d` state `S` (row `j` a value dim, column `i` a
//!   key dim): `S[j][i] *= exp(g[i])`, `delta[j] = beta (v[j] - S[j] . k)`,
//!   `S[j][i] += k[i] delta[j]`, `o[j] = (S[j] . q) / sqrt(d)`;
//! - the output `rms_norm(o) * w * sigmoid(gate)` per head.
//!
//! Heads are independent, so a rank holding some heads computes their bits exactly as one
//! rank holding all of them. The state is updated in place: the next token reads what this
//! one wrote.

/// One KDA layer's state on a rank: the q, k and v convolution windows (per channel, the last
/// `taps - 1` inputs, oldest first) and each held head's recurrent state (`head_dim` rows of
/// `head_dim`, row = value dim). A verify step of speculative decoding keeps the state after
/// each of its rows but the last, so a later span may start again after any of them: a
/// rejected draft leaves no trace.
pub struct KdaState {
    windows: [Vec<f32>; 3],
    states: Vec<f32>,
    heads: usize,
    head_dim: usize,
    taps: usize,
    /// Positions taken in: `0..len`.
    len: usize,
    /// Most rows of a span whose states are kept (the plan's drafted tokens plus one; 0:
    /// none are).
    keeps: usize,
    /// The state after each row but the last of the latest span of 2 to `keeps` rows.
    kept: Vec<Kept>,
}

/// A state as a row of a verify span left it.
struct Kept {
    /// Positions taken in then.
    len: usize,
    windows: [Vec<f32>; 3],
    states: Vec<f32>,
}

impl KdaState {
    /// A zero state for `heads` heads of `head_dim` and convolutions of `taps` taps.
    pub fn new(heads: usize, head_dim: usize, taps: usize) -> KdaState {
        let window = vec![0.0; heads * head_dim * (taps - 1)];
        KdaState {
            windows: [window.clone(), window.clone(), window],
            states: vec![0.0; heads * head_dim * head_dim],
            heads,
            head_dim,
            taps,
            len: 0,
            keeps: 0,
            kept: Vec::new(),
        }
    }

    /// The same state, keeping the state after each row of spans of up to `rows` rows.
    pub fn keeping(self, rows: usize) -> KdaState {
        KdaState {
            keeps: rows,
            ..self
        }
    }

    /// Zeroes the windows and recurrent states: a new sequence starts.
    pub fn reset(&mut self) {
        self.windows.iter_mut().for_each(|w| w.fill(0.0));
        self.states.fill(0.0);
        self.len = 0;
        self.kept.clear();
    }

    /// Starts a span of `rows` rows at position `pos`: from zero at position 0; from the
    /// state a kept row left where the state has gone past `pos` (the span follows rejected
    /// drafts); then readies a kept state per row but the last when the span keeps them.
    pub fn begin(&mut self, pos: usize, rows: usize) -> anyhow::Result<()> {
        if pos == 0 {
            self.reset();
        } else if pos < self.len {
            let Some(kept) = self.kept.iter().find(|k| k.len == pos) else {
                let held: Vec<String> = self.kept.iter().map(|k| k.len.to_string()).collect();
                anyhow::bail!(
                    "a span at position {pos} of a KDA state that has taken in {} positions; it can return only to a kept verify row's (after {})",
                    self.len,
                    if held.is_empty() { "none".to_string() } else { held.join(", ") }
                );
            };
            for (w, k) in self.windows.iter_mut().zip(&kept.windows) {
                w.copy_from_slice(k);
            }
            self.states.copy_from_slice(&kept.states);
        }
        self.len = pos + rows;
        let keep = if (2..=self.keeps).contains(&rows) {
            rows - 1
        } else {
            0
        };
        self.kept.truncate(keep);
        while self.kept.len() < keep {
            self.kept.push(Kept {
                len: 0,
                windows: self.windows.clone(),
                states: self.states.clone(),
            });
        }
        for (i, k) in self.kept.iter_mut().enumerate() {
            k.len = pos + i + 1;
        }
        Ok(())
    }

    /// Keeps window `which` as row `row` of the span left it, when that row's state is kept.
    pub fn keep_window(&mut self, row: usize, which: usize) {
        if let Some(k) = self.kept.get_mut(row) {
            k.windows[which].copy_from_slice(&self.windows[which]);
        }
    }

    /// Keeps the recurrent states as row `row` of the span left them, when that row's state
    /// is kept.
    pub fn keep_states(&mut self, row: usize) {
        if let Some(k) = self.kept.get_mut(row) {
            k.states.copy_from_slice(&self.states);
        }
    }

    /// Heads held.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Convolution taps.
    pub fn taps(&self) -> usize {
        self.taps
    }

    /// The window of the q (0), k (1) or v (2) convolution.
    pub fn window_mut(&mut self, which: usize) -> &mut [f32] {
        &mut self.windows[which]
    }

    /// The recurrent states of all held heads, head after head.
    pub fn states_mut(&mut self) -> &mut [f32] {
        &mut self.states
    }
}

/// `x / (1 + exp(-x))`.
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml's softplus: `x` above 20, else `ln(1 + exp(x))`.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// One token through the depthwise causal convolution and SiLU: for channel `c`,
/// `out[c] = silu(sum_t window[c][t] w[c][t] + x[c] w[c][taps - 1])`, summed in tap order;
/// the window then drops its oldest input and keeps `x[c]`. `w` holds `taps` weights per
/// channel.
pub fn conv_step(window: &mut [f32], w: &[f32], taps: usize, x: &[f32], out: &mut [f32]) {
    let keep = taps - 1;
    assert!(
        window.len() == x.len() * keep && w.len() == x.len() * taps && out.len() == x.len(),
        "conv_step: {} channels, window {}, weights {}, out {}",
        x.len(),
        window.len(),
        w.len(),
        out.len()
    );
    for (c, (&xc, o)) in x.iter().zip(out.iter_mut()).enumerate() {
        let win = &mut window[c * keep..(c + 1) * keep];
        let wc = &w[c * taps..(c + 1) * taps];
        let mut sum = 0.0f32;
        for (&s, &k) in win.iter().zip(wc) {
            sum += s * k;
        }
        sum += xc * wc[keep];
        *o = silu(sum);
        win.copy_within(1.., 0);
        win[keep - 1] = xc;
    }
}

/// L2 norm of each `hd`-long head of `v`, as llama.cpp computes it: RMS norm with epsilon
/// `eps / hd` (sum of squares in f64, as ggml), then scaled by `1 / sqrt(hd)`.
pub fn l2_norm_heads(v: &mut [f32], hd: usize, eps: f32) {
    let n = hd as f32;
    let eps = eps / n;
    let after = 1.0 / n.sqrt();
    for head in v.chunks_exact_mut(hd) {
        let sum: f64 = head.iter().map(|&x| f64::from(x * x)).sum();
        let mean = (sum / hd as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for x in head.iter_mut() {
            *x = (*x * scale) * after;
        }
    }
}

/// The decay gate in place: `g[c] = softplus(g[c] + dt_bias[c]) * a[c / hd]` (`a` is
/// `-exp(A_log)` per head, as the converter stores it).
pub fn decay_gate(g: &mut [f32], dt_bias: &[f32], a: &[f32], hd: usize) {
    assert!(
        g.len() == dt_bias.len() && g.len() == a.len() * hd,
        "decay_gate: lengths differ"
    );
    for (c, (x, &b)) in g.iter_mut().zip(dt_bias).enumerate() {
        *x = softplus(*x + b) * a[c / hd];
    }
}

/// The bounded decay gate in place (glm5-next with `kda.gate_lower_bound` `lb`):
/// `g[c] = lb * sigmoid(-((g[c] + dt_bias[c]) * a[c / hd]))`.
pub fn decay_gate_bounded(g: &mut [f32], dt_bias: &[f32], a: &[f32], hd: usize, lb: f32) {
    assert!(
        g.len() == dt_bias.len() && g.len() == a.len() * hd,
        "decay_gate_bounded: lengths differ"
    );
    for (c, (x, &b)) in g.iter_mut().zip(dt_bias).enumerate() {
        *x = sigmoid(-((*x + b) * a[c / hd])) * lb;
    }
}

/// Inputs of one token's delta rule over the held heads, all `heads * hd` long except
/// `beta` (`heads`).
pub struct DeltaInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

/// The gated delta rule for one token on every held head of `state`, writing each head's
/// output into `out` (see the module doc for the formula and the state layout).
pub fn delta_rule(state: &mut KdaState, x: &DeltaInputs, out: &mut [f32]) {
    let (heads, d) = (state.heads, state.head_dim);
    let w = heads * d;
    assert!(
        [x.q.len(), x.k.len(), x.v.len(), x.g.len(), out.len()] == [w; 5] && x.beta.len() == heads,
        "delta_rule: {heads} heads of {d}"
    );
    let scale = 1.0 / (d as f32).sqrt();
    let mut decay = vec![0.0f32; d];
    let mut delta = vec![0.0f32; d];
    for h in 0..heads {
        let at = h * d..(h + 1) * d;
        let (q, k, v, g) = (
            &x.q[at.clone()],
            &x.k[at.clone()],
            &x.v[at.clone()],
            &x.g[at],
        );
        let beta = x.beta[h];
        let s = &mut state.states[h * d * d..(h + 1) * d * d];
        for (e, &gi) in decay.iter_mut().zip(g) {
            *e = gi.exp();
        }
        for row in s.chunks_exact_mut(d) {
            row.iter_mut().zip(&decay).for_each(|(m, &e)| *m *= e);
        }
        for ((row, dl), &vj) in s.chunks_exact(d).zip(delta.iter_mut()).zip(v) {
            *dl = (vj - dot(row, k)) * beta;
        }
        for (row, &dl) in s.chunks_exact_mut(d).zip(&delta) {
            row.iter_mut().zip(k).for_each(|(m, &ki)| *m += ki * dl);
        }
        for (o, row) in out[h * d..(h + 1) * d].iter_mut().zip(s.chunks_exact(d)) {
            *o = dot(row, q) * scale;
        }
    }
}

/// `a . b` summed in order in f32.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |s, (&x, &y)| s + x * y)
}

/// The gated output norm in place: per head, `o = rms_norm(o) * w * sigmoid(gate)`.
pub fn gated_norm(o: &mut [f32], w: &[f32], gate: &[f32], eps: f32) {
    let hd = w.len();
    assert!(
        o.len() == gate.len() && o.len().is_multiple_of(hd),
        "gated_norm: lengths differ"
    );
    let mut normed = vec![0.0; hd];
    for (head, g) in o.chunks_exact_mut(hd).zip(gate.chunks_exact(hd)) {
        super::rms_norm(head, w, eps, &mut normed);
        for ((x, &n), &gv) in head.iter_mut().zip(&normed).zip(g) {
            *x = n * sigmoid(gv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn conv_step_is_a_causal_convolution_over_the_last_inputs() {
        let (channels, taps) = (5, 4);
        let w = values(channels * taps, 1);
        let inputs: Vec<Vec<f32>> = (0..7).map(|t| values(channels, 10 + t)).collect();
        let mut window = vec![0.0; channels * (taps - 1)];
        let mut out = vec![0.0; channels];
        for (t, x) in inputs.iter().enumerate() {
            conv_step(&mut window, &w, taps, x, &mut out);
            for c in 0..channels {
                // the plain definition: tap i weighs the input taps - 1 - i tokens back
                let mut sum = 0.0f32;
                for i in 0..taps {
                    let back = taps - 1 - i;
                    let input = if t >= back { inputs[t - back][c] } else { 0.0 };
                    sum += input * w[c * taps + i];
                }
                assert_eq!(out[c], silu(sum), "token {t} channel {c}");
            }
        }
    }

    #[test]
    fn l2_norm_gives_unit_heads() {
        let mut v = values(3 * 16, 2);
        l2_norm_heads(&mut v, 16, 1e-6);
        for head in v.chunks_exact(16) {
            let norm: f32 = head.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        }
    }

    /// The delta rule as matrices: `S <- (S diag(e^g)) + beta (v - S diag(e^g) k) k^T`, with
    /// S stored value-major; output `S q / sqrt(d)`, all in f64.
    fn reference(s: &mut [f64], d: usize, x: [&[f32]; 4], beta: f32) -> Vec<f64> {
        let [q, k, v, g] = x;
        for j in 0..d {
            for i in 0..d {
                s[j * d + i] *= f64::from(g[i]).exp();
            }
        }
        for j in 0..d {
            let sk: f64 = (0..d).map(|i| s[j * d + i] * f64::from(k[i])).sum();
            let delta = (f64::from(v[j]) - sk) * f64::from(beta);
            for i in 0..d {
                s[j * d + i] += f64::from(k[i]) * delta;
            }
        }
        (0..d)
            .map(|j| {
                (0..d).map(|i| s[j * d + i] * f64::from(q[i])).sum::<f64>() / (d as f64).sqrt()
            })
            .collect()
    }

    #[test]
    fn delta_rule_matches_the_matrix_form_over_several_tokens() {
        let (heads, d) = (3, 8);
        let w = heads * d;
        let mut state = KdaState::new(heads, d, 4);
        let mut want = vec![0.0f64; heads * d * d];
        for t in 0..6u32 {
            let mut q = values(w, 100 + t);
            let mut k = values(w, 200 + t);
            l2_norm_heads(&mut q, d, 1e-6);
            l2_norm_heads(&mut k, d, 1e-6);
            let v = values(w, 300 + t);
            let g: Vec<f32> = values(w, 400 + t).iter().map(|x| -0.5 - 0.4 * x).collect();
            let beta: Vec<f32> = values(heads, 500 + t).iter().map(|&x| sigmoid(x)).collect();
            let mut out = vec![0.0; w];
            let inputs = DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            };
            delta_rule(&mut state, &inputs, &mut out);
            for h in 0..heads {
                let at = h * d..(h + 1) * d;
                let o = reference(
                    &mut want[h * d * d..(h + 1) * d * d],
                    d,
                    [&q[at.clone()], &k[at.clone()], &v[at.clone()], &g[at]],
                    beta[h],
                );
                for j in 0..d {
                    let got = f64::from(out[h * d + j]);
                    assert!(
                        (got - o[j]).abs() < 1e-5,
                        "token {t} head {h} dim {j}: {got} vs {}",
                        o[j]
                    );
                }
            }
        }
    }

    #[test]
    fn a_head_computes_the_same_bits_alone() {
        // tensor parallelism hands each rank whole heads: head 1 of three, run alone, must
        // give the bits it gives among the others
        let (heads, d) = (3, 8);
        let w = heads * d;
        let (q, k, v) = (values(w, 1), values(w, 2), values(w, 3));
        let g: Vec<f32> = values(w, 4).iter().map(|x| -0.3 * x.abs()).collect();
        let beta = vec![0.3, 0.6, 0.9];
        let mut all = KdaState::new(heads, d, 2);
        let mut one = KdaState::new(1, d, 2);
        let mut out_all = vec![0.0; w];
        let mut out_one = vec![0.0; d];
        for _ in 0..3 {
            let x = DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            };
            delta_rule(&mut all, &x, &mut out_all);
            let h = d..2 * d;
            let x1 = DeltaInputs {
                q: &q[h.clone()],
                k: &k[h.clone()],
                v: &v[h.clone()],
                g: &g[h],
                beta: &beta[1..2],
            };
            delta_rule(&mut one, &x1, &mut out_one);
            assert_eq!(out_one, out_all[d..2 * d]);
        }
    }

    #[test]
    fn decay_gate_and_output_norm() {
        let mut g = vec![0.0, 30.0, -1.0, 1.0];
        decay_gate(&mut g, &[0.0, 0.0, 0.5, -0.5], &[-1.0, -2.0], 2);
        assert_eq!(g[0], -(2f32.ln()));
        assert_eq!(g[1], -30.0);
        assert_eq!(g[2], -2.0 * (1.0 + (-0.5f32).exp()).ln());
        let mut o = vec![3.0, 4.0];
        gated_norm(&mut o, &[1.0, 2.0], &[0.0, 100.0], 0.0);
        let rms = (12.5f32).sqrt();
        let scale = 1.0 / rms;
        assert_eq!(o, vec![(3.0 * scale) * 0.5, (4.0 * scale) * 2.0]);
    }
}
