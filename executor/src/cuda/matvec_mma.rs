//! The products of a batched decode step on tensor cores (kernels/matvec_mma.cu), for weights
//! of 4-bit 32-value blocks (q4_0, q4_1): the step's activation rows are quantized to 8 bits
//! once (`quantize_rows`, the one-row matvec's own quantization), then an integer mma gives
//! every block's exact dot for 16 weight rows x 8 activation rows at once, and the float
//! steps after it follow the one-row kernel's lanes, butterfly and chunk tree, so every row
//! keeps the bits of `CudaDevice::matvec` on it alone. A launch's tile (`Tile`) depends on
//! the rows and on how many tiles the weights make: each block stages its blocks of weight
//! and activation rows in shared memory and its warps may split K into parts of whole
//! chunks; chunks of at most 16 blocks take the kernels' single form. Other dtypes, and
//! steps of fewer rows than `MMA_MIN_ROWS`, run the matvec tiles (`matvec.rs`).

use anyhow::{Context, Result};
use cudarc::driver::{CudaStream, DeviceRepr, DeviceSlice, LaunchConfig};
use memra_gguf::GgmlType;

use super::device::{CudaDevice, PLAIN_DYNAMIC_SHARED};
use super::matvec::{matvec_act_bytes, Epilogue, Norm, MAX_CHUNKS};
use super::span::Span;
use super::weights::{int, ptr, DeviceWeight};

/// Most weights one launch takes (MMA_MAX_SEGS in kernels/matvec_mma.cu).
const MMA_MAX_SEGS: usize = 3;
/// Threads of a block (MMA_THREADS in kernels/matvec_mma.cu).
const MMA_THREADS: usize = 256;
/// Steps in flight (STAGES of the kernel variants).
const STAGES: usize = 4;

/// A block's tile of a launch (the kernel variants at the end of kernels/matvec_mma.cu): weight
/// rows x activation rows, activation tiles of 8 rows per warp and parts of K (a warp's
/// chunks).
struct Tile {
    kernel: &'static str,
    weight_rows: usize,
    act_rows: usize,
    warp_tiles: usize,
    parts: usize,
}

impl Tile {
    /// Shared bytes of a launch over `chunks` chunks (`StageLayout` in the kernels): the
    /// steps' buffers, then per output and thread the chunk stack's log2(chunks / parts)
    /// levels and the part's value.
    fn shared_bytes(&self, chunks: usize) -> usize {
        let k = self.parts;
        let stage =
            self.weight_rows * (k * 64 + 16 + k * 16) + self.act_rows * (k * 128 + 16 + k * 32);
        let levels = (chunks / k).trailing_zeros() as usize + 1;
        STAGES * stage + levels * self.warp_tiles * 4 * MMA_THREADS * 4
    }
}

/// The tiles a launch may take, in `MmaTile` order.
const TILES: [Tile; 4] = [
    Tile {
        kernel: "matvec_mma",
        weight_rows: 64,
        act_rows: 32,
        warp_tiles: 2,
        parts: 1,
    },
    Tile {
        kernel: "matvec_mma_k2",
        weight_rows: 32,
        act_rows: 32,
        warp_tiles: 2,
        parts: 2,
    },
    Tile {
        kernel: "matvec_mma16",
        weight_rows: 32,
        act_rows: 16,
        warp_tiles: 2,
        parts: 4,
    },
    Tile {
        kernel: "matvec_mma8",
        weight_rows: 32,
        act_rows: 8,
        warp_tiles: 1,
        parts: 4,
    },
];

/// A launch's tile: 64 weight rows x 32 activation rows; 32 x 32 with K in 2 parts; 32 x 16
/// and 32 x 8 with K in 4 parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaTile {
    Wide,
    WideSplit,
    Rows16,
    Rows8,
}

impl MmaTile {
    pub const ALL: [MmaTile; 4] = [
        MmaTile::Wide,
        MmaTile::WideSplit,
        MmaTile::Rows16,
        MmaTile::Rows8,
    ];

    fn tile(self) -> &'static Tile {
        &TILES[self as usize]
    }

    /// Whether a launch of `chunks` chunks can take this tile (its parts are whole chunks).
    pub fn fits(self, chunks: usize) -> bool {
        chunks >= self.tile().parts
    }
}

/// Threads of quantize_rows_q8 (MATVEC_THREADS in kernels/matvec.cu).
const QUANTIZE_THREADS: u32 = 512;

/// 32-value blocks of a row one quantize_rows_q8 block takes (QUANTIZE_SLICE in
/// kernels/matvec.cu).
const QUANTIZE_SLICE: usize = 64;

/// Activation rows from which a batched step's products run on tensor cores.
pub const MMA_MIN_ROWS: usize = 2;

/// Whether the tensor-core products take weights of `dtype` with `cols` columns: 4-bit
/// blocks, an even number of them per row (so every row of quants, activation quants and
/// q4_0 scales starts on the alignment of the kernel's copies).
pub fn has_mma(dtype: GgmlType, cols: usize) -> bool {
    matches!(dtype, GgmlType::Q4_0 | GgmlType::Q4_1) && cols.is_multiple_of(64)
}

/// Bytes of the 8-bit copy of `rows` activation rows of `cols` values: per row the quants,
/// then a (d, d * sum) pair of f32 per 32 values, as a matvec block's copy of one row.
pub fn quantized_bytes(rows: usize, cols: usize) -> usize {
    rows * matvec_act_bytes(GgmlType::Q4_1, cols)
}

/// The kernel parameter (`MmaJob` in kernels/matvec_mma.cu, C layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct MmaJob {
    w: [u64; MMA_MAX_SEGS],
    y: [u64; MMA_MAX_SEGS],
    rows: [i32; MMA_MAX_SEGS],
    segs: i32,
    cols: i32,
    chunks: i32,
    swiglu: i32,
    limit: f32,
    xq: u64,
    residual: u64,
    batch: i32,
}

// SAFETY: a plain C struct of integers and device addresses, laid out as the kernel reads it
unsafe impl DeviceRepr for MmaJob {}

impl CudaDevice {
    /// The 8-bit copy of the `x.len() / cols` rows of `x` into `out` (`quantized_bytes`); with
    /// `norm`, of the rows `rms_norm` makes with it, which are also left in its span, in the
    /// same launch.
    pub fn quantize_rows(
        &self,
        stream: &CudaStream,
        x: &Span<f32>,
        cols: usize,
        out: &Span<u8>,
        norm: Option<(Norm, &Span<f32>)>,
    ) -> Result<()> {
        let rows = x.len() / cols;
        assert!(
            cols.is_multiple_of(32) && rows * cols == x.len(),
            "quantize_rows: {} values are not whole rows of {cols} (a multiple of 32)",
            x.len()
        );
        assert!(
            out.len() >= quantized_bytes(rows, cols),
            "quantize_rows: {} bytes for {rows} rows of {cols}",
            out.len()
        );
        assert!(
            norm.as_ref()
                .is_none_or(|(n, xn)| n.weight.len() == cols && xn.len() == x.len()),
            "quantize_rows: the norm's weight must hold a row and its output the rows"
        );
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, (cols / 32).div_ceil(QUANTIZE_SLICE) as u32, 1),
            block_dim: (QUANTIZE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, op, n) = (x.addr(), out.addr(), int(cols));
        let (np, eps, xnp) = match &norm {
            Some((norm, xn)) => (ptr(stream, norm.weight), norm.eps, xn.addr()),
            None => (0, 0.0, 0),
        };
        self.launch(stream, "quantize_rows_q8", cfg, |a| {
            a.arg(&xp).arg(&n).arg(&op).arg(&np).arg(&eps).arg(&xnp);
        })
    }

    /// `ys[i] = ws[i] x` for the `batch` rows of `xq` (`quantize_rows` of x), with
    /// `epilogue` as `matvec_job` applies it; every row's bits are `matvec`'s on it alone,
    /// whatever the tile (`tile`, or the one that suits the launch where None).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matvec_mma(
        &self,
        stream: &CudaStream,
        ws: &[&DeviceWeight],
        xq: &Span<u8>,
        batch: usize,
        chunks: usize,
        ys: &[(u64, usize)],
        epilogue: Epilogue,
        tile: Option<MmaTile>,
    ) -> Result<()> {
        let w0 = ws[0];
        assert!(
            (1..=MMA_MAX_SEGS).contains(&ws.len())
                && ys.len() == ws.len()
                && ws
                    .iter()
                    .all(|w| w.dtype == w0.dtype && w.cols == w0.cols && has_mma(w.dtype, w.cols)),
            "matvec_mma: 1 to {MMA_MAX_SEGS} q4_0 or q4_1 weights of one dtype and K (a multiple of 64), one output each"
        );
        assert!(
            chunks.is_power_of_two() && chunks <= MAX_CHUNKS && w0.cols.is_multiple_of(chunks * 32),
            "matvec_mma: {} columns do not split into {chunks} chunks of whole blocks",
            w0.cols
        );
        assert!(
            xq.len() >= quantized_bytes(batch, w0.cols),
            "matvec_mma: the quantized rows hold {} bytes for {batch} rows of {}",
            xq.len(),
            w0.cols
        );
        let swiglu = matches!(epilogue, Epilogue::SwiGlu { .. });
        assert!(
            !swiglu || (ws.len() == 2 && ws[1].rows == w0.rows),
            "matvec_mma: SwiGLU takes gate and up weights of equal rows"
        );
        for (w, &(_, len)) in ws.iter().zip(ys) {
            let rows = if swiglu { w0.rows } else { w.rows };
            assert_eq!(
                len,
                batch * rows,
                "matvec_mma: y has {len} values for {batch} x {rows} rows"
            );
        }
        let mut job = MmaJob {
            w: [0; MMA_MAX_SEGS],
            y: [0; MMA_MAX_SEGS],
            rows: [0; MMA_MAX_SEGS],
            segs: int(ws.len()),
            cols: int(w0.cols),
            chunks: int(chunks),
            swiglu: i32::from(swiglu),
            limit: match epilogue {
                Epilogue::SwiGlu { limit } => limit.unwrap_or(0.0),
                _ => 0.0,
            },
            xq: xq.addr(),
            residual: match epilogue {
                Epilogue::Residual(r) => r,
                _ => 0,
            },
            batch: int(batch),
        };
        for (i, (w, &(y, _))) in ws.iter().zip(ys).enumerate() {
            job.w[i] = ptr(stream, &w.data);
            job.y[i] = y;
            job.rows[i] = int(w.rows);
        }
        let items = |tile: &Tile| -> usize {
            if swiglu {
                w0.rows.div_ceil(tile.weight_rows / 2)
            } else {
                ws.iter().map(|w| w.rows.div_ceil(tile.weight_rows)).sum()
            }
        };
        // the batch's tiles, from the fewest weight reads to the most blocks (where chunks are
        // too few for its tiles, the wide ones): the first that gives every SM two blocks (one
        // that leaves SMs idle runs at nearly the speed of a full one), else the last
        let choice = tile.unwrap_or_else(|| {
            let small: &[MmaTile] = match batch {
                0..=8 => &[MmaTile::Rows8],
                9..=16 => &[MmaTile::Rows16, MmaTile::Rows8],
                _ => &[],
            };
            let tiles = if small.iter().any(|t| t.fits(chunks)) {
                small
            } else {
                &[MmaTile::Wide, MmaTile::WideSplit]
            };
            let fitting = || tiles.iter().copied().filter(|t| t.fits(chunks));
            let fills = |t: &MmaTile| {
                batch.div_ceil(t.tile().act_rows) * items(t.tile()) >= 2 * self.sm_count()
            };
            fitting()
                .find(fills)
                .or_else(|| fitting().next_back())
                .expect("invariant: the wide tile fits any chunks")
        });
        assert!(
            choice.fits(chunks),
            "matvec_mma: the {choice:?} tile splits K into more parts than {chunks} chunks"
        );
        let tile = choice.tile();
        let smem = tile.shared_bytes(chunks);
        let cfg = LaunchConfig {
            grid_dim: (batch.div_ceil(tile.act_rows) as u32, items(tile) as u32, 1),
            block_dim: (MMA_THREADS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // the single form where chunks have at most 16 blocks (a step per group)
        let single = if w0.cols / chunks <= 16 * 32 {
            "_single"
        } else {
            ""
        };
        let name = format!("{}{single}_{}", tile.kernel, w0.dtype.name());
        if smem > PLAIN_DYNAMIC_SHARED {
            self.allow_dynamic_shared(&name, 0, smem)
                .with_context(|| format!("{name} over {batch} rows"))?;
        }
        self.launch(stream, &name, cfg, |a| {
            a.arg(&job);
        })
    }
}
