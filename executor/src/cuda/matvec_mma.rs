//! The products of a batched decode step on tensor cores (kernels/matvec_mma.cu), for weights
//! of 4-bit 32-value blocks (q4_0, q4_1): the step's activation rows are quantized to 8 bits
//! once (`quantize_rows`, the one-row matvec's own quantization), then an integer mma gives
//! every block's exact dot for 16 weight rows x 8 activation rows at once, and the float
//! steps after it follow the one-row kernel's lanes, butterfly and chunk tree, so every row
//! keeps the bits of `CudaDevice::matvec` on it alone. Other dtypes, and steps of fewer rows
//! than `MMA_MIN_ROWS`, run the matvec tiles (`matvec.rs`).

use anyhow::{Context, Result};
use cudarc::driver::{CudaStream, DeviceRepr, DeviceSlice, LaunchConfig};
use memra_gguf::GgmlType;

use super::device::{CudaDevice, PLAIN_DYNAMIC_SHARED};
use super::matvec::{matvec_act_bytes, Epilogue, MAX_CHUNKS};
use super::ops::{int, ptr, DeviceWeight};
use super::span::Span;

/// Most weights one launch takes (MMA_MAX_SEGS in kernels/matvec_mma.cu).
const MMA_MAX_SEGS: usize = 3;
/// Weight rows and activation rows of one warp's mma tile.
const MMA_WEIGHT_ROWS: usize = 16;
const MMA_ACT_ROWS: usize = 8;
/// Threads of a block (the kernels' `__launch_bounds__`).
const MMA_THREADS: u32 = 256;
/// Most activation tiles of one block, and the shared memory their chunk values may take.
const MMA_MAX_TILES: usize = 8;
const MMA_MAX_SHARED: usize = 64 << 10;
/// Shared bytes of one piece's chunk values (MMA_PIECE_VALUES floats).
const MMA_PIECE_BYTES: usize = 128 * 4;
/// Threads of quantize_rows_q8 (MATVEC_THREADS in kernels/matvec.cu).
const QUANTIZE_THREADS: u32 = 512;

/// Activation rows from which a batched step's products run on tensor cores.
pub const MMA_MIN_ROWS: usize = 2;

/// Whether the tensor-core products take weights of `dtype`.
pub fn has_mma(dtype: GgmlType) -> bool {
    matches!(dtype, GgmlType::Q4_0 | GgmlType::Q4_1)
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
    tiles: i32,
}

// SAFETY: a plain C struct of integers and device addresses, laid out as the kernel reads it
unsafe impl DeviceRepr for MmaJob {}

impl CudaDevice {
    /// The 8-bit copy of the `x.len() / cols` rows of `x` into `out` (`quantized_bytes`).
    pub fn quantize_rows(
        &self,
        stream: &CudaStream,
        x: &Span<f32>,
        cols: usize,
        out: &Span<u8>,
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
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (QUANTIZE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, op, n) = (x.addr(), out.addr(), int(cols));
        self.launch(stream, "quantize_rows_q8", cfg, |a| {
            a.arg(&xp).arg(&n).arg(&op);
        })
    }

    /// `ys[i] = ws[i] x` for the `batch` rows of `xq` (`quantize_rows` of x), with
    /// `epilogue` as `matvec_job` applies it; every row's bits are `matvec`'s on it alone.
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
    ) -> Result<()> {
        let w0 = ws[0];
        assert!(
            (1..=MMA_MAX_SEGS).contains(&ws.len())
                && ys.len() == ws.len()
                && ws
                    .iter()
                    .all(|w| w.dtype == w0.dtype && w.cols == w0.cols && has_mma(w.dtype)),
            "matvec_mma: 1 to {MMA_MAX_SEGS} q4_0 or q4_1 weights of one dtype and K, one output each"
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
            tiles: 0,
        };
        for (i, (w, &(y, _))) in ws.iter().zip(ys).enumerate() {
            job.w[i] = ptr(stream, &w.data);
            job.y[i] = y;
            job.rows[i] = int(w.rows);
        }
        let items: usize = if swiglu {
            w0.rows.div_ceil(MMA_WEIGHT_ROWS)
        } else {
            ws.iter().map(|w| w.rows.div_ceil(MMA_WEIGHT_ROWS)).sum()
        };
        // a block's pieces (weight, tile, chunk) leave their chunk values in shared memory
        let halves = if swiglu { 2 } else { 1 };
        let per_tile = halves * chunks * MMA_PIECE_BYTES;
        let tiles = batch
            .div_ceil(MMA_ACT_ROWS)
            .min(MMA_MAX_TILES)
            .min(MMA_MAX_SHARED / per_tile)
            .max(1);
        job.tiles = int(tiles);
        let smem = tiles * per_tile;
        let cfg = LaunchConfig {
            grid_dim: (items as u32, batch.div_ceil(tiles * MMA_ACT_ROWS) as u32, 1),
            block_dim: (MMA_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let name = format!("matvec_mma_{}", w0.dtype.name());
        if smem > PLAIN_DYNAMIC_SHARED {
            self.allow_dynamic_shared(&name, 0, smem)
                .with_context(|| format!("{name} with {chunks} chunks"))?;
        }
        self.launch(stream, &name, cfg, |a| {
            a.arg(&job);
        })
    }
}
