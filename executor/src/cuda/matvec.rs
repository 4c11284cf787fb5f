//! The matrix-vector products of decode (kernels/matvec.cu): the launch helpers of every form
//! (plain, several weights in one launch, residual, SwiGLU, the experts of an MoE layer), and
//! the one job every form becomes. Every form but the norm and the experts also takes several
//! activation rows at once (x holding whole rows: a batched decode step's sequences), each row
//! with the bits of a launch for it alone. The numerics contract (chunked K, a fixed tree) is
//! the kernel file's; this side checks shapes and picks the kernel and the grid.

use anyhow::{ensure, Context, Result};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, LaunchConfig};
use memra_gguf::GgmlType;

use super::device::{CudaDevice, DeviceBuffer, PLAIN_DYNAMIC_SHARED};
use super::moe::{RouteParams, MAX_EXPERTS};
use super::span::Span;
use super::weights::{int, ptr, ptr_mut, DeviceWeight};

/// Rows per matvec work item and threads per block; must match MATVEC_ROWS and
/// MATVEC_THREADS in kernels/matvec.cu.
const MATVEC_ROWS: usize = 4;
const MATVEC_THREADS: usize = 512;
/// Activation rows of one block of a batched launch (MATVEC_TILE in kernels/matvec.cu).
pub const MATVEC_TILE: usize = 8;

/// The two kernels of each dtype: one activation row, or tiles of `MATVEC_TILE` rows (f32 has a
/// third for few rows, `matvec_thin_f32`, which `matvec_job` picks before these).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    One,
    Tiles,
}

impl Kernel {
    fn of(batch: usize) -> Kernel {
        if batch == 1 {
            Kernel::One
        } else {
            Kernel::Tiles
        }
    }

    /// The kernel for `dtype` with K chunks of `len` values: one row of a 32-value block type
    /// whose chunks have at most 8 or 4 pieces of 16 quant bytes takes the kernel whose lanes
    /// work in groups of 8 or 4 (kernels/matvec.cu), with the same bits.
    fn name(self, dtype: GgmlType, len: usize) -> String {
        let pieces = match dtype {
            GgmlType::Q8_0 => 2 * len / 32,
            GgmlType::Q4_0 | GgmlType::Q4_1 => len / 32,
            _ => usize::MAX,
        };
        match self {
            Kernel::One if pieces <= 4 => format!("matvec_l4_{}", dtype.name()),
            Kernel::One if pieces <= 8 => format!("matvec_l8_{}", dtype.name()),
            Kernel::One => format!("matvec_{}", dtype.name()),
            Kernel::Tiles => format!("matvec_rows8_{}", dtype.name()),
        }
    }

    /// Blocks per SM (the kernel's `__launch_bounds__` minimum).
    fn blocks_per_sm(self) -> usize {
        match self {
            Kernel::One => 2,
            Kernel::Tiles => 1,
        }
    }

    /// Shared memory a block holds statically: the chunk values of two rounds
    /// (kernels/matvec.cu: 16 KiB for one row, 32 KiB for a tile) and block_rms_scale's
    /// partial sums (kernels/common.cuh), rounded up.
    fn static_shared(self) -> usize {
        match self {
            Kernel::One => (16 << 10) + 128,
            Kernel::Tiles => (32 << 10) + 128,
        }
    }

    /// Activation rows one block takes.
    fn rows(self) -> usize {
        match self {
            Kernel::One => 1,
            Kernel::Tiles => MATVEC_TILE,
        }
    }
}

/// The few-rows f32 kernel (`matvec_thin_f32` in kernels/matvec.cu): warps per block (one
/// (row, chunk) piece each), and the most rows a launch gives it; above that the persistent
/// grid of the generic kernel fills the SMs.
const THIN_WARPS: usize = 8;
const THIN_MAX_ROWS: usize = 1024;

/// Most weights one matvec launch takes (MATVEC_MAX_SEGS in kernels/matvec.cu).
pub const MATVEC_MAX_SEGS: usize = 3;

/// What a matvec launch does with each row's value.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Epilogue {
    /// Store it.
    Plain,
    /// Store residual + value (the address of the residual).
    Residual(u64),
    /// Two weights (gate, up): store silu(gate) * up, both clamped first with a limit
    /// (glm5-next's `silu_mul_clamped`).
    SwiGlu { limit: Option<f32> },
    /// Store it (a router's logits), then pick the top-k experts from them: in the same launch
    /// where the product takes the thin kernel (`moe_router_f32`), else in a launch after it.
    Pick(Pick),
}

/// The top-k a router's launch picks after its logits (kernels/route.cuh).
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Pick {
    pub route: RouteParams,
    /// The launch's count of finished blocks: one zeroed `i32`, zero again after each launch.
    pub done: u64,
    pub ids: u64,
    pub weights: u64,
}

/// An RMS norm a matvec launch applies to x first (`x / sqrt(mean(x^2) + eps) * weight`, the
/// bits of `rms_norm`): every block normalizes x into its shared memory, so the normalized
/// vector never goes through device memory and the norm costs no launch of its own.
#[derive(Clone, Copy)]
pub struct Norm<'a> {
    /// The norm's weight, one value per column.
    pub weight: &'a DeviceBuffer<f32>,
    /// The epsilon under the square root.
    pub eps: f32,
}

/// The kernel parameter of a matvec launch (`MatvecJob` in kernels/matvec.cu, C layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct MatvecJob {
    w: [u64; MATVEC_MAX_SEGS],
    y: [u64; MATVEC_MAX_SEGS],
    rows: [i32; MATVEC_MAX_SEGS],
    segs: i32,
    cols: i32,
    chunks: i32,
    swiglu: i32,
    limit: f32,
    x: u64,
    residual: u64,
    norm: u64,
    eps: f32,
    xn_offset: i32,
    experts: u64,
    expert_order: u64,
    expert_weights: u64,
    expert_bytes: i64,
    expert_first: i32,
    expert_count: i32,
    x_stride: i32,
    y_stride: i32,
    token_rows: i32,
    x_row_stride: i32,
    batch: i32,
}

/// Expert mode of a matvec launch (kernels/matvec.cu): one grid row per selected expert, the
/// weights being stacks of `count` matrices `stride` bytes apart whose first is expert
/// `first`; ids (and, for a weighted launch, weights) are read from device memory. Over
/// several token rows (a batched decode step) slot `s * token_rows + t` is the `s`-th pick of
/// token row `t`, whose ids and weights are at `t * (slots / token_rows) + s` (as the router
/// writes them); the grid's rows take the slots in that order, or the picks in `order`.
#[derive(Clone, Copy)]
pub(super) struct ExpertSel {
    /// Device address of the selected expert ids (`slots` i32 values).
    pub ids: u64,
    /// Device address of their weights (`slots` f32 values), or 0: rows are not weighted and
    /// experts held elsewhere leave their rows unwritten.
    pub weights: u64,
    /// Device address of the picks in the order the grid's rows take them (`moe_order`), or 0.
    pub order: u64,
    /// Selected experts (the grid's rows), of every token row.
    pub slots: usize,
    /// The first expert the stacks hold, and how many.
    pub first: usize,
    pub count: usize,
    /// Bytes from one expert's matrix to the next.
    pub stride: usize,
    /// Values from one slot's x to the next (0: all read the same x), and from one y to the next.
    pub x_stride: usize,
    pub y_stride: usize,
    /// Token rows the slots are picked for, and values from one token row's x to the next.
    pub token_rows: usize,
    pub x_row_stride: usize,
}

// SAFETY: a plain C struct of integers and device addresses, laid out as the kernel reads it
unsafe impl DeviceRepr for MatvecJob {}
/// Most rows of a launch's grid (CUDA's limit on its y).
pub(super) const MAX_GRID_Y: usize = 65535;
/// Largest chunk count the matvec tree (one lane per chunk) and tree_sum support.
pub const MAX_CHUNKS: usize = 32;
/// Shared bytes of a matvec block's 8-bit copy of x: K quants plus, per 32 values, the scale
/// and scaled sum (q8_0, q4_0, q4_1) or, per 256 values, the scale (q4_k, q6_k); float weights
/// read x itself.
pub(super) fn matvec_act_bytes(dtype: GgmlType, cols: usize) -> usize {
    match dtype {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => cols + cols / 32 * 8,
        GgmlType::Q4_K | GgmlType::Q6_K => cols + cols / 256 * 4,
        _ => 0,
    }
}

impl CudaDevice {
    /// `y = W x` with K reduced in `chunks` chunks combined in a balanced tree (the numerics
    /// contract of kernels/matvec.cu, identical in structure to the CPU backend's). Quantized
    /// weights multiply x quantized to 8 bits per block exactly as the CPU backend does it.
    ///
    /// `x` may hold several rows of `w.cols` values, `y` then as many rows of `w.rows`: each
    /// row's bits are those of a launch for that row alone.
    ///
    /// Panics unless `x` has whole rows of `w.cols` values, `y` the same number of `w.rows`,
    /// `chunks` is a power of two of at most `MAX_CHUNKS` and each chunk is a whole number of
    /// blocks; `x` must be 16-byte aligned (buffer starts are).
    pub fn matvec(
        &self,
        stream: &CudaStream,
        w: &DeviceWeight,
        x: &impl DevicePtr<f32>,
        chunks: usize,
        y: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let out = (ptr_mut(stream, y), y.len());
        self.matvec_job(stream, &[w], x, None, chunks, &[out], Epilogue::Plain, None)
    }

    /// `y[i] = W[i] x` for up to `MATVEC_MAX_SEGS` weights of one dtype and K in one launch
    /// (q, k and v), x normalized first when `norm` is given: each row's bits are those of
    /// `rms_norm` then `matvec` with its weight alone.
    pub fn matvec_many(
        &self,
        stream: &CudaStream,
        ws: &[&DeviceWeight],
        x: &impl DevicePtr<f32>,
        norm: Option<Norm>,
        chunks: usize,
        ys: &[Span<f32>],
    ) -> Result<()> {
        let outs: Vec<(u64, usize)> = ys.iter().map(|y| (y.addr(), y.len())).collect();
        self.matvec_job(stream, ws, x, norm, chunks, &outs, Epilogue::Plain, None)
    }

    /// A router's logits `y = W (rms_norm(x) * norm)`, then `pick`'s top-k of them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matvec_picking(
        &self,
        stream: &CudaStream,
        w: &DeviceWeight,
        x: &Span<f32>,
        norm: Norm,
        chunks: usize,
        y: &Span<f32>,
        pick: Pick,
    ) -> Result<()> {
        let out = (y.addr(), y.len());
        self.matvec_job(
            stream,
            &[w],
            x,
            Some(norm),
            chunks,
            &[out],
            Epilogue::Pick(pick),
            None,
        )
    }

    /// `y = residual + W x` in one launch (`y` may be `residual`), row by row: the add after
    /// a row-parallel matvec, with the bits of `matvec` followed by `add`.
    pub fn matvec_residual(
        &self,
        stream: &CudaStream,
        w: &DeviceWeight,
        x: &impl DevicePtr<f32>,
        chunks: usize,
        residual: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        assert_eq!(
            residual.len(),
            y.len(),
            "matvec: residual has {} values for {} outputs",
            residual.len(),
            y.len()
        );
        let r = ptr(stream, residual);
        let out = (ptr_mut(stream, y), y.len());
        self.matvec_job(
            stream,
            &[w],
            x,
            None,
            chunks,
            &[out],
            Epilogue::Residual(r),
            None,
        )
    }

    /// `y = silu(gate x) * (up x)` in one launch (x normalized first when `norm` is given; one
    /// row then), row by row, with the bits of the two matvecs followed by the CPU backend's
    /// `silu_mul` expression (`silu_mul_clamped` with `limit`).
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_swiglu(
        &self,
        stream: &CudaStream,
        gate: &DeviceWeight,
        up: &DeviceWeight,
        x: &impl DevicePtr<f32>,
        norm: Option<Norm>,
        chunks: usize,
        limit: Option<f32>,
        y: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        assert_eq!(gate.rows, up.rows, "matvec: gate and up rows differ");
        let out = (ptr_mut(stream, y), y.len());
        self.matvec_job(
            stream,
            &[gate, up],
            x,
            norm,
            chunks,
            &[out, out],
            Epilogue::SwiGlu { limit },
            None,
        )
    }

    /// The selected experts' products (`sel`): with two weights (gate and up stacks),
    /// `y[slot] = silu(gate_e x) * (up_e x)`; with one (down), `y[slot] = (W_e x[slot]) *
    /// weight[slot]`, `-0.0` where this rank does not hold expert `e`; `limit` clamps a gate
    /// and up launch as `matvec_swiglu` does. `x` and `y` hold
    /// `sel.slots` vectors `sel.x_stride` / `sel.y_stride` apart; `norm` folds
    /// `rms_norm(x) * norm` into the launch. Each row's bits are those of `matvec` with expert
    /// `e`'s matrix alone (then the CPU's `silu_mul` or scale).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matvec_experts(
        &self,
        stream: &CudaStream,
        ws: &[&DeviceWeight],
        x: &Span<f32>,
        norm: Option<Norm>,
        chunks: usize,
        y: &Span<f32>,
        limit: Option<f32>,
        sel: ExpertSel,
    ) -> Result<()> {
        let w0 = ws[0];
        assert!(
            x.len()
                >= (sel.slots - 1) * sel.x_stride
                    + (sel.token_rows - 1) * sel.x_row_stride
                    + w0.cols
                && y.len() >= (sel.slots - 1) * sel.y_stride + w0.rows,
            "matvec_experts: x or y too short for {} slots",
            sel.slots
        );
        let (epilogue, outs) = if ws.len() == 2 {
            (Epilogue::SwiGlu { limit }, vec![(y.addr(), w0.rows); 2])
        } else {
            (Epilogue::Plain, vec![(y.addr(), w0.rows)])
        };
        let x = x.sub(0, w0.cols);
        self.matvec_job(stream, ws, &x, norm, chunks, &outs, epilogue, Some(sel))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn matvec_job(
        &self,
        stream: &CudaStream,
        ws: &[&DeviceWeight],
        x: &impl DevicePtr<f32>,
        norm: Option<Norm>,
        chunks: usize,
        ys: &[(u64, usize)],
        epilogue: Epilogue,
        sel: Option<ExpertSel>,
    ) -> Result<()> {
        assert!(
            (1..=MATVEC_MAX_SEGS).contains(&ws.len()) && ys.len() == ws.len(),
            "matvec: 1 to {MATVEC_MAX_SEGS} weights, one output each"
        );
        let w0 = ws[0];
        assert!(
            ws.iter().all(|w| w.dtype == w0.dtype && w.cols == w0.cols),
            "matvec: fused weights must share dtype and columns"
        );
        let batch = x.len() / w0.cols;
        assert!(
            batch > 0 && x.len() == batch * w0.cols,
            "matvec: x has {} values, not whole rows of {} columns",
            x.len(),
            w0.cols
        );
        assert!(
            batch == 1 || (norm.is_none() && sel.is_none()),
            "matvec: a norm or experts take one row of x"
        );
        for (w, &(_, len)) in ws.iter().zip(ys) {
            let rows = if matches!(epilogue, Epilogue::SwiGlu { .. }) {
                w0.rows
            } else {
                w.rows
            };
            assert_eq!(
                len,
                batch * rows,
                "matvec: y has {len} values for {batch} x {rows} rows"
            );
        }
        let kernel = Kernel::of(batch);
        assert!(
            chunks.is_power_of_two() && chunks <= MAX_CHUNKS,
            "matvec: chunks must be a power of two up to {MAX_CHUNKS}, got {chunks}"
        );
        assert!(
            w0.cols.is_multiple_of(chunks * w0.dtype.block_size()),
            "matvec: {} columns do not split into {chunks} chunks of whole {} blocks",
            w0.cols,
            w0.dtype
        );
        let xp = ptr(stream, x);
        if let Some(n) = &norm {
            assert_eq!(
                n.weight.len(),
                w0.cols,
                "matvec: the norm has {} values for {} columns",
                n.weight.len(),
                w0.cols
            );
        }
        // the normalized x sits after the 8-bit copy of x, 16-byte aligned; a tile's rows
        // have their copies one after another, each 16-byte aligned
        let act = matvec_act_bytes(w0.dtype, w0.cols).next_multiple_of(16);
        let xn_offset = act;
        let smem = if norm.is_some() {
            xn_offset + w0.cols * 4
        } else {
            act * kernel.rows()
        };
        let mut job = MatvecJob {
            w: [0; MATVEC_MAX_SEGS],
            y: [0; MATVEC_MAX_SEGS],
            rows: [0; MATVEC_MAX_SEGS],
            segs: int(ws.len()),
            cols: int(w0.cols),
            chunks: int(chunks),
            swiglu: i32::from(matches!(epilogue, Epilogue::SwiGlu { .. })),
            limit: match epilogue {
                Epilogue::SwiGlu { limit } => limit.unwrap_or(0.0),
                _ => 0.0,
            },
            x: xp,
            residual: match epilogue {
                Epilogue::Residual(r) => r,
                _ => 0,
            },
            norm: norm.map_or(0, |n| ptr(stream, n.weight)),
            eps: norm.map_or(0.0, |n| n.eps),
            xn_offset: int(xn_offset),
            experts: sel.map_or(0, |e| e.ids),
            expert_order: sel.map_or(0, |e| e.order),
            expert_weights: sel.map_or(0, |e| e.weights),
            expert_bytes: sel.map_or(0, |e| e.stride as i64),
            expert_first: sel.map_or(0, |e| int(e.first)),
            expert_count: sel.map_or(0, |e| int(e.count)),
            x_stride: sel.map_or(0, |e| int(e.x_stride)),
            y_stride: sel.map_or(0, |e| int(e.y_stride)),
            token_rows: sel.map_or(1, |e| int(e.token_rows)),
            x_row_stride: sel.map_or(0, |e| int(e.x_row_stride)),
            batch: int(batch),
        };
        if let Some(e) = sel {
            assert!(
                e.stride.is_multiple_of(16) && e.slots > 0,
                "matvec: expert matrices must be 16-byte aligned, one slot at least"
            );
            assert!(
                e.token_rows > 0 && e.slots.is_multiple_of(e.token_rows),
                "matvec: {} expert slots are not whole picks of {} token rows",
                e.slots,
                e.token_rows
            );
            // the slots are the grid's y
            ensure!(
                e.slots <= MAX_GRID_Y,
                "matvec: {} expert slots in one launch; a grid takes up to {MAX_GRID_Y} (fewer token rows a step: a smaller runtime.prefill_chunk)",
                e.slots
            );
        }
        for (i, (w, &(y, _))) in ws.iter().zip(ys).enumerate() {
            job.w[i] = ptr(stream, &w.data);
            job.y[i] = y;
            job.rows[i] = int(w.rows);
            assert!(
                job.w[i].is_multiple_of(16),
                "matvec: w must be 16-byte aligned"
            );
        }
        assert!(xp.is_multiple_of(16), "matvec: x must be 16-byte aligned");
        let rows: usize = ws.iter().map(|w| w.rows).sum();
        if w0.dtype == GgmlType::F32
            && batch == 1
            && sel.is_none()
            && matches!(epilogue, Epilogue::Plain | Epilogue::Pick(_))
            && chunks <= THIN_WARPS
            && rows <= THIN_MAX_ROWS
        {
            return self.matvec_thin(stream, &job, rows, chunks, epilogue);
        }
        let name = kernel.name(w0.dtype, w0.cols / chunks);
        if smem + kernel.static_shared() > PLAIN_DYNAMIC_SHARED {
            self.allow_dynamic_shared(&name, kernel.static_shared(), smem)
                .with_context(|| format!("{name} with K = {}", w0.cols))?;
        }
        let items: usize = match epilogue {
            Epilogue::SwiGlu { .. } => w0.rows.div_ceil(MATVEC_ROWS),
            _ => ws.iter().map(|w| w.rows.div_ceil(MATVEC_ROWS)).sum(),
        };
        // expert mode: the persistent grid's blocks are shared among the slots' rows; a
        // batched launch has one block per tile of each run
        let slots = sel.map_or(1, |e| e.slots);
        let tiles = batch.div_ceil(kernel.rows());
        let resident = kernel.blocks_per_sm() * self.sm_count();
        let runs = match kernel {
            Kernel::One => items.min(resident.div_ceil(slots)),
            // whole runs of tiles in one wave: a block more than the SMs hold would double
            // the launch's time
            Kernel::Tiles => items.min((resident / tiles).max(1)),
        };
        // kernels/matvec.cu splits the items among the runs in 32-bit arithmetic
        ensure!(
            (items as u64) * (runs as u64 + 1) < 1 << 32,
            "{name}: {items} work items are too many for one launch"
        );
        let cfg = LaunchConfig {
            grid_dim: ((runs * tiles) as u32, slots as u32, 1),
            block_dim: (MATVEC_THREADS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        self.launch(stream, &name, cfg, |a| {
            a.arg(&job);
        })?;
        match epilogue {
            Epilogue::Pick(p) => self.pick(stream, job.y[0], 1, &p),
            _ => Ok(()),
        }
    }

    /// A plain one-row f32 job of at most `THIN_MAX_ROWS` rows on `matvec_thin_f32` (with a
    /// pick: `moe_router_f32`), each row with the bits of the generic kernel's.
    fn matvec_thin(
        &self,
        stream: &CudaStream,
        job: &MatvecJob,
        rows: usize,
        chunks: usize,
        epilogue: Epilogue,
    ) -> Result<()> {
        let per_block = THIN_WARPS / chunks;
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(per_block) as u32, 1, 1),
            block_dim: ((THIN_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        match epilogue {
            Epilogue::Pick(p) => {
                assert!(
                    rows == p.route.n as usize && rows <= MAX_EXPERTS,
                    "moe_router: {rows} logits for {} experts",
                    p.route.n
                );
                self.launch(stream, "moe_router_f32", cfg, |a| {
                    a.arg(job)
                        .arg(&p.route)
                        .arg(&p.done)
                        .arg(&p.ids)
                        .arg(&p.weights);
                })
            }
            _ => self.launch(stream, "matvec_thin_f32", cfg, |a| {
                a.arg(job);
            }),
        }
    }
}
