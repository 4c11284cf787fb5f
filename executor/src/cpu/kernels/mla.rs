//! Multi-head latent attention at decode, as llama.cpp runs DeepSeek's MLA with absorbed
//! projections: the cache keeps, per token, only the normalized latent (`kv_lora_rank`
//! values) followed by the roped key shared by all heads (`qk_rope` values), never expanded
//! keys or values. Each head's query is mapped into the latent space beforehand (its no-rope
//! part through `attn_k_b`, then its roped part appended), so the score of position `t` is one
//! dot product with cache row `t`; the probability-weighted sum of the latents is mapped to
//! the head's value afterwards (`attn_v_b`). Both maps are per-head matvecs the caller runs.
//!
//! The products run in the cache's dtype as in `attention`: queries and probabilities are
//! narrowed to it; scores are scaled after the dot product and softmaxed in f32.

use super::attention::{check_positions, dot, CacheRows};
use super::{softmax, KvDtype};

/// One layer's latent cache: `capacity` rows of `kv_lora + rope` values.
pub struct LatentCache {
    rows: CacheRows,
    kv_lora: usize,
    width: usize,
    capacity: usize,
}

impl LatentCache {
    /// An empty (zero-filled) cache.
    pub fn new(dtype: KvDtype, kv_lora: usize, rope: usize, capacity: usize) -> LatentCache {
        LatentCache {
            rows: CacheRows::new(dtype, kv_lora + rope, capacity),
            kv_lora,
            width: kv_lora + rope,
            capacity,
        }
    }

    /// Positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Stores position `pos`'s row: the normalized latent, then the roped key.
    pub fn write(&mut self, pos: usize, row: &[f32]) {
        assert!(
            pos < self.capacity && row.len() == self.width,
            "latent cache: position {pos} of {}, row of {} values for {}",
            self.capacity,
            row.len(),
            self.width
        );
        self.rows.write(pos, row);
    }
}

/// `out[h] = softmax(scale * q[h] . row[0..n_ctx]) . latent[0..n_ctx]` for every head `h`:
/// `q` holds `n_heads` queries of `kv_lora + rope` values in latent space, `out` receives
/// `n_heads` latents of `kv_lora` values.
pub fn latent_attention(
    q: &[f32],
    cache: &LatentCache,
    n_heads: usize,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    check_positions("latent attention", n_ctx, cache.capacity);
    attend(q, cache, n_heads, (0..n_ctx, n_ctx), scale, out);
}

/// `latent_attention` over the cache rows `cells` only (in that order): DSA's sparse
/// attention over the indexer's selection.
pub fn latent_attention_at(
    q: &[f32],
    cache: &LatentCache,
    n_heads: usize,
    cells: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    if let Some(&last) = cells.iter().max() {
        check_positions("sparse latent attention", last + 1, cache.capacity);
    }
    attend(
        q,
        cache,
        n_heads,
        (cells.iter().copied(), cells.len()),
        scale,
        out,
    );
}

/// The attention of `latent_attention` over `n` cache rows that `cells` yields.
fn attend<I: Iterator<Item = usize> + Clone>(
    q: &[f32],
    cache: &LatentCache,
    n_heads: usize,
    (cells, n_ctx): (I, usize),
    scale: f32,
    out: &mut [f32],
) {
    let (w, kvl) = (cache.width, cache.kv_lora);
    assert!(
        q.len() == n_heads * w && out.len() == n_heads * kvl,
        "latent attention: q must hold n_heads rows of {w}, out n_heads rows of {kvl}"
    );
    let q: Vec<f32> = q.iter().map(|&x| cache.rows.round(x)).collect();
    let mut row = vec![0f32; w];
    let mut scores = vec![0f32; n_heads * n_ctx];
    for (i, pos) in cells.clone().enumerate() {
        cache.rows.read(pos, 0, &mut row);
        for (h, qh) in q.chunks_exact(w).enumerate() {
            scores[h * n_ctx + i] = dot(qh, &row) * scale;
        }
    }
    for s in scores.chunks_exact_mut(n_ctx) {
        softmax(s);
    }
    out.fill(0.0);
    let latent = &mut row[..kvl];
    for (i, pos) in cells.enumerate() {
        cache.rows.read(pos, 0, latent);
        for (h, oh) in out.chunks_exact_mut(kvl).enumerate() {
            let p = cache.rows.round(scores[h * n_ctx + i]);
            for (o, &v) in oh.iter_mut().zip(latent.iter()) {
                *o += p * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use memra_gguf::rng::Rng;
    use memra_gguf::GgmlType;

    use super::super::{matvec, uniform_values, Pool, Weight};
    use super::*;

    /// Absorbed decode (query mapped into the latent, cache of latents, value mapped out)
    /// equals plain multi-head attention over the expanded keys `[k_b^T c, k_pe]` and values
    /// `v_b c`, computed in f64.
    #[test]
    fn absorbed_attention_equals_expanded_attention() {
        let (heads, nope, rope, kvl, v, n_ctx) = (3, 8, 4, 16, 8, 5);
        let mut r = Rng::new(7);
        let k_b: Vec<Vec<f32>> = (0..heads)
            .map(|_| uniform_values(kvl * nope, &mut r))
            .collect();
        let v_b: Vec<Vec<f32>> = (0..heads)
            .map(|_| uniform_values(v * kvl, &mut r))
            .collect();
        let latents: Vec<Vec<f32>> = (0..n_ctx)
            .map(|_| uniform_values(kvl + rope, &mut r))
            .collect();
        let q: Vec<Vec<f32>> = (0..heads)
            .map(|_| uniform_values(nope + rope, &mut r))
            .collect();
        let scale = 0.3f32;
        let pool = Pool::new(1);
        let bytes = |m: &[f32]| m.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();

        let mut cache = LatentCache::new(KvDtype::F32, kvl, rope, n_ctx);
        for (t, c) in latents.iter().enumerate() {
            cache.write(t, c);
        }
        let mut q_lat = vec![0f32; heads * (kvl + rope)];
        for h in 0..heads {
            let data = bytes(&k_b[h]);
            let w = Weight::new(GgmlType::F32, &data, kvl, nope).unwrap();
            let row = &mut q_lat[h * (kvl + rope)..(h + 1) * (kvl + rope)];
            matvec(&pool, &w, &q[h][..nope], 1, &mut row[..kvl]);
            row[kvl..].copy_from_slice(&q[h][nope..]);
        }
        let mut lat_out = vec![0f32; heads * kvl];
        latent_attention(&q_lat, &cache, heads, n_ctx, scale, &mut lat_out);
        let mut got = vec![0f32; heads * v];
        for h in 0..heads {
            let data = bytes(&v_b[h]);
            let w = Weight::new(GgmlType::F32, &data, v, kvl).unwrap();
            matvec(
                &pool,
                &w,
                &lat_out[h * kvl..(h + 1) * kvl],
                1,
                &mut got[h * v..(h + 1) * v],
            );
        }

        for h in 0..heads {
            let f = |x: f32| f64::from(x);
            let key = |c: &[f32]| -> Vec<f64> {
                let mut k: Vec<f64> = (0..nope)
                    .map(|i| (0..kvl).map(|j| f(k_b[h][j * nope + i]) * f(c[j])).sum())
                    .collect();
                k.extend(c[kvl..].iter().map(|&x| f(x)));
                k
            };
            let scores: Vec<f64> = latents
                .iter()
                .map(|c| {
                    let k = key(c);
                    q[h].iter().zip(&k).map(|(&a, b)| f(a) * b).sum::<f64>() * f(scale)
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for i in 0..v {
                let want: f64 = latents
                    .iter()
                    .zip(&scores)
                    .map(|(c, s)| {
                        let value: f64 = (0..kvl).map(|j| f(v_b[h][i * kvl + j]) * f(c[j])).sum();
                        (s - max).exp() / total * value
                    })
                    .sum();
                let g = f64::from(got[h * v + i]);
                assert!(
                    (g - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "head {h} dim {i}: {g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn a_half_cache_narrows_rows_and_queries() {
        let mut cache = LatentCache::new(KvDtype::F16, 2, 2, 1);
        cache.write(0, &[1.0, 1.0 / 3.0, 0.5, 2.0]);
        let mut out = vec![0f32; 2];
        latent_attention(&[1.0, 1.0, 0.0, 0.0], &cache, 1, 1, 1.0, &mut out);
        let third = memra_gguf::f16::f16_to_f32(memra_gguf::f16::f32_to_f16(1.0 / 3.0));
        assert_eq!(out, [1.0, third]);
    }
}
