//! Tests of the non-matvec kernels against f64 references with per-op tolerances (rms_norm,
//! rope in both styles, attention over each KV dtype with grouped heads, silu_mul, softmax,
//! add) and of the pool (every index once, panics re-raised, disjoint splits).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use memra_gguf::f16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use memra_gguf::rng::Rng;

use super::*;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.uniform() * 3.0).collect()
}

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w} (err {err:e})"
        );
    }
}

#[test]
fn rms_norm_matches_reference() {
    let (x, w) = (random(577, 1), random(577, 2));
    let mut out = vec![0f32; 577];
    rms_norm(&x, &w, 1e-5, &mut out);
    let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 577.0;
    let want: Vec<f64> = x
        .iter()
        .zip(&w)
        .map(|(&v, &w)| f64::from(v) / (ms + 1e-5).sqrt() * f64::from(w))
        .collect();
    close(&out, &want, 1e-6, "rms_norm");
}

#[test]
fn rope_matches_reference_in_both_styles() {
    let (heads, hd, theta) = (3, 64, 10000f32);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for pos in [0, 1, 37] {
            let x = random(heads * hd, 3 + pos as u64);
            let mut got = x.clone();
            rope(&mut got, heads, hd, pos, theta, style);
            let mut want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            for h in want.chunks_exact_mut(hd) {
                for i in 0..hd / 2 {
                    let a = pos as f64 * f64::from(theta).powf(-2.0 * i as f64 / hd as f64);
                    let (p, q) = if style == RopeStyle::Normal {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + hd / 2)
                    };
                    let (x0, x1) = (h[p], h[q]);
                    h[p] = x0 * a.cos() - x1 * a.sin();
                    h[q] = x0 * a.sin() + x1 * a.cos();
                }
            }
            close(&got, &want, 2e-5, &format!("rope {style:?} pos {pos}"));
        }
    }
    // pair 0 of a normal-style head turns by exactly `pos` radians
    let mut x = vec![0f32; 8];
    x[0] = 1.0;
    rope(&mut x, 1, 8, 3, 10000.0, RopeStyle::Normal);
    assert_eq!((x[0], x[1]), (3f32.cos(), 3f32.sin()));
}

#[test]
fn attention_matches_reference_for_each_kv_dtype() {
    let (n_heads, n_kv, hd, cap) = (6, 2, 40, 20);
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::BF16] {
        let mut kv = KvCache::new(dtype, n_kv, hd, cap);
        let round = |v: f32| match dtype {
            KvDtype::F32 => v,
            KvDtype::F16 => f16_to_f32(f32_to_f16(v)),
            KvDtype::BF16 => bf16_to_f32(f32_to_bf16(v)),
        };
        let (mut ks, mut vs) = (vec![], vec![]);
        for pos in 0..cap {
            let (k, v) = (
                random(n_kv * hd, 100 + pos as u64),
                random(n_kv * hd, 200 + pos as u64),
            );
            kv.write(pos, &k, &v);
            ks.push(k.iter().map(|&x| f64::from(round(x))).collect::<Vec<_>>());
            vs.push(v.iter().map(|&x| f64::from(round(x))).collect::<Vec<_>>());
        }
        let q = random(n_heads * hd, 9);
        // The kernel narrows q and the probabilities to the cache's dtype.
        let qr: Vec<f32> = q.iter().map(|&v| round(v)).collect();
        for n_ctx in [1, 17] {
            let mut out = vec![f32::NAN; n_heads * hd];
            attention(&q, &kv, n_heads, n_ctx, &mut out);
            let mut want = vec![0f64; n_heads * hd];
            for h in 0..n_heads {
                let kh = h / (n_heads / n_kv);
                let qh = &qr[h * hd..(h + 1) * hd];
                let s: Vec<f64> = (0..n_ctx)
                    .map(|p| {
                        let k = &ks[p][kh * hd..(kh + 1) * hd];
                        qh.iter()
                            .zip(k)
                            .map(|(&a, &b)| f64::from(a) * b)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (p, e) in e.iter().enumerate() {
                    for d in 0..hd {
                        let prob = f64::from(round((e / sum) as f32));
                        want[h * hd + d] += prob * vs[p][kh * hd + d];
                    }
                }
            }
            close(
                &out,
                &want,
                2e-5,
                &format!("attention {dtype:?} ctx {n_ctx}"),
            );
        }
    }
}

#[test]
fn elementwise_helpers_match_reference() {
    let (g, u) = (random(101, 4), random(101, 5));
    let mut got = g.clone();
    silu_mul(&mut got, &u);
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u))
        .collect();
    close(&got, &want, 1e-6, "silu_mul");

    let mut s = random(50, 6);
    let x = s.clone();
    softmax(&mut s);
    let max = x.iter().cloned().fold(f32::MIN, f32::max);
    let sum: f64 = x.iter().map(|&v| f64::from(v - max).exp()).sum();
    let want: Vec<f64> = x.iter().map(|&v| f64::from(v - max).exp() / sum).collect();
    close(&s, &want, 1e-6, "softmax");

    let mut a = random(9, 7);
    let b = random(9, 8);
    let want: Vec<f64> = a.iter().zip(&b).map(|(&a, &b)| f64::from(a + b)).collect();
    add(&mut a, &b);
    close(&a, &want, 0.0, "add");
}

#[test]
fn pool_runs_every_index_once_and_reraises_panics() {
    let pool = Pool::new(3);
    for tasks in [0, 1, 2, 3, 7, 100] {
        let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
        pool.run(tasks, &|t| {
            hits[t].fetch_add(1, Ordering::Relaxed);
        });
        assert!(
            hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
            "{tasks} tasks"
        );
    }
    let r = catch_unwind(AssertUnwindSafe(|| {
        pool.run(9, &|t| assert!(t != 2, "boom"))
    }));
    assert!(r.is_err());
    // the pool still works after a panic
    let mut v = vec![0usize; 103];
    pool.split_mut(&mut v, 4, &|off, piece| {
        assert!(off % 4 == 0);
        for (i, x) in piece.iter_mut().enumerate() {
            *x += off + i + 1;
        }
    });
    assert!(v.iter().enumerate().all(|(i, &x)| x == i + 1));
}

#[test]
fn attention_rows_give_each_row_its_lone_query_bits() {
    let (n_heads, n_kv, hd, cap) = (6, 2, 40, 24);
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::BF16] {
        let mut kv = KvCache::new(dtype, n_kv, hd, cap);
        for pos in 0..cap {
            let (k, v) = (
                random(n_kv * hd, 300 + pos as u64),
                random(n_kv * hd, 400 + pos as u64),
            );
            kv.write(pos, &k, &v);
        }
        let width = n_heads * hd;
        // rows 5..16: a cached prefix of five positions, then eleven causal rows
        let (first, rows) = (5, 11);
        let q = random(rows * width, 11);
        let mut got = vec![f32::NAN; rows * width];
        attention_rows(&q, &kv, n_heads, first, &mut got);
        for i in 0..rows {
            let mut want = vec![f32::NAN; width];
            attention(
                &q[i * width..(i + 1) * width],
                &kv,
                n_heads,
                first + i + 1,
                &mut want,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got[i * width..(i + 1) * width]),
                bits(&want),
                "{dtype:?} row {i}"
            );
        }
    }
}
