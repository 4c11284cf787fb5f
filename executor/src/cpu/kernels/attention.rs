//! Attention over a KV cache, for one query row or a prefill step's consecutive rows: grouped-query heads, scores scaled by
//! `1 / sqrt(head_dim)`, softmax in f32 with max subtraction. The cache stores f32, f16 or
//! bf16 (narrowed with round-to-nearest-even on write); each cached row is widened once per
//! KV head and shared by the query heads of its group.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use memra_gguf::f16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

use super::{simd_available, softmax};

/// Element type of a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
}

/// Rows of `width` values in a cache dtype, narrowed with round-to-nearest-even on write and
/// widened on read: the storage of the KV cache and of MLA's latent cache.
pub(super) struct CacheRows {
    dtype: KvDtype,
    width: usize,
    store: Store,
}

enum Store {
    F32(Vec<f32>),
    Half(Vec<u16>),
}

impl CacheRows {
    /// `capacity` zero rows.
    pub(super) fn new(dtype: KvDtype, width: usize, capacity: usize) -> CacheRows {
        let n = width * capacity;
        let store = match dtype {
            KvDtype::F32 => Store::F32(vec![0.0; n]),
            KvDtype::F16 | KvDtype::BF16 => Store::Half(vec![0; n]),
        };
        CacheRows {
            dtype,
            width,
            store,
        }
    }

    /// Stores row `pos`.
    pub(super) fn write(&mut self, pos: usize, src: &[f32]) {
        let row = &mut self.store;
        let at = pos * self.width;
        match row {
            Store::F32(s) => s[at..at + self.width].copy_from_slice(src),
            Store::Half(s) => {
                let narrow = if self.dtype == KvDtype::F16 {
                    f32_to_f16
                } else {
                    f32_to_bf16
                };
                for (d, &x) in s[at..at + self.width].iter_mut().zip(src) {
                    *d = narrow(x);
                }
            }
        }
    }

    /// Widens `out.len()` values of row `pos` from element `from` on.
    pub(super) fn read(&self, pos: usize, from: usize, out: &mut [f32]) {
        let at = pos * self.width + from;
        let n = out.len();
        match &self.store {
            Store::F32(s) => out.copy_from_slice(&s[at..at + n]),
            Store::Half(s) if self.dtype == KvDtype::BF16 => {
                for (o, &h) in out.iter_mut().zip(&s[at..at + n]) {
                    *o = bf16_to_f32(h);
                }
            }
            Store::Half(s) => widen_f16(&s[at..at + n], out),
        }
    }

    /// The value as the cache's dtype stores it, widened back (products run in that dtype).
    pub(super) fn round(&self, x: f32) -> f32 {
        match self.dtype {
            KvDtype::F32 => x,
            KvDtype::F16 => f16_to_f32(f32_to_f16(x)),
            KvDtype::BF16 => bf16_to_f32(f32_to_bf16(x)),
        }
    }
}

/// One layer's K and V cache: `capacity` positions of `n_kv_heads * head_dim` values each.
pub struct KvCache {
    dtype: KvDtype,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    k: CacheRows,
    v: CacheRows,
}

impl KvCache {
    /// An empty cache (zero-filled) for `capacity` positions.
    pub fn new(dtype: KvDtype, n_kv_heads: usize, head_dim: usize, capacity: usize) -> KvCache {
        let row = n_kv_heads * head_dim;
        KvCache {
            dtype,
            n_kv_heads,
            head_dim,
            capacity,
            k: CacheRows::new(dtype, row, capacity),
            v: CacheRows::new(dtype, row, capacity),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Number of positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Stores the key and value rows (`n_kv_heads * head_dim` each) of position `pos`.
    pub fn write(&mut self, pos: usize, k: &[f32], v: &[f32]) {
        let row = self.n_kv_heads * self.head_dim;
        assert!(
            pos < self.capacity,
            "kv cache: position {pos} is beyond capacity {}",
            self.capacity
        );
        assert!(
            k.len() == row && v.len() == row,
            "kv cache: rows must have {row} values"
        );
        self.k.write(pos, k);
        self.v.write(pos, v);
    }
}

/// `out[h] = softmax(q[h] . k[0..n_ctx_used] / sqrt(head_dim)) . v[0..n_ctx_used]` for every
/// query head `h`; query head `h` reads KV head `h / (n_heads / n_kv_heads)`. One query row:
/// `attention_rows` with the row at position `n_ctx_used - 1`.
pub fn attention(q: &[f32], kv: &KvCache, n_heads: usize, n_ctx_used: usize, out: &mut [f32]) {
    check_positions("attention", n_ctx_used, kv.capacity);
    attention_rows(q, kv, n_heads, n_ctx_used - 1, out);
}

/// Causal attention of consecutive query rows: row `i` of `q` (`n_heads * head_dim` values)
/// sits at position `first + i` and attends to positions `0..=first + i`. Each cached row is
/// widened once for every query row that reads it; each (row, head) runs the operations of a
/// lone query in the same order, so a row's bits do not depend on the rows beside it.
pub fn attention_rows(q: &[f32], kv: &KvCache, n_heads: usize, first: usize, out: &mut [f32]) {
    let hd = kv.head_dim;
    let width = n_heads * hd;
    assert!(
        n_heads.is_multiple_of(kv.n_kv_heads),
        "attention: {n_heads} heads do not group over {} kv heads",
        kv.n_kv_heads
    );
    assert!(
        q.len() == out.len() && !q.is_empty() && q.len().is_multiple_of(width),
        "attention: q and out must hold rows of n_heads * head_dim values"
    );
    let rows = q.len() / width;
    let n_max = first + rows;
    check_positions("attention", n_max, kv.capacity);
    let group = n_heads / kv.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    // The products run in the cache's dtype: q and the probabilities are narrowed to it.
    let narrow = |x: f32| kv.k.round(x);
    let q: Vec<f32> = q.iter().map(|&x| narrow(x)).collect();
    let mut row = vec![0f32; hd];
    // scores of (query row i, group head g) over positions: at (i * group + g) * n_max
    let mut scores = vec![0f32; rows * group * n_max];
    // the query rows that read position `pos`: those at `pos` or later
    let readers = |pos: usize| pos.saturating_sub(first)..rows;
    for kvh in 0..kv.n_kv_heads {
        for pos in 0..n_max {
            kv.k.read(pos, kvh * hd, &mut row);
            for i in readers(pos) {
                for g in 0..group {
                    let h = kvh * group + g;
                    let qh = &q[i * width + h * hd..i * width + (h + 1) * hd];
                    scores[(i * group + g) * n_max + pos] = dot(qh, &row) * scale;
                }
            }
        }
        for i in 0..rows {
            let n = first + i + 1;
            for g in 0..group {
                let at = (i * group + g) * n_max;
                softmax(&mut scores[at..at + n]);
                let h = kvh * group + g;
                out[i * width + h * hd..i * width + (h + 1) * hd].fill(0.0);
            }
        }
        for pos in 0..n_max {
            kv.v.read(pos, kvh * hd, &mut row);
            for i in readers(pos) {
                for g in 0..group {
                    let h = kvh * group + g;
                    let p = narrow(scores[(i * group + g) * n_max + pos]);
                    let o = &mut out[i * width + h * hd..i * width + (h + 1) * hd];
                    for (o, &v) in o.iter_mut().zip(&row) {
                        *o += p * v;
                    }
                }
            }
        }
    }
}

/// Fails unless `n_ctx` positions (at least one) fit a cache of `capacity`; `kernel` names the
/// caller in the message.
pub(super) fn check_positions(kernel: &str, n_ctx: usize, capacity: usize) {
    assert!(
        n_ctx > 0 && n_ctx <= capacity,
        "{kernel}: {n_ctx} positions for a cache of {capacity}"
    );
}

/// Dot product in eight interleaved f32 lanes (so the compiler can vectorize it).
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let full = a.len() / 8 * 8;
    for (ca, cb) in a[..full].chunks_exact(8).zip(b[..full].chunks_exact(8)) {
        for ((l, &x), &y) in lanes.iter_mut().zip(ca).zip(cb) {
            *l += x * y;
        }
    }
    let mut s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    for (&x, &y) in a[full..].iter().zip(&b[full..]) {
        s += x * y;
    }
    s
}

/// f16 to f32 for a cache row; F16C when present (exact either way).
fn widen_f16(src: &[u16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: F16C was detected
        return unsafe { widen_f16_f16c(src, out) };
    }
    for (o, &h) in out.iter_mut().zip(src) {
        *o = f16_to_f32(h);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn widen_f16_f16c(src: &[u16], out: &mut [f32]) {
    let full = src.len().min(out.len()) / 8 * 8;
    for (s, o) in src[..full]
        .chunks_exact(8)
        .zip(out[..full].chunks_exact_mut(8))
    {
        // SAFETY: 8 halves in, 8 floats out
        unsafe {
            _mm256_storeu_ps(
                o.as_mut_ptr(),
                _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast())),
            )
        };
    }
    for (o, &h) in out[full..].iter_mut().zip(&src[full..]) {
        *o = f16_to_f32(h);
    }
}
