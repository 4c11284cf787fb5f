//! Matvec bandwidth on llama-8B shapes: for each dtype and shape, enough copies of the weight
//! to exceed the L2 cache several times are cycled through, each launch timed with CUDA events
//! over a batch, and the median batch gives GB/s as weight bytes read per second. A large
//! device-to-device copy (bytes read + written) gives the ceiling to compare with. Per dtype,
//! the shapes weighted by how often one decode token runs them give the token's matvec time:
//! its weight bytes over that time, against the copy, is the decode bandwidth the kernels
//! reach, and its inverse the tok/s they allow (attention and small ops excluded). Then the
//! same token's matvecs over batches of rows (a batched decode step of B sequences): the
//! step's time, the aggregate tok/s and its gain over one row. Last, attention of one decode
//! row over depths of context in each of its forms (walk or split, a block per head or per
//! four heads).

use std::sync::Arc;

use anyhow::{Context, Result};
use memra_gguf::rng::Rng;
use memra_gguf::GgmlType;

use super::{attend, random};
use crate::cuda::matvec::Epilogue;
use crate::cuda::matvec_mma::{has_mma, quantized_bytes, MmaTile, MMA_MIN_ROWS};
use crate::cuda::ops::{attention_parts_len, AttentionForm};
use crate::cuda::rows::GemmTile;
use crate::cuda::{CudaDevice, CudaStream, DeviceKv, DeviceWeight, RopeStyle, Span};
use memra_compiler::plan::reduction_chunks;

/// (rows, cols, launches per decode token) of llama-3-8B's matrices over its 32 layers: q and
/// o, k and v, FFN gate and up, FFN down, and the output head.
const SHAPES: [(usize, usize, usize); 5] = [
    (4096, 4096, 64),
    (1024, 4096, 64),
    (14336, 4096, 64),
    (4096, 14336, 32),
    (128256, 4096, 1),
];
const DTYPES: [GgmlType; 8] = [
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_1,
    GgmlType::F32,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];
/// Dtypes and activation rows of the batched table.
const BATCH_DTYPES: [GgmlType; 3] = [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K];
const BATCH_ROWS: [usize; 4] = [1, 4, 16, 64];
/// Bytes the rotating weight copies must cover (the H200's L2 is 60 MB).
const ROTATE_BYTES: usize = 256 << 20;
const BATCH: usize = 20;
const TRIALS: usize = 7;

pub(super) fn run(dev: &CudaDevice, s: &Arc<CudaStream>, rng: &mut Rng) -> Result<()> {
    let copy = dev.copy_bandwidth(s)?;
    println!("matvec bandwidth (weights read once per launch, chunks = 8, median of {TRIALS} batches of {BATCH})");
    println!(
        "{:<6} {:>12} {:>10} {:>9} {:>8} {:>8}",
        "dtype", "shape", "MB", "us", "GB/s", "of copy"
    );
    let mut tokens = Vec::new();
    for dtype in DTYPES {
        let (mut token_us, mut token_mb) = (0.0, 0.0);
        for (rows, cols, per_token) in SHAPES {
            let (us, gbs) = product_time(dev, s, rng, dtype, rows, cols, 1, Products::Tiles)?;
            let mb = dtype
                .bytes_for((rows * cols) as u64)
                .expect("invariant: whole blocks") as f64
                / 1e6;
            println!(
                "{:<6} {:>12} {mb:>10.1} {us:>9.2} {gbs:>8.0} {:>7.0}%",
                dtype.name(),
                format!("{rows}x{cols}"),
                100.0 * gbs / copy
            );
            token_us += per_token as f64 * us;
            token_mb += per_token as f64 * mb;
        }
        tokens.push((dtype, token_mb, token_us));
    }
    println!("device-to-device copy: {copy:.0} GB/s (bytes read + written)\n");
    println!("llama-3-8B decode token, matvecs only (weights of 32 layers + head)");
    println!(
        "{:<6} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "dtype", "MB", "us", "GB/s", "of copy", "tok/s", "ceiling"
    );
    for (dtype, mb, us) in tokens {
        let gbs = mb * 1e6 / (us * 1e-6) / 1e9;
        println!(
            "{:<6} {mb:>8.0} {us:>9.0} {gbs:>8.0} {:>7.1}% {:>9.1} {:>9.1}",
            dtype.name(),
            100.0 * gbs / copy,
            1e6 / us,
            copy * 1e3 / mb
        );
    }
    println!();
    println!("llama-3-8B decode step of B sequences, products only (tiles: each weight read once per tile of 8 rows; mma: the rows quantized once, then tensor cores; gain over one row)");
    println!(
        "{:<6} {:>4} {:>6} {:>9} {:>11} {:>9} {:>8}",
        "dtype", "B", "kernel", "us", "us per row", "tok/s", "gain"
    );
    for dtype in BATCH_DTYPES {
        let mut one = 0.0;
        for batch in BATCH_ROWS {
            let mut kernels = vec![(Products::Tiles, "tiles")];
            if SHAPES.iter().all(|&(_, cols, _)| has_mma(dtype, cols)) && batch >= MMA_MIN_ROWS {
                kernels.push((Products::Mma, "mma"));
            }
            for (products, kernel) in kernels {
                let mut step_us = 0.0;
                let mut shapes = Vec::new();
                for (rows, cols, per_token) in SHAPES {
                    let (us, _) = product_time(dev, s, rng, dtype, rows, cols, batch, products)?;
                    step_us += per_token as f64 * us;
                    shapes.push(format!("{rows}x{cols} {us:.1}"));
                }
                if batch == 1 {
                    one = step_us;
                }
                println!(
                    "{:<6} {batch:>4} {kernel:>6} {step_us:>9.0} {:>11.1} {:>9.0} {:>7.1}x   us per launch: {}",
                    dtype.name(),
                    step_us / batch as f64,
                    batch as f64 * 1e6 / step_us,
                    one * batch as f64 / step_us,
                    shapes.join(", ")
                );
            }
        }
    }
    println!();
    mma_launches(dev, s, rng)
}

/// A tensor-core launch of a llama-3-8B batched decode step as the engine makes it.
struct MmaLaunch {
    name: &'static str,
    /// (rows, cols) of each weight
    weights: &'static [(usize, usize)],
    epilogue: MmaEpilogue,
    per_step: usize,
}

const MMA_LAUNCHES: [MmaLaunch; 5] = [
    MmaLaunch {
        name: "qkv",
        weights: &[(4096, 4096), (1024, 4096), (1024, 4096)],
        epilogue: MmaEpilogue::Plain,
        per_step: 32,
    },
    MmaLaunch {
        name: "o",
        weights: &[(4096, 4096)],
        epilogue: MmaEpilogue::Residual,
        per_step: 32,
    },
    MmaLaunch {
        name: "gate+up",
        weights: &[(14336, 4096), (14336, 4096)],
        epilogue: MmaEpilogue::SwiGlu,
        per_step: 32,
    },
    MmaLaunch {
        name: "down",
        weights: &[(4096, 14336)],
        epilogue: MmaEpilogue::Residual,
        per_step: 32,
    },
    MmaLaunch {
        name: "head",
        weights: &[(128256, 4096)],
        epilogue: MmaEpilogue::Plain,
        per_step: 1,
    },
];
/// Activation rows of the tile table.
const MMA_TABLE_ROWS: [usize; 2] = [16, 64];

#[derive(Clone, Copy)]
enum MmaEpilogue {
    Plain,
    Residual,
    SwiGlu,
}

/// Every launch of `MMA_LAUNCHES` (q4_1) in every tile that fits it and in the one
/// `matvec_mma` picks: microseconds per launch (the rows' quantization included), and the
/// step's products in each choice, so a tile rule can be judged against the best per launch.
fn mma_launches(dev: &CudaDevice, s: &Arc<CudaStream>, rng: &mut Rng) -> Result<()> {
    let dtype = GgmlType::Q4_1;
    println!("llama-3-8B batched decode step, q4_1 tensor-core launches as the engine makes them, per tile (us per launch, the rows' quantization included)");
    let mut header = format!("{:>4} {:<8} {:>10}", "B", "launch", "picked");
    for tile in MmaTile::ALL {
        header += &format!(" {:>10}", format!("{tile:?}"));
    }
    println!("{header}");
    for batch in MMA_TABLE_ROWS {
        let (mut picked_us, mut best_us) = (0.0, 0.0);
        for MmaLaunch {
            name,
            weights: shapes,
            epilogue,
            per_step,
        } in MMA_LAUNCHES
        {
            let cols = shapes[0].1;
            let chunks = reduction_chunks(cols as u64, 32) as usize;
            let sets = rotated_weights(dev, s, rng, dtype, shapes)?;
            let copies = sets.len();
            let x = dev.upload(s, &random(rng, batch * cols, 1.0))?;
            let xq_buf = dev.alloc::<u8>(s, quantized_bytes(batch, cols))?;
            let ys: Vec<_> = shapes
                .iter()
                .map(|&(rows, _)| dev.alloc::<f32>(s, batch * rows))
                .collect::<Result<_>>()?;
            let (xs, xq) = (Span::of(&x), Span::of(&xq_buf));
            let (out, epilogue): (Vec<(u64, usize)>, Epilogue) = match epilogue {
                MmaEpilogue::Plain => (
                    ys.iter().map(|y| (Span::of(y).addr(), y.len())).collect(),
                    Epilogue::Plain,
                ),
                MmaEpilogue::Residual => {
                    let y = Span::of(&ys[0]);
                    (vec![(y.addr(), ys[0].len())], Epilogue::Residual(y.addr()))
                }
                MmaEpilogue::SwiGlu => {
                    let y = Span::of(&ys[0]);
                    (
                        vec![(y.addr(), ys[0].len()); 2],
                        Epilogue::SwiGlu { limit: None },
                    )
                }
            };
            let mut row = format!("{batch:>4} {name:<8}");
            let mut best = f64::INFINITY;
            for tile in std::iter::once(None).chain(MmaTile::ALL.map(Some)) {
                if tile.is_some_and(|t| !t.fits(chunks)) {
                    row += &format!(" {:>10}", "-");
                    continue;
                }
                let secs = time(dev, s, |i| {
                    let ws: Vec<&DeviceWeight> = sets[i % copies].iter().collect();
                    dev.quantize_rows(s, &xs, cols, &xq, None)?;
                    dev.matvec_mma(s, &ws, &xq, batch, chunks, &out, epilogue, tile)
                })
                .with_context(|| {
                    format!("timing the {name} launch over {batch} rows in {tile:?}")
                })?;
                let us = secs * 1e6;
                match tile {
                    None => picked_us += per_step as f64 * us,
                    Some(_) => best = best.min(us),
                }
                row += &format!(" {us:>10.1}");
            }
            best_us += per_step as f64 * best;
            println!("{row}");
        }
        println!(
            "{batch:>4} step: {:.0} us as picked, {:.0} us with the best tile per launch",
            picked_us, best_us
        );
    }
    println!();
    Ok(())
}

/// (weight rows, cols, reduction chunks, launches per layer) of llama-3-8B's prefill products:
/// q, k and v, o (row-parallel: the canonical chunks), gate and up, down.
const PREFILL_SHAPES: [(usize, usize, usize, usize); 5] = [
    (4096, 4096, 1, 1),
    (1024, 4096, 1, 2),
    (4096, 4096, 8, 1),
    (14336, 4096, 1, 2),
    (4096, 14336, 8, 1),
];
/// Token rows of the prefill table (a full chunk) and its dtypes.
const PREFILL_ROWS: usize = 512;
const PREFILL_DTYPES: [GgmlType; 4] = [
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
];

/// The prefill products of llama-3-8B over a 512-row chunk, each product launched alone in
/// every tile its dtype has (a row-parallel one with its chunks' tree, `gemm_tree`):
/// microseconds per launch, and the chunk's products of 32 layers in ms and TFLOP/s.
pub(super) fn prefill(dev: &CudaDevice, s: &Arc<CudaStream>, rng: &mut Rng) -> Result<()> {
    println!("llama-3-8B prefill products over {PREFILL_ROWS} token rows, each launched alone (us per launch; 32 layers)");
    for dtype in PREFILL_DTYPES {
        let tiles = GemmTile::all(dtype, dev.arch());
        // per tile: microseconds a layer, and each shape's time
        let mut layer_us = vec![0.0; tiles.len()];
        let mut shapes = vec![Vec::new(); tiles.len()];
        let mut flops = 0.0;
        for (n, k, chunks, per_layer) in PREFILL_SHAPES {
            // one weight and input per shape, timed in every tile
            let bytes = dtype
                .bytes_for((n * k) as u64)
                .expect("invariant: whole blocks") as usize;
            let mut host = random_bytes(rng, bytes);
            sanitize_halves(dtype, &mut host);
            let w = DeviceWeight::upload(dev, s, dtype, &host, n, k)?;
            let a: Vec<u16> = random(rng, PREFILL_ROWS * k, 1.0)
                .iter()
                .map(|&v| memra_gguf::f16::f32_to_f16(v))
                .collect();
            let a = dev.upload(s, &a)?;
            let parts = dev.alloc::<f32>(s, chunks * PREFILL_ROWS * n)?;
            let out = dev.alloc::<f32>(s, PREFILL_ROWS * n)?;
            let (ps, os) = (Span::of(&parts), Span::of(&out));
            flops += (per_layer * 2 * PREFILL_ROWS * n * k) as f64;
            for (i, &tile) in tiles.iter().enumerate() {
                let secs = time(dev, s, |_| {
                    dev.gemm_tree(
                        s,
                        (&w).into(),
                        &a,
                        PREFILL_ROWS,
                        chunks,
                        &ps,
                        &os,
                        Some(tile),
                    )
                })
                .with_context(|| format!("timing gemm {tile:?} {dtype} {n}x{k}"))?;
                layer_us[i] += per_layer as f64 * secs * 1e6;
                shapes[i].push(format!("{n}x{k}/{chunks} {:.1}", secs * 1e6));
            }
        }
        for (i, tile) in tiles.iter().enumerate() {
            println!(
                "{:<6} {:<14} {:>8.2} ms {:>6.0} TFLOP/s   us per launch: {}",
                dtype.name(),
                format!("{tile:?}"),
                32.0 * layer_us[i] / 1e3,
                flops / (layer_us[i] * 1e-6) / 1e12,
                shapes[i].join(", ")
            );
        }
    }
    println!();
    Ok(())
}

/// Random weights of `shapes` (rows, cols) and copies of them, as many sets as cover
/// `ROTATE_BYTES` (at least two), so that launches cycling through the sets read their weights
/// from device memory, not from L2.
fn rotated_weights(
    dev: &CudaDevice,
    s: &Arc<CudaStream>,
    rng: &mut Rng,
    dtype: GgmlType,
    shapes: &[(usize, usize)],
) -> Result<Vec<Vec<DeviceWeight>>> {
    let mut first = Vec::new();
    for &(rows, cols) in shapes {
        let bytes = dtype
            .bytes_for((rows * cols) as u64)
            .expect("invariant: whole blocks") as usize;
        let mut host = random_bytes(rng, bytes);
        sanitize_halves(dtype, &mut host);
        first.push(DeviceWeight::upload(dev, s, dtype, &host, rows, cols)?);
    }
    let bytes: usize = first.iter().map(|w| w.data.len()).sum();
    let mut sets = Vec::new();
    for _ in 1..ROTATE_BYTES.div_ceil(bytes).max(2) {
        let mut set = Vec::new();
        for w in &first {
            let mut data = dev.alloc::<u8>(s, w.data.len())?;
            dev.copy(s, &w.data, &mut data)?;
            set.push(DeviceWeight {
                dtype,
                data,
                rows: w.rows,
                cols: w.cols,
            });
        }
        sets.push(set);
    }
    sets.push(first);
    Ok(sets)
}

/// Attention of one decode row at llama-3-8B's heads (32 query heads, 8 KV heads of 128) over
/// depths of context, in each form: microseconds per call
/// and the cache bytes read per second.
pub(super) fn attention(dev: &CudaDevice, s: &Arc<CudaStream>, rng: &mut Rng) -> Result<()> {
    let (n_heads, n_kv, hd, cap) = (32, 8, 128, 32768);
    let row = n_kv * hd;
    let rope = (500000.0, RopeStyle::Normal);
    let mut kv = DeviceKv::new(dev, s, n_kv, hd, cap, 1)?;
    // the cache's values do not change its speed: a random block of rows written over and over
    let block = 4096;
    let (k, v) = (
        dev.upload(s, &random(rng, block * row, 2.0))?,
        dev.upload(s, &random(rng, block * row, 1.0))?,
    );
    for start in (0..cap).step_by(block) {
        let at = dev.upload(s, &[start as u32])?;
        dev.kv_store_rows(s, &k, &v, &mut kv, &at, None, rope)?;
    }
    let mut q = dev.upload(s, &random(rng, n_heads * hd, 1.0))?;
    let (k1, v1) = (
        dev.upload(s, &random(rng, row, 2.0))?,
        dev.upload(s, &random(rng, row, 1.0))?,
    );
    let parts = dev.alloc::<f32>(s, attention_parts_len(1, n_heads, hd, cap))?;
    let mut out = dev.alloc::<f32>(s, n_heads * hd)?;
    println!("\nattention of one decode row, llama-3-8B heads ({n_heads} q, {n_kv} kv, {hd} dims), cache of {cap}: us per call (GB/s of cache read)");
    let forms = [AttentionForm::Walk, AttentionForm::Split];
    println!("{:>6} {:>18} {:>18}", "depth", "walk", "split");
    for depth in [512usize, 4096, 16384, 32767] {
        let pd = dev.upload(s, &[depth as u32])?;
        let mut cells = Vec::new();
        for form in forms {
            let secs = time(dev, s, |_| {
                attend(
                    (dev, s),
                    &mut q,
                    (&k1, &v1),
                    &mut kv,
                    &pd,
                    rope,
                    &parts,
                    &mut out,
                    Some(form),
                )
            })?;
            let bytes = 2.0 * 2.0 * (depth + 1) as f64 * row as f64;
            cells.push(format!("{:.1} ({:.0})", secs * 1e6, bytes / secs / 1e9));
        }
        println!("{depth:>6} {:>18} {:>18}", cells[0], cells[1]);
    }
    Ok(())
}

/// Median seconds per launch of `launch` over `TRIALS` batches of `BATCH`, after a warm-up.
fn time(
    dev: &CudaDevice,
    s: &Arc<CudaStream>,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let (start, end) = (dev.new_event(true)?, dev.new_event(true)?);
    for i in 0..BATCH {
        launch(i)?;
    }
    let mut trials = Vec::new();
    for _ in 0..TRIALS {
        start.record(s)?;
        for i in 0..BATCH {
            launch(i)?;
        }
        end.record(s)?;
        end.synchronize()?;
        trials.push(f64::from(start.elapsed_ms(&end)?) / 1e3 / BATCH as f64);
    }
    trials.sort_by(f64::total_cmp);
    Ok(trials[TRIALS / 2])
}

/// Random bytes (any bit pattern: speed does not depend on the values, and quantizing 8B-size
/// matrices on the host would take longer than the whole benchmark).
fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(n);
    v
}

/// The kernels a batched product runs on.
#[derive(Clone, Copy)]
enum Products {
    /// The matvec over tiles of rows (one row: the decode matvec).
    Tiles,
    /// The rows quantized once, then the tensor-core kernel.
    Mma,
}

/// Microseconds per launch of a `rows` x `cols` product over `batch` activation rows, and the
/// weight bytes read per second (GB/s).
#[allow(clippy::too_many_arguments)]
fn product_time(
    dev: &CudaDevice,
    s: &Arc<CudaStream>,
    rng: &mut Rng,
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    batch: usize,
    products: Products,
) -> Result<(f64, f64)> {
    let sets = rotated_weights(dev, s, rng, dtype, &[(rows, cols)])?;
    let (copies, bytes) = (sets.len(), sets[0][0].data.len());
    let x = dev.upload(s, &random(rng, batch * cols, 1.0))?;
    let mut y = dev.alloc::<f32>(s, batch * rows)?;
    let xq_buf = dev.alloc::<u8>(s, quantized_bytes(batch, cols))?;
    let (xs, xq) = (Span::of(&x), Span::of(&xq_buf));
    let out = [(Span::of(&y).addr(), y.len())];
    let secs = time(dev, s, |i| match products {
        Products::Tiles => dev.matvec(s, &sets[i % copies][0], &x, 8, &mut y),
        Products::Mma => {
            dev.quantize_rows(s, &xs, cols, &xq, None)?;
            dev.matvec_mma(
                s,
                &[&sets[i % copies][0]],
                &xq,
                batch,
                8,
                &out,
                Epilogue::Plain,
                None,
            )
        }
    })
    .with_context(|| format!("timing matvec_{dtype} {rows}x{cols} over {batch} rows"))?;
    Ok((secs * 1e6, bytes as f64 / secs / 1e9))
}

/// Keeps random weights finite: clears the exponent's top bit of every f16/bf16/f32 value and
/// every block scale, so no NaN or infinity enters the arithmetic (which would not change
/// the speed, but makes any accidental output check meaningless).
fn sanitize_halves(dtype: GgmlType, bytes: &mut [u8]) {
    let (block, offsets): (usize, &[usize]) = match dtype {
        GgmlType::F32 => (4, &[2]),
        GgmlType::F16 | GgmlType::BF16 => (2, &[0]),
        GgmlType::Q8_0 | GgmlType::Q4_0 => (dtype.block_bytes(), &[0]),
        GgmlType::Q4_1 | GgmlType::Q4_K => (dtype.block_bytes(), &[0, 2]),
        GgmlType::Q6_K => (dtype.block_bytes(), &[208]),
        other => unreachable!("invariant: {other} is not benchmarked"),
    };
    for b in bytes.chunks_exact_mut(block) {
        for &o in offsets {
            b[o + 1] &= 0xbf;
        }
    }
}
