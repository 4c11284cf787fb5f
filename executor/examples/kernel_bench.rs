//! Times one SmolLM2-135M decode token's worth of CPU matvecs: 30 layers of q, k, v, o
//! (576 wide, 3 KV heads of 64), gate, up (1536) and down in Q4_1, plus the 49152-row Q8_0
//! head, with 1 and 2 threads; prints ms/token and the tok/s ceiling that implies. Weights
//! are seeded random (distinct memory per layer, so the working set matches the model).
//!
//! Run: `cargo run --release --example kernel_bench -p memra-executor`

use std::time::Instant;

use memra_executor::cpu::kernels::{matvec, simd_available, Pool, Weight};
use memra_gguf::rng::Rng;
use memra_gguf::GgmlType;

const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const KV: usize = 192;
const FFN: usize = 1536;
const VOCAB: usize = 49152;

fn random_weight(dtype: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let src: Vec<f32> = (0..rows * cols).map(|_| r.uniform()).collect();
    let mut out = vec![0u8; dtype.bytes_for((rows * cols) as u64).expect("whole blocks") as usize];
    memra_gguf::quantize(dtype, &src, &mut out).expect("valid sizes");
    out
}

/// The most chunks (a power of two, at most 8) that split `cols` into whole 32-blocks.
fn chunks_for(cols: usize) -> usize {
    let blocks = cols / 32;
    [8, 4, 2, 1]
        .into_iter()
        .find(|c| blocks.is_multiple_of(*c))
        .unwrap_or(1)
}

fn main() {
    let shapes = [
        (HIDDEN, HIDDEN),
        (KV, HIDDEN),
        (KV, HIDDEN),
        (HIDDEN, HIDDEN),
        (FFN, HIDDEN),
        (FFN, HIDDEN),
        (HIDDEN, FFN),
    ];
    // one layer's bytes generated once, copied per layer so every layer has its own memory
    let layer: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(r, c))| random_weight(GgmlType::Q4_1, r, c, i as u64))
        .collect();
    let layers: Vec<Vec<Vec<u8>>> = (0..LAYERS).map(|_| layer.clone()).collect();
    let head = random_weight(GgmlType::Q8_0, VOCAB, HIDDEN, 99);
    let mut rng = Rng::new(7);
    let x: Vec<f32> = (0..FFN).map(|_| rng.uniform()).collect();
    let mut y = vec![0f32; VOCAB];

    println!("simd (avx2+fma+f16c): {}", simd_available());
    for threads in [1, 2] {
        let pool = Pool::new(threads);
        let token = |y: &mut [f32]| {
            for l in &layers {
                for (bytes, &(rows, cols)) in l.iter().zip(&shapes) {
                    let w = Weight::new(GgmlType::Q4_1, bytes, rows, cols).expect("valid weight");
                    matvec(&pool, &w, &x[..cols], chunks_for(cols), &mut y[..rows]);
                }
            }
            let w = Weight::new(GgmlType::Q8_0, &head, VOCAB, HIDDEN).expect("valid weight");
            matvec(&pool, &w, &x[..HIDDEN], chunks_for(HIDDEN), y);
        };
        for _ in 0..3 {
            token(&mut y);
        }
        let n = 30;
        let mut best = f64::MAX;
        let start = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            token(&mut y);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let mean = start.elapsed().as_secs_f64() / n as f64;
        // time the head alone too: it is a third of the bytes
        let t = Instant::now();
        let w = Weight::new(GgmlType::Q8_0, &head, VOCAB, HIDDEN).expect("valid weight");
        for _ in 0..10 {
            matvec(&pool, &w, &x[..HIDDEN], chunks_for(HIDDEN), &mut y);
        }
        let head_ms = t.elapsed().as_secs_f64() * 100.0;
        println!(
            "threads {threads}: {:.2} ms/token mean, {:.2} best ({:.1} tok/s ceiling); head alone {head_ms:.2} ms",
            mean * 1e3,
            best * 1e3,
            1.0 / mean
        );
    }
}
