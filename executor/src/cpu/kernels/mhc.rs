//! Manifold-constrained hyper-connections (glm5-next's residual), as llama.cpp's fused CPU
//! ops compute them (`dsv4_hc_comb`, `dsv4_hc_pre`, `dsv4_hc_post`): the residual is
//! `STREAMS` rows of the embedding width. Before a sublayer, 24 mixes (a product of the
//! RMS-normed streams the caller runs) give the pre weights (how much of each stream enters
//! the sublayer), the post weights (how much of the output each stream receives) and a 4x4
//! combination of the streams, normalized by Sinkhorn iterations.

pub use crate::layer_weights::{MIXES, STREAMS};

/// One sublayer's mixing weights for one token.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HcMix {
    pub pre: [f32; STREAMS],
    pub post: [f32; STREAMS],
    /// `comb[dst + STREAMS * src]`: stream `src`'s share in the new stream `dst`.
    pub comb: [f32; STREAMS * STREAMS],
}

/// The learned affine map of a sublayer: `scale[0..3]` for pre, post and combination,
/// `base` per mix.
pub struct HcAffine<'a> {
    pub scale: &'a [f32],
    pub base: &'a [f32],
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The mixing weights from a token's 24 mixes: `pre = sigmoid(m * s0 + b) + eps`,
/// `post = 2 sigmoid(m * s1 + b)`, and the combination: a softmax over `dst` for each `src`
/// (plus eps), then column sums (over `src`, plus eps) divided out, then `iters - 1` times
/// row sums (over `dst`) and column sums.
pub fn hc_mix(mixes: &[f32], a: &HcAffine, eps: f32, iters: u32) -> HcMix {
    assert!(
        mixes.len() == MIXES && a.base.len() == MIXES && a.scale.len() >= 3,
        "hc_mix: {MIXES} mixes and bases and 3 scales are needed"
    );
    let mut m = HcMix::default();
    for s in 0..STREAMS {
        m.pre[s] = sigmoid(mixes[s] * a.scale[0] + a.base[s]) + eps;
        let p = STREAMS + s;
        m.post[s] = 2.0 * sigmoid(mixes[p] * a.scale[1] + a.base[p]);
    }
    let off = 2 * STREAMS;
    let c = &mut m.comb;
    for src in 0..STREAMS {
        let col = |dst: usize| dst + STREAMS * src;
        let mut max = f32::NEG_INFINITY;
        for dst in 0..STREAMS {
            let v = mixes[off + col(dst)] * a.scale[2] + a.base[off + col(dst)];
            c[col(dst)] = v;
            max = max.max(v);
        }
        let mut sum = 0.0f32;
        for dst in 0..STREAMS {
            c[col(dst)] = (c[col(dst)] - max).exp();
            sum += c[col(dst)];
        }
        let inv = 1.0 / sum;
        for dst in 0..STREAMS {
            c[col(dst)] = c[col(dst)] * inv + eps;
        }
    }
    // "cols": for each dst, over src; "rows": for each src, over dst
    let norm = |c: &mut [f32; STREAMS * STREAMS], over_src: bool| {
        for i in 0..STREAMS {
            let at = |j: usize| match over_src {
                true => i + STREAMS * j,
                false => j + STREAMS * i,
            };
            let mut sum = eps;
            for j in 0..STREAMS {
                sum += c[at(j)];
            }
            let inv = 1.0 / sum;
            for j in 0..STREAMS {
                c[at(j)] *= inv;
            }
        }
    };
    norm(c, true);
    for _ in 1..iters {
        norm(c, false);
        norm(c, true);
    }
    m
}

/// Panics unless `streams` holds `STREAMS` rows of `d` values (`kernel` names the caller).
fn check_streams(kernel: &str, streams: &[f32], d: usize) {
    assert_eq!(
        streams.len(),
        STREAMS * d,
        "{kernel}: streams are not 4 rows"
    );
}

/// The sublayer's input: `out[i] = sum_s pre[s] * streams[s][i]`, summed in stream order.
pub fn hc_collapse(streams: &[f32], pre: &[f32; STREAMS], out: &mut [f32]) {
    let d = out.len();
    check_streams("hc_collapse", streams, d);
    for (i, o) in out.iter_mut().enumerate() {
        let mut sum = 0.0f32;
        for (s, &p) in pre.iter().enumerate() {
            sum += streams[s * d + i] * p;
        }
        *o = sum;
    }
}

/// The streams after a sublayer whose output is `f`:
/// `new[dst][i] = f[i] * post[dst] + sum_src streams[src][i] * comb[dst][src]`.
pub fn hc_expand(f: &[f32], m: &HcMix, streams: &mut [f32]) {
    let d = f.len();
    check_streams("hc_expand", streams, d);
    let old = streams.to_vec();
    for dst in 0..STREAMS {
        for i in 0..d {
            let mut sum = f[i] * m.post[dst];
            for src in 0..STREAMS {
                sum += old[src * d + i] * m.comb[dst + STREAMS * src];
            }
            streams[dst * d + i] = sum;
        }
    }
}

/// The head's input: the mean of the streams (summed in stream order, then scaled).
pub fn hc_mean(streams: &[f32], out: &mut [f32]) {
    let d = out.len();
    check_streams("hc_mean", streams, d);
    for (i, o) in out.iter_mut().enumerate() {
        let mut sum = streams[i];
        for s in 1..STREAMS {
            sum += streams[s * d + i];
        }
        *o = sum * (1.0 / STREAMS as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::super::uniform_values;
    use super::*;
    use memra_gguf::rng::Rng;

    /// Sinkhorn makes the combination doubly stochastic (up to eps) after enough iterations,
    /// and pre and post stay in their ranges.
    #[test]
    fn the_combination_is_doubly_stochastic() {
        let mut r = Rng::new(3);
        let mixes: Vec<f32> = (0..MIXES).map(|_| r.uniform() * 4.0).collect();
        let base = uniform_values(MIXES, &mut r);
        let a = HcAffine {
            scale: &[0.7, 1.3, 1.1],
            base: &base,
        };
        let m = hc_mix(&mixes, &a, 1e-6, 20);
        for i in 0..STREAMS {
            let over_src: f32 = (0..STREAMS).map(|j| m.comb[i + STREAMS * j]).sum();
            let over_dst: f32 = (0..STREAMS).map(|j| m.comb[j + STREAMS * i]).sum();
            assert!((over_src - 1.0).abs() < 1e-4, "{over_src}");
            assert!((over_dst - 1.0).abs() < 1e-3, "{over_dst}");
            assert!(m.pre[i] > 0.0 && m.pre[i] < 1.0 + 1e-5);
            assert!(m.post[i] > 0.0 && m.post[i] < 2.0);
        }
    }

    /// Collapse and expand against their definitions in f64; the mean of equal streams is
    /// the stream.
    #[test]
    fn collapse_expand_and_mean_match_their_definitions() {
        let mut r = Rng::new(9);
        let d = 37;
        let streams = uniform_values(STREAMS * d, &mut r);
        let f = uniform_values(d, &mut r);
        let mut m = HcMix::default();
        for s in 0..STREAMS {
            m.pre[s] = r.uniform();
            m.post[s] = r.uniform();
        }
        m.comb.iter_mut().for_each(|c| *c = r.uniform());
        let mut out = vec![0.0; d];
        hc_collapse(&streams, &m.pre, &mut out);
        let mut next = streams.clone();
        hc_expand(&f, &m, &mut next);
        for i in 0..d {
            let want: f64 = (0..STREAMS)
                .map(|s| f64::from(streams[s * d + i]) * f64::from(m.pre[s]))
                .sum();
            assert!((f64::from(out[i]) - want).abs() < 1e-5);
            for dst in 0..STREAMS {
                let want = f64::from(f[i]) * f64::from(m.post[dst])
                    + (0..STREAMS)
                        .map(|s| {
                            f64::from(streams[s * d + i]) * f64::from(m.comb[dst + STREAMS * s])
                        })
                        .sum::<f64>();
                assert!((f64::from(next[dst * d + i]) - want).abs() < 1e-5);
            }
        }
        let same: Vec<f32> = (0..STREAMS).flat_map(|_| f.iter().copied()).collect();
        hc_mean(&same, &mut out);
        for (o, x) in out.iter().zip(&f) {
            assert!((o - x).abs() <= 1e-6 * x.abs().max(1.0));
        }
    }
}
