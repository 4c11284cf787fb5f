//! Element-wise and vector-wide helpers of a decode step, with llama.cpp's semantics: RMS norm
//! (sum of squares in f64, as ggml does), SiLU-gated product, residual add, softmax with max
//! subtraction (greedy sampling's argmax is `crate::sample::argmax`).

/// `out = x / sqrt(mean(x^2) + eps) * weight`, as llama.cpp's `rms_norm` followed by `mul`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == weight.len() && x.len() == out.len(),
        "rms_norm: lengths differ"
    );
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * scale) * w;
    }
}

/// `gate = silu(gate) * up`, with `silu(g) = g / (1 + exp(-g))`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: lengths differ");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `gate = silu(min(gate, l)) * clamp(up, -l, l)`: ggml's `swiglu_clamp`, glm5-next's FFNs
/// with a limit `l`.
pub fn silu_mul_clamped(gate: &mut [f32], up: &[f32], l: f32) {
    assert_eq!(gate.len(), up.len(), "silu_mul_clamped: lengths differ");
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(l);
        *g = x / (1.0 + (-x).exp()) * u.clamp(-l, l);
    }
}

/// `a += b`.
pub fn add(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "add: lengths differ");
    for (a, &b) in a.iter_mut().zip(b) {
        *a += b;
    }
}

/// In-place softmax: `exp(x - max)`, summed in f64, then scaled by `1 / sum`.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}
