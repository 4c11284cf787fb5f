//! The DSA indexer with k-pool compression (glm5-next), as llama.cpp computes it
//! (`build_kpool_select`, `set_input_kpool`, the CPU `lightning_indexer`): each token leaves a
//! key and a pool gate in the layer's indexer cache; each run of `kpool` consecutive tokens,
//! once complete, pools into one key (per channel, a softmax over the members of gate plus a
//! learned position term weighs the members' keys). A token scores every complete pool with
//! `sum_h w_h relu(q_h . pool)`, and its MLA softmax runs over the members of the best
//! `top_k / kpool` pools (all of them while fewer are complete) plus, with `select_tail`, the
//! tokens of the incomplete pool it sits in.

use super::softmax;

/// One layer's indexer cache: per position the key and the gate, per complete pool the
/// pooled key; all f32.
pub struct IndexerCache {
    head_dim: usize,
    kpool: usize,
    capacity: usize,
    /// `capacity` rows of key then gate.
    rows: Vec<f32>,
    /// One pooled key per complete pool, in pool order.
    pooled: Vec<f32>,
}

/// What the indexer selects with.
pub struct Selection {
    pub top_k: usize,
    pub select_tail: bool,
}

impl IndexerCache {
    /// An empty cache for `capacity` positions.
    pub fn new(head_dim: usize, kpool: usize, capacity: usize) -> IndexerCache {
        assert!(kpool >= 2, "indexer cache: pools of {kpool} tokens");
        IndexerCache {
            head_dim,
            kpool,
            capacity,
            rows: vec![0.0; 2 * head_dim * capacity],
            pooled: Vec::new(),
        }
    }

    /// Positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Stores position `pos`'s key and gate (positions arrive in order); when `pos` completes
    /// a pool, pools it with the position terms `ape` (`kpool` rows of `head_dim`).
    pub fn write(&mut self, pos: usize, key: &[f32], gate: &[f32], ape: &[f32]) {
        let (id, kp) = (self.head_dim, self.kpool);
        assert!(
            pos < self.capacity && key.len() == id && gate.len() == id && ape.len() == kp * id,
            "indexer cache: position {pos} of {}, rows of {id}, {kp} position terms",
            self.capacity
        );
        let row = &mut self.rows[2 * id * pos..2 * id * (pos + 1)];
        row[..id].copy_from_slice(key);
        row[id..].copy_from_slice(gate);
        let pool = pos / kp;
        self.pooled.truncate(pool * id);
        if !(pos + 1).is_multiple_of(kp) {
            return;
        }
        let first = pool * kp;
        let mut probs = vec![0f32; kp];
        for d in 0..id {
            for (m, p) in probs.iter_mut().enumerate() {
                *p = self.rows[2 * id * (first + m) + id + d] + ape[m * id + d];
            }
            softmax(&mut probs);
            let mut sum = 0f32;
            for (m, &p) in probs.iter().enumerate() {
                sum += p * self.rows[2 * id * (first + m) + d];
            }
            self.pooled.push(sum);
        }
    }

    /// The cells the token at `pos` attends to, into `cells`: the members of the
    /// best-scoring complete pools (best first), then the incomplete pool's tokens from `pos`
    /// down. `q` holds the token's indexer queries (`weights.len()` heads of `head_dim`),
    /// `weights` its per-head weights (already scaled).
    pub fn select(
        &self,
        q: &[f32],
        weights: &[f32],
        pos: usize,
        how: &Selection,
        cells: &mut Vec<usize>,
    ) {
        let (id, kp) = (self.head_dim, self.kpool);
        assert_eq!(
            q.len(),
            weights.len() * id,
            "indexer select: q and weights differ"
        );
        let complete = (pos + 1) / kp;
        assert!(
            self.pooled.len() >= complete * id,
            "indexer select: position {pos} before its pools were written"
        );
        // llama.cpp scores a row of pools padded to a multiple of 64 (at least 64), the
        // incomplete and padded ones at -inf; its top-k keeps its own choice among equal
        // scores (pools whose heads all score below zero tie at 0), so memra takes the same
        let padded = (complete + 1).div_ceil(64).max(1) * 64;
        let mut scores = vec![f32::NEG_INFINITY; padded];
        for (j, score) in scores.iter_mut().enumerate().take(complete) {
            let pool = &self.pooled[j * id..(j + 1) * id];
            let mut s = 0f32;
            for (qh, &w) in q.chunks_exact(id).zip(weights) {
                let qk: f32 = qh.iter().zip(pool).map(|(a, b)| a * b).sum();
                s += qk.max(0.0) * w;
            }
            *score = s;
        }
        let n_top = (how.top_k / kp).min(padded);
        let mut top = ggml_top_k(&scores, n_top);
        // then ordered by descending score (ggml's argsort: an insertion sort, stable, for
        // up to 16 pools)
        top.sort_by(|&a, &b| {
            scores[b]
                .partial_cmp(&scores[a])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        cells.clear();
        for &j in top.iter().take(complete.min(n_top)) {
            cells.extend(j * kp..(j + 1) * kp);
        }
        if how.select_tail {
            let tail = (pos + 1) % kp;
            cells.extend((0..tail).map(|k| pos - k));
        }
    }
}

/// The indices of the `k` largest values of `v` as ggml's CPU `top_k` picks them:
/// libstdc++'s `std::partial_sort` with `greater` over the indices (a heap of the first `k`,
/// whose top, the smallest, is replaced only by a strictly larger value; equal values keep
/// the choice its heap order makes), then ggml's swap of the first two.
pub fn ggml_top_k(v: &[f32], k: usize) -> Vec<usize> {
    let greater = |a: usize, b: usize| v[a] > v[b];
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let k = k.min(v.len());
    // make_heap on idx[..k]
    if k >= 2 {
        let mut parent = (k - 2) / 2;
        loop {
            let value = idx[parent];
            adjust_heap(&mut idx[..k], parent, value, &greater);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    for i in k..v.len() {
        if k > 0 && greater(idx[i], idx[0]) {
            // pop_heap(first, middle, i)
            let value = idx[i];
            idx[i] = idx[0];
            adjust_heap(&mut idx[..k], 0, value, &greater);
        }
    }
    // sort_heap(first, middle)
    let mut last = k;
    while last > 1 {
        last -= 1;
        let value = idx[last];
        idx[last] = idx[0];
        adjust_heap(&mut idx[..last], 0, value, &greater);
    }
    idx.truncate(k);
    if k > 1 {
        idx.swap(0, 1);
    }
    idx
}

/// libstdc++'s `__adjust_heap` then `__push_heap` over `heap`, with the hole at `hole`.
fn adjust_heap(
    heap: &mut [usize],
    mut hole: usize,
    value: usize,
    comp: &impl Fn(usize, usize) -> bool,
) {
    let len = heap.len();
    let top = hole;
    let mut child = hole;
    while len >= 1 && child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if comp(heap[child], heap[child - 1]) {
            child -= 1;
        }
        heap[hole] = heap[child];
        hole = child;
    }
    if len.is_multiple_of(2) && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        heap[hole] = heap[child - 1];
        hole = child - 1;
    }
    // push_heap
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(heap[parent], value) {
            break;
        }
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = value;
}

/// ggml's layer norm with weight and bias: `(x - mean) / sqrt(var + eps) * w + b`.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == w.len() && x.len() == b.len() && x.len() == out.len(),
        "layer_norm: lengths differ"
    );
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| f64::from(v)).sum::<f64>() / n) as f32;
    let mut var = 0f64;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v - mean;
        var += f64::from(*o * *o);
    }
    let scale = 1.0 / ((var / n) as f32 + eps).sqrt();
    for ((o, &w), &b) in out.iter_mut().zip(w).zip(b) {
        *o = *o * scale * w + b;
    }
}

#[cfg(test)]
mod tests {
    use super::super::uniform_values;
    use super::*;
    use memra_gguf::rng::Rng;

    /// Pools are written when complete and equal the per-channel softmax-weighted keys; the
    /// selection keeps every complete pool until there are more than `top_k / kpool`, then
    /// the best-scoring ones by brute force, and always the incomplete pool's tokens.
    #[test]
    fn selection_matches_brute_force() {
        let (id, kp, heads, n) = (8, 4, 2, 23);
        let mut r = Rng::new(5);
        let ape = uniform_values(kp * id, &mut r);
        let mut cache = IndexerCache::new(id, kp, 64);
        let keys: Vec<Vec<f32>> = (0..n).map(|_| uniform_values(id, &mut r)).collect();
        let gates: Vec<Vec<f32>> = (0..n).map(|_| uniform_values(id, &mut r)).collect();
        let how = Selection {
            top_k: 8,
            select_tail: true,
        };
        let mut cells = Vec::new();
        for pos in 0..n {
            cache.write(pos, &keys[pos], &gates[pos], &ape);
            let q = uniform_values(heads * id, &mut r);
            let w = uniform_values(heads, &mut r);
            cache.select(&q, &w, pos, &how, &mut cells);
            let complete = (pos + 1) / kp;
            let pooled = |j: usize| -> Vec<f64> {
                (0..id)
                    .map(|d| {
                        let l: Vec<f64> = (0..kp)
                            .map(|m| f64::from(gates[j * kp + m][d] + ape[m * id + d]))
                            .collect();
                        let max = l.iter().cloned().fold(f64::MIN, f64::max);
                        let z: f64 = l.iter().map(|v| (v - max).exp()).sum();
                        (0..kp)
                            .map(|m| (l[m] - max).exp() / z * f64::from(keys[j * kp + m][d]))
                            .sum()
                    })
                    .collect()
            };
            let mut scores: Vec<(f64, usize)> = (0..complete)
                .map(|j| {
                    let p = pooled(j);
                    let s = (0..heads)
                        .map(|h| {
                            let qk: f64 = (0..id).map(|d| f64::from(q[h * id + d]) * p[d]).sum();
                            qk.max(0.0) * f64::from(w[h])
                        })
                        .sum();
                    (s, j)
                })
                .collect();
            scores.sort_by(|a, b| b.0.total_cmp(&a.0));
            // the selected pools hold the best scores (which of equal ones: `ggml_top_k`)
            let mut got: Vec<f64> = cells[..cells.len() - (pos + 1) % kp]
                .chunks(kp)
                .map(|c| scores.iter().find(|s| s.1 == c[0] / kp).unwrap().0)
                .collect();
            got.sort_by(|a, b| b.total_cmp(a));
            let want: Vec<f64> = scores.iter().take(2).map(|s| s.0).collect();
            assert_eq!(got.len(), want.len(), "position {pos}");
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "position {pos}: {got:?} {want:?}");
            }
            let tail: Vec<usize> = (0..(pos + 1) % kp).map(|k| pos - k).collect();
            assert_eq!(
                cells[cells.len() - tail.len()..],
                tail[..],
                "position {pos}"
            );
            assert!(cells.contains(&pos) || scores.len() > 2, "position {pos}");
        }
    }

    /// libstdc++'s choice among equal values, derived by hand from its heap code: four
    /// zeros give the first two; a larger value evicts the heap's top (pool 1), not pool 0.
    #[test]
    fn top_k_keeps_ggml_choice_among_equal_values() {
        assert_eq!(ggml_top_k(&[0.0; 4], 2), [1, 0]);
        assert_eq!(ggml_top_k(&[0.0, 0.0, 5.0, 0.0], 2), [0, 2]);
        let v = [0.5, 3.0, -1.0, 2.0, 7.0, 0.1];
        let mut top = ggml_top_k(&v, 3);
        top.sort_unstable();
        assert_eq!(top, [1, 3, 4]);
    }

    /// Against the definition in f64.
    #[test]
    fn layer_norm_matches_its_definition() {
        let mut r = Rng::new(2);
        let (x, w, b) = (
            uniform_values(33, &mut r),
            uniform_values(33, &mut r),
            uniform_values(33, &mut r),
        );
        let mut out = vec![0.0; 33];
        layer_norm(&x, &w, &b, 1e-6, &mut out);
        let mean: f64 = x.iter().map(|&v| f64::from(v)).sum::<f64>() / 33.0;
        let var: f64 = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / 33.0;
        for i in 0..33 {
            let want =
                (f64::from(x[i]) - mean) / (var + 1e-6).sqrt() * f64::from(w[i]) + f64::from(b[i]);
            assert!((f64::from(out[i]) - want).abs() < 1e-5, "{i}");
        }
    }
}
