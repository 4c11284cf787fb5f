//! Synthetic weights (`memra-run --weights synthetic`, like vLLM's dummy load format): every
//! shard a rank's plan lists is filled with seeded pseudo-random values of the shard's dtype
//! and shape, read from the plan alone, so a plan compiled from a `config.json` runs at full
//! size without a model file.
//!
//! Architecture Invariant: the stored bytes of a tensor are a function of (seed, tensor name,
//! position) whatever the sharding, and a shard draws only what it holds, so a shard's bytes
//! are the matching slice of the whole tensor's and every plan of a model runs on the 1-rank
//! plan's bytes. Two definitions, both counter-based on the tensor's stream `key` (a hash of
//! the seed and the name), so any part is drawn without drawing what comes before it:
//!
//! - f32, f16 and bf16 matrices, and every vector: element `i` (its row-major index in the
//!   plan's logical shape) is `center + half * uniform(key, i)` (SplitMix64 at counter `i`),
//!   stored in the dtype.
//! - Quantized matrices (q8_0, q4_0, q4_1, q4_k, q6_k): block `b` (its index in the whole
//!   tensor's row-major blocks; every split keeps blocks whole) is drawn field by field from
//!   the words `word(key, b * words..)` (wyrand at those counters), no quantizer: the quants
//!   are random bits, the sub-block scale codes (and the signs of q4_0's `d` and q6_k's
//!   scales) come from the words, and the f16 fields (`d`, `dmin`, `m`, their magnitudes)
//!   are computed from the tensor's spread alone, the same in every block, so the bytes are
//!   the same on any machine. The
//!   dequantized values lie within center ± half, centered, with a standard deviation within
//!   a few percent of uniform's half/sqrt(3) (each format's formula is on its `Blocks`
//!   method). `d` stays a normal f16 where the spread allows (small spreads take smaller
//!   integer codes instead); only q4_1 and q4_k can carry a center (today only vectors have
//!   one, and vectors are never quantized blocks).
//!
//! Scales follow `memra_gguf::synth` (`gguf/src/synth/plan.rs`): a matrix is uniform with
//! standard deviation 1/sqrt(its row length), divided by sqrt(2 * layers) for projections that
//! write into the residual stream; norms lie in [0.9, 1.1), KDA's `ssm_a` (`-exp(A_log)`) in
//! [-1.0, -0.2), mHC scales in [0.5, 1.5), mHC bases in [-1, 1), other vectors (biases) in
//! [-0.1, 0.1). Vectors are handed to the backends as f32 values, as the file loader hands
//! them after dequantizing.
//!
//! Speed (`tests::drawing_speed`, release, both cores of the 2-core dev machine, MiB/s of
//! stored bytes): q8_0 4300, q4_0 4500, q4_1 5000, q4_k 6200 (a 16-expert stack 6500), q6_k
//! 5900, where quantizing hashed f32 values drew 298, 182, 150, 113 (115) and 197. Half the
//! gain is the words and the quantizer skipped, half the huge pages (`advise_huge_pages`).

mod blocks;
#[cfg(test)]
mod kernel_check;

use anyhow::{bail, Context, Result};
use memra_compiler::model::fnv1a;
use memra_compiler::plan::{Split, WeightShard};
use memra_gguf::{quantize, GgmlType};

use crate::weights::{stack_matrices, whole_blocks, Matrix, Shard, Stack};
use blocks::Blocks;

/// The seed every synthetic load uses: the values are a function of the tensor name alone.
pub const SEED: u64 = 0x6d65_6d72_6100_0001;

/// How the values of one tensor are spread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Spread {
    center: f32,
    half: f32,
}

/// The spread of tensor `name` of logical `shape` in a model of `layers` layers.
fn spread(name: &str, shape: &[u64], layers: u32) -> Spread {
    let around = |center, half| Spread { center, half };
    if shape.len() == 1 {
        return match name {
            n if n.ends_with(".ssm_a") => around(-0.6, 0.4),
            n if n.ends_with("_scale.weight") => around(1.0, 0.5),
            n if n.ends_with("_base.weight") => around(0.0, 1.0),
            n if n.ends_with("norm.weight") => around(1.0, 0.1),
            _ => around(0.0, 0.1),
        };
    }
    let row = *shape.last().expect("invariant: matrices have a row length") as f32;
    let writes_residual = name.contains(".attn_output.") || name.contains(".ffn_down");
    let res = match writes_residual {
        true => (2.0 * layers as f32).sqrt(),
        false => 1.0,
    };
    around(0.0, 3f32.sqrt() / row.sqrt() / res)
}

/// SplitMix64 at counter `index` of stream `key`: any word is drawn without drawing the ones
/// before it. Plain values (f32, f16, bf16, vectors) take their bits from it.
pub(super) fn hash(key: u64, index: u64) -> u64 {
    let mut z = key.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [-1, 1) on a grid of 2^-23: the top 24 bits of `hash(key, index)`.
pub(crate) fn uniform(key: u64, index: u64) -> f32 {
    (hash(key, index) >> 40) as f32 * (1.0 / 8_388_608.0) - 1.0
}

/// One tensor's stream: element `i` of a plain one is `center + half * uniform(key, i)`, block
/// `b` of a quantized one `Blocks::draw(key, b)`.
struct Tensor {
    key: u64,
    spread: Spread,
}

impl Tensor {
    fn new(name: &str, shape: &[u64], layers: u32) -> Tensor {
        Tensor {
            key: fnv1a(name.as_bytes(), SEED),
            spread: spread(name, shape, layers),
        }
    }

    /// Elements `start..end` of the flattened tensor.
    fn values(&self, start: u64, end: u64) -> Vec<f32> {
        let Spread { center, half } = self.spread;
        (start..end)
            .map(|i| center + half * uniform(self.key, i))
            .collect()
    }

    /// `part` of a tensor of plain values (f32, f16, bf16), converted. Large shards are drawn
    /// by several threads, each over its own rows: every row's bytes depend on the row alone,
    /// so the threads change nothing but the time.
    fn plain_rows(&self, dtype: GgmlType, part: Part) -> Result<Vec<u8>> {
        let width = part.cols.end - part.cols.start;
        draw_rows(dtype, width, part.rows, |r, chunk| {
            let first = r * part.row_len + part.cols.start;
            quantize(dtype, &self.values(first, first + width), chunk)
        })
    }

    /// The blocks of `part` of a tensor of a quantized `dtype` (its columns keep blocks
    /// whole), in `count` matrices of `rows / count` rows (a stack's experts), not drawn yet.
    fn blocks(&self, dtype: GgmlType, part: Part, count: u64) -> Result<DrawnBlocks> {
        let block = dtype.block_size() as u64;
        Ok(DrawnBlocks {
            key: self.key,
            blocks: Blocks::new(dtype, self.spread)?,
            count,
            rows: (part.rows.end - part.rows.start) / count,
            col_blocks: (part.cols.end - part.cols.start) / block,
            row_blocks: part.row_len / block,
            first_row: part.rows.start,
            first_col_block: part.cols.start / block,
        })
    }
}

/// Columns `cols` of rows `rows` of a `[.., row_len]` tensor: the part of it a shard holds.
struct Part {
    row_len: u64,
    rows: std::ops::Range<u64>,
    cols: std::ops::Range<u64>,
}

/// Draws rows `rows` of `width` values of `dtype` with `draw(row, its bytes)`, by several
/// threads where the shard is large, into a fresh buffer.
fn draw_rows(
    dtype: GgmlType,
    width: u64,
    rows: std::ops::Range<u64>,
    draw: impl Fn(u64, &mut [u8]) -> Result<()> + Sync,
) -> Result<Vec<u8>> {
    let row_bytes = dtype
        .bytes_for(width)
        .expect("invariant: splits keep blocks whole") as usize;
    let count = (rows.end - rows.start) as usize;
    let mut out = vec![0u8; row_bytes * count];
    advise_huge_pages(&mut out);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(count * width as usize / THREAD_ELEMENTS).max(1);
    let per_thread = count.div_ceil(threads).max(1);
    let draw = &draw;
    std::thread::scope(|scope| {
        let parts: Vec<_> = (rows.start..)
            .step_by(per_thread)
            .zip(out.chunks_mut(per_thread * row_bytes))
            .map(|(first_row, part)| {
                scope.spawn(move || {
                    (first_row..)
                        .zip(part.chunks_exact_mut(row_bytes))
                        .try_for_each(|(r, chunk)| draw(r, chunk))
                })
            })
            .collect();
        parts.into_iter().try_for_each(|part| {
            part.join()
                .expect("invariant: drawing and quantizing values does not panic")
        })
    })?;
    Ok(out)
}

/// The blocks of a quantized shard, described but not drawn yet: the cuda backend draws them
/// on its device (kernels/synth.cu writes the same bytes from `kernel_fields`), any other
/// taker here (`bytes`). Matrix `e` of `count` holds the whole tensor's rows `first_row + e *
/// rows ..` (a stack's experts are consecutive rows of it) and its column blocks
/// `first_col_block ..`.
#[derive(Clone, Debug)]
pub struct DrawnBlocks {
    key: u64,
    blocks: Blocks,
    /// Matrices held (a stack's experts or heads; 1 for a matrix).
    pub count: u64,
    /// Rows of each matrix, and blocks of each row held.
    pub rows: u64,
    pub col_blocks: u64,
    /// Blocks per row of the whole tensor.
    pub row_blocks: u64,
    /// The whole tensor's row of matrix 0's first row, and the first column block held.
    pub first_row: u64,
    pub first_col_block: u64,
}

/// What kernels/synth.cu draws a tensor's blocks with (`SynthJob`'s per-tensor fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFields {
    pub key: u64,
    /// The f16 super-scale, and the second f16 field (q4_1's m, q4_k's dmin; else 0).
    pub d: u16,
    pub m: u16,
    /// The sub-block scale codes' top and span (q8_0: the largest quant).
    pub top: u8,
    pub span: u8,
}

impl DrawnBlocks {
    /// The stored type.
    pub fn dtype(&self) -> GgmlType {
        self.blocks.dtype
    }

    /// Values per row held.
    pub fn cols(&self) -> u64 {
        self.col_blocks * self.dtype().block_size() as u64
    }

    /// Stored bytes of one matrix.
    pub fn matrix_bytes(&self) -> usize {
        (self.rows * self.col_blocks) as usize * self.dtype().block_bytes()
    }

    /// The per-tensor fields the device kernel draws with.
    pub fn kernel_fields(&self) -> KernelFields {
        let b = &self.blocks;
        KernelFields {
            key: self.key,
            d: b.d,
            m: b.m,
            top: b.top,
            span: b.span,
        }
    }

    /// The blocks drawn here: the matrices back to back, each row's blocks in order.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        let dtype = self.dtype();
        let (blocks, key, first_col) = (self.blocks, self.key, self.first_col_block);
        let row_blocks = self.row_blocks;
        let rows = self.first_row..self.first_row + self.count * self.rows;
        draw_rows(dtype, self.cols(), rows, |r, chunk| {
            let out = chunk.chunks_exact_mut(dtype.block_bytes());
            for (b, out) in (r * row_blocks + first_col..).zip(out) {
                blocks.draw(key, b, out);
            }
            Ok(())
        })
    }
}

/// Asks Linux to back `buf` with transparent huge pages (2 MiB) where it covers whole ones. A
/// fresh shard is faulted in as it is drawn, and with 4 KiB pages the faults cost about as
/// much as drawing quantized blocks (huge pages doubled the speed on the dev machine, whose
/// THP mode is `madvise`). Advice only: where huge pages are off nothing changes.
#[cfg(target_os = "linux")]
fn advise_huge_pages(buf: &mut [u8]) {
    const HUGE: usize = 2 << 20;
    let base = buf.as_mut_ptr() as usize;
    let (start, end) = (
        base.next_multiple_of(HUGE),
        (base + buf.len()) / HUGE * HUGE,
    );
    if start < end {
        // SAFETY: start..end lies within `buf`, borrowed mutably here; MADV_HUGEPAGE changes
        // how its pages are backed, never their contents, and a refusal changes nothing.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: &mut [u8]) {}

/// Elements a thread draws at least: smaller shards are drawn by fewer threads.
const THREAD_ELEMENTS: usize = 1 << 20;

/// A shard's bytes as `shard` draws them, or its quantized blocks left to the device.
enum Held {
    Bytes(Vec<u8>),
    Blocks(DrawnBlocks),
}

/// Where a quantized shard's blocks are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlocksDrawn {
    /// Here, as the shard is taken out of the file-less load.
    OnHost,
    /// Later, by the backend on its device (`Shard::Drawn*`).
    OnDevice,
}

/// The shard `shard` of a model of `layers` layers: vectors and plain matrices drawn, quantized
/// matrices and stacks drawn too or, `OnDevice`, described for the backend to draw.
pub(crate) fn shard(shard: &WeightShard, layers: u32, drawn: BlocksDrawn) -> Result<Shard> {
    let Some(dtype) = GgmlType::from_name(&shard.dtype) else {
        bail!(
            "the plan names dtype `{}`, which memra does not know",
            shard.dtype
        );
    };
    dtype.check_supported()?;
    let shape = &shard.shape;
    let tensor = Tensor::new(&shard.tensor, shape, layers);
    let plain = matches!(dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let drawing = || format!("drawing `{}`", shard.tensor);
    // `part` in `count` matrices: drawn, or quantized blocks left to the device
    let hold = |part, count| -> Result<Held> {
        if plain {
            return tensor.plain_rows(dtype, part).map(Held::Bytes);
        }
        let blocks = tensor.blocks(dtype, part, count)?;
        match drawn {
            BlocksDrawn::OnDevice => Ok(Held::Blocks(blocks)),
            BlocksDrawn::OnHost => blocks.bytes().map(Held::Bytes),
        }
    };
    match (shape.as_slice(), shard.split) {
        (&[len], Split::Full) => Ok(Shard::Vector(tensor.values(0, len))),
        (&[len], Split::Rows { start, end }) if start <= end && end <= len => {
            Ok(Shard::Vector(tensor.values(start, end)))
        }
        (&[rows, cols], split) => {
            let (rows_held, cols_held) = match split {
                Split::Full => (0..rows, 0..cols),
                Split::Rows { start, end } if start <= end && end <= rows => {
                    (start..end, 0..cols)
                }
                Split::Cols { start, end } if whole_blocks(dtype, start, end, cols) => {
                    (0..rows, start..end)
                }
                other => bail!("split `{other}` does not apply to a {rows}x{cols} {dtype} matrix"),
            };
            let (held_rows, held_cols) = (
                rows_held.end - rows_held.start,
                cols_held.end - cols_held.start,
            );
            let part = Part {
                row_len: cols,
                rows: rows_held,
                cols: cols_held,
            };
            Ok(match hold(part, 1).with_context(drawing)? {
                Held::Blocks(blocks) => Shard::DrawnMatrix(blocks),
                Held::Bytes(data) => Shard::Matrix(Matrix {
                    dtype,
                    data,
                    rows: held_rows as usize,
                    cols: held_cols as usize,
                }),
            })
        }
        (&[count, rows, cols], split) => {
            let (first, end) = stack_matrices(split, count)?;
            let part = Part {
                row_len: cols,
                rows: first * rows..end * rows,
                cols: 0..cols,
            };
            Ok(match hold(part, end - first).with_context(drawing)? {
                Held::Blocks(blocks) => Shard::DrawnStack(blocks),
                Held::Bytes(data) => Shard::Stack(Stack {
                    dtype,
                    data,
                    first: first as usize,
                    count: (end - first) as usize,
                    rows: rows as usize,
                    cols: cols as usize,
                }),
            })
        }
        (_, split) => bail!(
            "split `{split}` of a tensor of shape {shape:?}: only vectors, matrices and stacks of matrices are supported"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_gguf::f16::f16_to_f32;
    use memra_gguf::layout::{q4_0, q4_1, q4_k, q6_k, q8_0};

    /// The shard drawn on the host.
    fn host(s: &WeightShard, layers: u32) -> Result<Shard> {
        shard(s, layers, BlocksDrawn::OnHost)
    }

    fn shard_of(tensor: &str, dtype: &str, shape: &[u64], split: Split) -> WeightShard {
        WeightShard {
            tensor: tensor.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
            split,
            bytes: 0,
        }
    }

    fn matrix(s: &WeightShard) -> Matrix {
        match host(s, 4).unwrap() {
            Shard::Matrix(m) => m,
            _ => panic!("a matrix"),
        }
    }

    #[test]
    fn a_split_holds_the_whole_tensors_bytes() {
        for dtype in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"] {
            let name = "blk.1.ffn_down.weight";
            let full = matrix(&shard_of(name, dtype, &[6, 512], Split::Full));
            let rows = matrix(&shard_of(
                name,
                dtype,
                &[6, 512],
                Split::Rows { start: 2, end: 5 },
            ));
            assert_eq!(rows.data, full.rows_bytes(2, 5), "{dtype} rows");
            let cols = matrix(&shard_of(
                name,
                dtype,
                &[6, 512],
                Split::Cols {
                    start: 256,
                    end: 512,
                },
            ));
            let half = full.row_bytes() / 2;
            let want: Vec<u8> = full
                .data
                .chunks_exact(full.row_bytes())
                .flat_map(|row| row[half..].to_vec())
                .collect();
            assert_eq!(cols.data, want, "{dtype} cols");
        }
    }

    const QUANTIZED: [&str; 5] = ["q8_0", "q4_0", "q4_1", "q4_k", "q6_k"];

    #[test]
    fn every_supported_quantized_dtype_is_drawn() {
        let drawn: Vec<&str> = QUANTIZED.to_vec();
        let supported: Vec<&str> = memra_gguf::SUPPORTED
            .iter()
            .filter(|t| t.block_size() > 1)
            .map(|t| t.name())
            .collect();
        assert_eq!(drawn, supported);
    }

    #[test]
    fn threads_draw_the_bytes_one_thread_draws() {
        // 4M elements: drawn whole by every core; 32-row shards (64K elements) by one thread
        let (rows, cols) = (2048, 2048);
        let name = "blk.0.attn_q.weight";
        for dtype in QUANTIZED {
            let whole = matrix(&shard_of(name, dtype, &[rows, cols], Split::Full));
            for start in (0..rows).step_by(32) {
                let end = start + 32;
                let part = matrix(&shard_of(
                    name,
                    dtype,
                    &[rows, cols],
                    Split::Rows { start, end },
                ));
                assert_eq!(
                    part.data,
                    whole.rows_bytes(start as usize, end as usize),
                    "{dtype} rows {start}..{end}"
                );
            }
        }
    }

    #[test]
    fn an_expert_split_holds_the_whole_stacks_matrices() {
        for dtype in QUANTIZED {
            let stack = |split| match host(
                &shard_of("blk.1.ffn_up_exps.weight", dtype, &[4, 3, 256], split),
                4,
            )
            .unwrap()
            {
                Shard::Stack(s) => s,
                _ => panic!("a stack"),
            };
            let full = stack(Split::Full);
            let part = stack(Split::Experts { start: 2, end: 4 });
            assert_eq!(part.matrix(3), full.matrix(3), "{dtype}");
            assert_eq!(part.matrix(2), full.matrix(2), "{dtype}");
            assert_eq!(part.matrix(1), None, "{dtype}");
        }
    }

    /// Matrices of the spreads the tests check: a wide one (codes at their nominal top) and
    /// two narrow ones, residual writers of a deep model (small codes keep `d` normal).
    const SPREADS: [(&str, u32); 3] = [
        ("blk.0.attn_q.weight", 4),
        ("blk.0.ffn_down.weight", 4),
        ("blk.0.ffn_down.weight", 45),
    ];

    #[test]
    fn quantized_blocks_dequantize_to_the_spread() {
        // Uniform on center +- half has standard deviation half / sqrt(3); the drawn levels
        // are discrete and the sub-block scales vary a little: every format is held to 4% of
        // it and its mean to 1% of half from the center (measured: within 1.2% and 0.5%).
        let shape = [32u64, 4096];
        for dtype in QUANTIZED {
            for (name, layers) in SPREADS {
                let Spread { center, half } = spread(name, &shape, layers);
                let m = match host(&shard_of(name, dtype, &shape, Split::Full), layers).unwrap() {
                    Shard::Matrix(m) => m,
                    _ => panic!("a matrix"),
                };
                let mut values = vec![0f32; m.rows * m.cols];
                memra_gguf::dequantize(m.dtype, &m.data, &mut values).unwrap();
                let n = values.len() as f64;
                let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
                let var = values
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>()
                    / n;
                let (center, half) = (f64::from(center), f64::from(half));
                let at = format!("{dtype} {name} ({layers} layers, half {half:.3e})");
                let worst = values
                    .iter()
                    .map(|&v| (f64::from(v) - center).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst <= half * 1.002,
                    "{at}: a value {worst:.3e} off center"
                );
                assert!(
                    (mean - center).abs() <= 0.01 * half,
                    "{at}: mean {mean:.3e}"
                );
                let ratio = var.sqrt() / (half / 3f64.sqrt());
                assert!(
                    (ratio - 1.0).abs() <= 0.04,
                    "{at}: std {ratio:.4} of half/sqrt(3)"
                );
            }
        }
    }

    #[test]
    fn f16_scale_fields_are_finite_and_normal() {
        let fields = |dtype: &str| -> &[usize] {
            match dtype {
                "q8_0" => &[q8_0::D],
                "q4_0" => &[q4_0::D],
                "q4_1" => &[q4_1::D, q4_1::M],
                "q4_k" => &[q4_k::D, q4_k::DMIN],
                _ => &[q6_k::D],
            }
        };
        let shape = [4u64, 4096];
        for dtype in QUANTIZED {
            for (name, layers) in SPREADS {
                let m = match host(&shard_of(name, dtype, &shape, Split::Full), layers).unwrap() {
                    Shard::Matrix(m) => m,
                    _ => panic!("a matrix"),
                };
                for block in m.data.chunks_exact(m.dtype.block_bytes()) {
                    for &at in fields(dtype) {
                        let h = u16::from_le_bytes([block[at], block[at + 1]]);
                        assert!(
                            f16_to_f32(h).is_normal(),
                            "{dtype} {name} ({layers} layers): field at {at} is {h:#06x}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_center_is_carried_by_a_minimum_or_refused() {
        let spread = Spread {
            center: 0.5,
            half: 0.25,
        };
        for dtype in [GgmlType::Q4_1, GgmlType::Q4_K] {
            let blocks = Blocks::new(dtype, spread).unwrap();
            let mut bytes = vec![0u8; 4 * dtype.block_bytes()];
            for (b, out) in bytes.chunks_exact_mut(dtype.block_bytes()).enumerate() {
                blocks.draw(7, b as u64, out);
            }
            let mut values = vec![0f32; 4 * dtype.block_size()];
            memra_gguf::dequantize(dtype, &bytes, &mut values).unwrap();
            assert!(values.iter().all(|v| (v - 0.5).abs() <= 0.2505), "{dtype}");
            let mean = values.iter().sum::<f32>() / values.len() as f32;
            assert!((mean - 0.5).abs() < 0.02, "{dtype}: mean {mean}");
        }
        let err = Blocks::new(GgmlType::Q8_0, spread).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a q8_0 matrix cannot carry values centered on 0.5: only q4_1 and q4_k blocks have a minimum"
        );
    }

    #[test]
    fn values_are_spread_by_name_and_differ_between_tensors() {
        let vector = |name: &str| match host(&shard_of(name, "f32", &[64], Split::Full), 4).unwrap()
        {
            Shard::Vector(v) => v,
            _ => panic!("a vector"),
        };
        let norm = vector("blk.0.attn_norm.weight");
        assert!(norm.iter().all(|x| (0.9..1.1).contains(x)), "{norm:?}");
        assert!(vector("blk.0.ssm_a")
            .iter()
            .all(|x| (-1.0..-0.2).contains(x)));
        assert_ne!(vector("blk.0.ffn_norm.weight"), norm);
        let part = match host(
            &shard_of(
                "blk.0.attn_norm.weight",
                "f32",
                &[64],
                Split::Rows { start: 8, end: 24 },
            ),
            4,
        )
        .unwrap()
        {
            Shard::Vector(v) => v,
            _ => panic!("a vector"),
        };
        assert_eq!(part, norm[8..24]);
        let wide = matrix(&shard_of(
            "blk.0.attn_q.weight",
            "f32",
            &[2, 256],
            Split::Full,
        ));
        let bound = 3f32.sqrt() / 16.0;
        let values: Vec<f32> = wide
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert!(values.iter().all(|x| x.abs() <= bound));
        assert!(values.iter().any(|x| x.abs() > bound / 2.0));
    }

    /// The drawing speed, in MiB/s of stored bytes, of a 4096x14336 matrix of every quantized
    /// dtype and a q4_k stack of 16 experts of 2048x6144, by every core, the best of 3 draws
    /// (allocation included). A timing, not a check:
    /// `cargo test --release -p memra-executor synthetic::tests::drawing_speed -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "a timing, not a check"]
    fn drawing_speed() {
        let cases: &[(&str, &[u64])] = &[
            ("q8_0", &[4096, 14336]),
            ("q4_0", &[4096, 14336]),
            ("q4_1", &[4096, 14336]),
            ("q4_k", &[4096, 14336]),
            ("q6_k", &[4096, 14336]),
            ("q4_k", &[16, 2048, 6144]),
        ];
        for &(dtype, shape) in cases {
            let tensor = shard_of("blk.0.ffn_up_exps.weight", dtype, shape, Split::Full);
            let (mut bytes, mut seconds) = (0, f64::INFINITY);
            for _ in 0..3 {
                let start = std::time::Instant::now();
                bytes = match host(&tensor, 4).unwrap() {
                    Shard::Matrix(m) => m.data.len(),
                    Shard::Stack(s) => s.data.len(),
                    _ => panic!("a drawn matrix or stack"),
                };
                seconds = seconds.min(start.elapsed().as_secs_f64());
            }
            let mib = bytes as f64 / (1 << 20) as f64;
            eprintln!(
                "{dtype} {shape:?}: {mib:.1} MiB in {seconds:.3} s, {:.0} MiB/s",
                mib / seconds
            );
        }
    }

    #[test]
    fn a_split_that_cuts_a_block_is_refused() {
        let err = host(
            &shard_of(
                "blk.0.attn_output.weight",
                "q8_0",
                &[4, 64],
                Split::Cols { start: 16, end: 64 },
            ),
            4,
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            "split `cols 16..64` does not apply to a 4x64 q8_0 matrix"
        );
    }
}
