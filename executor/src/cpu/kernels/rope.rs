//! Rotary position embedding, computed as llama.cpp does: the angle of pair `i` is
//! `pos * theta_scale^i` with `theta_scale = theta^(-2 / n_dims)`, reached by repeated f32
//! multiplication rather than a fresh power per pair, so the angles match ggml's to the bit.
//! With YaRN, each angle is interpolated and cos/sin scaled as ggml's `rope_yarn` does. A
//! rotation may cover only part of each head (MLA rotates the last `qk_rope` dims).

pub use crate::rope::{RopeStyle, Yarn};

/// How a layer rotates: base, pair layout and optional YaRN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rotation {
    pub theta: f32,
    pub style: RopeStyle,
    pub yarn: Option<Yarn>,
}

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
    let r = Rotation {
        theta,
        style,
        yarn: None,
    };
    rope_part(q_or_k, head_dim, 0..head_dim, pos, &r);
}

/// Rotates elements `dims` of every `stride`-long head of `x` to `pos`.
pub fn rope_part(
    x: &mut [f32],
    stride: usize,
    dims: std::ops::Range<usize>,
    pos: usize,
    r: &Rotation,
) {
    let n_dims = dims.len();
    assert!(
        x.len().is_multiple_of(stride) && dims.end <= stride,
        "rope: {} values are not heads of {stride} holding dims {dims:?}",
        x.len()
    );
    assert!(
        n_dims.is_multiple_of(2),
        "rope: {n_dims} rotated dims is odd"
    );
    let half = n_dims / 2;
    let theta_scale = r.theta.powf(-2.0 / n_dims as f32);
    let mut angle = pos as f32;
    let cos_sin: Vec<(f32, f32)> = (0..half)
        .map(|i| {
            let cs = match &r.yarn {
                Some(y) => y.cos_sin(angle, i),
                None => (angle.cos(), angle.sin()),
            };
            angle *= theta_scale;
            cs
        })
        .collect();
    for head in x.chunks_exact_mut(stride) {
        let head = &mut head[dims.clone()];
        for (i, &(c, s)) in cos_sin.iter().enumerate() {
            let (a, b) = match r.style {
                RopeStyle::Normal => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}
