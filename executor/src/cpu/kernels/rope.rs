//! Rotary position embedding, computed as llama.cpp does: the angle of pair `i` is
//! `pos * theta_scale^i` with `theta_scale = theta^(-2 / head_dim)`, reached by repeated f32
//! multiplication rather than a fresh power per pair, so the angles match ggml's to the bit.

pub use crate::rope::RopeStyle;

/// Rotates each of the `n_heads` heads of `q_or_k` (head-major, `head_dim` each) to `pos`.
pub fn rope(
    q_or_k: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    theta: f32,
    style: RopeStyle,
) {
    assert_eq!(
        q_or_k.len(),
        n_heads * head_dim,
        "rope: length is not n_heads * head_dim"
    );
    assert!(
        head_dim.is_multiple_of(2),
        "rope: head_dim {head_dim} is odd"
    );
    let half = head_dim / 2;
    let theta_scale = theta.powf(-2.0 / head_dim as f32);
    let mut angle = pos as f32;
    let cos_sin: Vec<(f32, f32)> = (0..half)
        .map(|_| {
            let cs = (angle.cos(), angle.sin());
            angle *= theta_scale;
            cs
        })
        .collect();
    for head in q_or_k.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in cos_sin.iter().enumerate() {
            let (a, b) = match style {
                RopeStyle::Normal => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}
