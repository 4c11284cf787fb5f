//! Matvec tests: every dtype against an f64 reference built from `memra_gguf::dequantize`,
//! at awkward sizes (row counts that are not multiples of four or of the thread count, 1, 2,
//! 4 and 8 chunks); bit-identity across thread counts, row subsets and SIMD versus scalar;
//! and the tensor-parallel subtree property, bit for bit.

use memra_gguf::rng::Rng;
use memra_gguf::GgmlType;

use super::act::{quantize_q8, quantize_q8k};
use super::matmul::{matmul_with, REPACK_MIN_TOKENS};
use super::reference::{effective_x, matvec_row};
use super::*;

fn random(n: usize, seed: u64) -> Vec<f32> {
    uniform_values(n, &mut Rng::new(seed))
}

fn random_weight(dtype: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let src = random(rows * cols, seed);
    let mut out = vec![0u8; dtype.bytes_for((rows * cols) as u64).unwrap() as usize];
    memra_gguf::quantize(dtype, &src, &mut out).unwrap();
    out
}

fn dequant(dtype: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    memra_gguf::dequantize(dtype, bytes, &mut out).unwrap();
    out
}

/// Column counts that give every dtype 1, 2, 4 and 8 whole-block chunks; the float ones
/// leave a tail of fewer than 32 elements in each chunk.
fn cols_for(dtype: GgmlType) -> usize {
    match dtype {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 8 * 45,
        GgmlType::Q4_K | GgmlType::Q6_K => 8 * 256,
        _ => 8 * 32 * 3,
    }
}

fn run(threads: usize, w: &Weight, x: &[f32], chunks: usize, simd: bool) -> Vec<f32> {
    let mut y = vec![f32::NAN; w.rows];
    matvec_with(&Pool::new(threads), w, x, chunks, &mut y, simd);
    y
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn matvec_matches_f64_reference() {
    for (t, &dtype) in memra_gguf::SUPPORTED.iter().enumerate() {
        let (rows, cols) = (37, cols_for(dtype));
        let bytes = random_weight(dtype, rows, cols, 100 + t as u64);
        let w = Weight::new(dtype, &bytes, rows, cols).unwrap();
        let wf = dequant(dtype, &bytes, rows * cols);
        let x = random(cols, 200 + t as u64);
        let xe = effective_x(dtype, &x);
        let rms_x = (x.iter().map(|&v| f64::from(v * v)).sum::<f64>() / cols as f64).sqrt();
        for chunks in [1, 2, 8] {
            let y = run(2, &w, &x, chunks, simd_available());
            for (r, &got) in y.iter().enumerate() {
                let row = &wf[r * cols..(r + 1) * cols];
                let row_bytes = &bytes[r * w.row_bytes()..(r + 1) * w.row_bytes()];
                let (exact, abs) = matvec_row(dtype, row, row_bytes, &x, &xe);
                // f32 accumulation of the same products: a few ulps of the absolute sum
                let tight = 4e-6 * abs + 1e-6;
                assert!(
                    (f64::from(got) - exact).abs() <= tight,
                    "{dtype} chunks {chunks} row {r}: {got} vs {exact} (tol {tight})"
                );
                // against the unquantized activations: within a few sigma of 8-bit rounding
                let truth: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let norm = row.iter().map(|&a| f64::from(a * a)).sum::<f64>().sqrt();
                let loose = 2e-2 * norm * rms_x + 1e-6;
                assert!(
                    (f64::from(got) - truth).abs() <= loose,
                    "{dtype} chunks {chunks} row {r}: {got} vs unquantized {truth} (tol {loose})"
                );
            }
        }
    }
}

#[test]
fn matvec_bits_independent_of_threads_rows_and_simd() {
    for (t, &dtype) in memra_gguf::SUPPORTED.iter().enumerate() {
        let (rows, cols) = (13, cols_for(dtype));
        let bytes = random_weight(dtype, rows, cols, 300 + t as u64);
        let w = Weight::new(dtype, &bytes, rows, cols).unwrap();
        let x = random(cols, 400 + t as u64);
        for chunks in [1, 4] {
            let want = bits(&run(1, &w, &x, chunks, false));
            for threads in [1, 2, 3] {
                let got = bits(&run(threads, &w, &x, chunks, simd_available()));
                assert_eq!(got, want, "{dtype} chunks {chunks} threads {threads}");
            }
            // rows 5..12 alone: a different split into SIMD groups and scalar tails
            let rb = w.row_bytes();
            let sub = Weight::new(dtype, &bytes[5 * rb..12 * rb], 7, cols).unwrap();
            let got = bits(&run(2, &sub, &x, chunks, simd_available()));
            assert_eq!(got, want[5..12], "{dtype} chunks {chunks} rows 5..12");
        }
    }
}

/// Each row's columns `[i * cols / d, (i + 1) * cols / d)`, as a TP rank holds them.
fn column_shard(w: &Weight, d: usize, i: usize) -> Vec<u8> {
    let rb = w.row_bytes();
    let (start, end) = (i * rb / d, (i + 1) * rb / d);
    w.data
        .chunks_exact(rb)
        .flat_map(|row| row[start..end].to_vec())
        .collect()
}

fn tree_combine(parts: &[Vec<f32>]) -> Vec<f32> {
    let mut level = parts.to_vec();
    while level.len() > 1 {
        level = level
            .chunks_exact(2)
            .map(|p| p[0].iter().zip(&p[1]).map(|(a, b)| a + b).collect())
            .collect();
    }
    level.pop().unwrap()
}

#[test]
fn tensor_parallel_shards_reproduce_the_full_result() {
    for (t, &dtype) in memra_gguf::SUPPORTED.iter().enumerate() {
        let (rows, cols) = (11, cols_for(dtype));
        let bytes = random_weight(dtype, rows, cols, 500 + t as u64);
        let w = Weight::new(dtype, &bytes, rows, cols).unwrap();
        let x = random(cols, 600 + t as u64);
        for (chunks, ranks) in [(8, &[2, 4, 8][..]), (4, &[2, 4][..]), (2, &[2][..])] {
            let full = bits(&run(2, &w, &x, chunks, simd_available()));
            for &d in ranks {
                let parts: Vec<Vec<f32>> = (0..d)
                    .map(|i| {
                        let shard = column_shard(&w, d, i);
                        let ws = Weight::new(dtype, &shard, rows, cols / d).unwrap();
                        run(
                            2,
                            &ws,
                            &x[i * cols / d..(i + 1) * cols / d],
                            chunks / d,
                            simd_available(),
                        )
                    })
                    .collect();
                assert_eq!(
                    bits(&tree_combine(&parts)),
                    full,
                    "{dtype} chunks {chunks} ranks {d}"
                );
            }
        }
    }
}

#[test]
fn activation_quantization_simd_matches_scalar() {
    if !simd_available() {
        return;
    }
    let x = random(1024, 7);
    let (a, b) = (quantize_q8(&x, false), quantize_q8(&x, true));
    for (a, b) in a.iter().zip(&b) {
        assert_eq!((a.qs, a.d.to_bits(), a.sum), (b.qs, b.d.to_bits(), b.sum));
    }
    let (a, b) = (quantize_q8k(&x, false), quantize_q8k(&x, true));
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(
            (a.qs, a.bsums, a.d.to_bits()),
            (b.qs, b.bsums, b.d.to_bits())
        );
    }
}

#[test]
fn weight_new_rejects_bad_shapes() {
    let e = Weight::new(GgmlType::Q4_1, &[0; 40], 1, 48).unwrap_err();
    assert_eq!(
        e.to_string(),
        "48 columns is not a multiple of the q4_1 block size 32"
    );
    let e = Weight::new(GgmlType::Q4_1, &[0; 39], 1, 64).unwrap_err();
    assert_eq!(e.to_string(), "a 1x64 q4_1 weight takes 40 bytes, got 39");
    let e = Weight::new(GgmlType::Q5_K, &[], 0, 0).unwrap_err();
    assert!(e.to_string().starts_with("q5_k is not supported"));
}

#[test]
fn embed_row_is_the_dequantized_row() {
    for (t, &dtype) in memra_gguf::SUPPORTED.iter().enumerate() {
        let (rows, cols) = (5, cols_for(dtype));
        let bytes = random_weight(dtype, rows, cols, 700 + t as u64);
        let w = Weight::new(dtype, &bytes, rows, cols).unwrap();
        let all = dequant(dtype, &bytes, rows * cols);
        let mut out = vec![f32::NAN; cols];
        embed_row(&w, 3, &mut out);
        assert_eq!(bits(&out), bits(&all[3 * cols..4 * cols]), "{dtype}");
    }
}

#[test]
fn matmul_rows_are_the_matvec_bits_of_each_token() {
    for (t, &dtype) in memra_gguf::SUPPORTED.iter().enumerate() {
        // rows not a multiple of the tile or of four; token counts that take the four-, two-
        // and one-token paths (3 and 5: verify steps of speculative decoding), without and
        // with repacked q4 tiles; fresh inputs
        for tokens in [2, 3, 5, 7, REPACK_MIN_TOKENS + 3] {
            let (rows, cols) = (45, cols_for(dtype));
            let bytes = random_weight(dtype, rows, cols, 300 + t as u64);
            let w = Weight::new(dtype, &bytes, rows, cols).unwrap();
            let x = random(tokens * cols, 400 + t as u64);
            for (threads, chunks, simd) in [(1, 1, false), (2, 2, true), (2, 8, simd_available())] {
                let mut want = Vec::new();
                for xt in x.chunks_exact(cols) {
                    want.extend(run(threads, &w, xt, chunks, simd));
                }
                let mut got = vec![f32::NAN; tokens * rows];
                matmul_with(&Pool::new(threads), &w, &x, chunks, &mut got, simd);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{dtype} tokens {tokens} threads {threads} chunks {chunks} simd {simd}"
                );
            }
        }
    }
}
