//! Launch helpers of the kernels over a prefill step's token rows: the tensor-core product of
//! f16 activation rows with a weight in any dtype, per reduction chunk, and the small row
//! kernels around it (kernels/gemm.cu: narrowing to f16, the SiLU gate, bias rows, the rows'
//! positions); the cache write of every row before attention reads them
//! (kernels/attention.cu); causal attention of the rows on the tensor cores
//! (kernels/flash.cu).

use anyhow::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, LaunchConfig};
use memra_gguf::GgmlType;

use super::device::CudaDevice;
use super::matvec::MAX_CHUNKS;
use super::ops::{DeviceKv, RopeStyle};
use super::span::Span;
use super::weights::{grid, int, ptr, ptr_mut, DeviceWeight};

/// Weight rows of one block's tile in the mma.sync and dequantizing warpgroup kernels (GEMM_BN
/// in kernels/gemm.cu).
const TILE_COLS: usize = 128;
/// Reduction depth of one step (GEMM_BK): a chunk is a whole number of steps.
pub const GEMM_DEPTH: usize = 64;
/// Most weights one launch takes (GEMM_MAX_WEIGHTS).
const GEMM_MAX_WEIGHTS: usize = 3;

/// The kernel parameter of a GEMM launch (`GemmJob` in kernels/gemm.cu, C layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct GemmJob {
    w: [u64; GEMM_MAX_WEIGHTS],
    y: [u64; GEMM_MAX_WEIGHTS],
    n: [i32; GEMM_MAX_WEIGHTS],
    count: i32,
    spans: u64,
    w_stride: u64,
    row_tiles: i32,
}

// SAFETY: plain old data in the kernel's C layout
unsafe impl DeviceRepr for GemmJob {}
/// Steps in flight (GEMM_STAGES) and the f16 tile row stride in halves (GEMM_LD).
const GEMM_STAGES: usize = 3;
const GEMM_LD: usize = 72;
/// The warpgroup kernels' token rows a tile (WG_BM), line bytes (WG_LINE) and steps in
/// flight (WG_STAGES), as kernels/gemm.cu defines them.
const WG_ROWS: usize = 128;
const WG_LINE: usize = 128;
const WG_STAGES: usize = 4;
/// Threads of a `gemm_tma` block (TMA_THREADS: a producer warpgroup and two product ones).
const TMA_THREADS: u32 = 384;

/// A `gemm_tma` tile's stages (TMA_STAGES in kernels/gemm.cu): 192 KiB of them either way;
/// `gemm_tma128_tree_f16`'s (TMA_TREE_STAGES), beside its subtrees of two and four chunks.
fn tma_stages(cols: usize, tree: bool) -> usize {
    match (cols, tree) {
        (_, true) => 3,
        (256, false) => 4,
        _ => 6,
    }
}
/// Most chunks `gemm_tma128_tree_f16` keeps the tree of on chip.
const TMA_TREE_CHUNKS: usize = 8;

/// The kernel parameter of a `gemm_tma` launch (`TmaMaps`): the tensor maps of the
/// activations and of each weight.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TmaMaps {
    a: [u64; 16],
    w: [[u64; 16]; GEMM_MAX_WEIGHTS],
}

// SAFETY: plain old data in the kernel's C layout (CUtensorMap is 16 opaque 64-bit words)
unsafe impl DeviceRepr for TmaMaps {}

/// The tensor map of a row-major f16 matrix of `rows` x `cols` at device address `addr`,
/// read in boxes of `box_rows` rows x 64 values (one 128-byte line a row) with the 128-byte
/// swizzle the warpgroup operand descriptors name; rows past the end read as zeros.
fn f16_tensor_map(addr: u64, rows: usize, cols: usize, box_rows: usize) -> Result<[u64; 16]> {
    use cudarc::driver::sys::{
        cuTensorMapEncodeTiled, CUresult, CUtensorMap, CUtensorMapDataType,
        CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
    };
    let dims = [cols as u64, rows as u64];
    let strides = [2 * cols as u64];
    let boxes = [GEMM_DEPTH as u32, box_rows as u32];
    let steps = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::zeroed();
    // SAFETY: every pointer names a live array of the rank's length (2, and 1 stride); the
    // address is a device allocation of `rows` rows of `cols` f16 values (the caller checked)
    let rc = unsafe {
        cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            2,
            addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    anyhow::ensure!(
        rc == CUresult::CUDA_SUCCESS,
        "cuda backend: the tensor map of {rows} x {cols} f16 values at {addr:#x} ({box_rows}-row boxes): {rc:?}"
    );
    // SAFETY: initialized by the successful call
    Ok(unsafe { map.assume_init() }.opaque)
}

/// A block's tile, and so the kernel of a product: `Mma` is `gemm<rows>_<dtype>`
/// (`mma.sync`, 128 weight rows, any dtype); on sm_90, Hopper's warpgroup products over 128
/// token rows: `Wg` is `gemm_wg128_<dtype>` (q8_0, q4_0 and q4_1 dequantized by the product
/// threads, 128 weight rows), `Tma` is `gemm_tma<cols>_f16` (f16, the copies by the tensor
/// memory accelerator, 128 or 256 weight rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTile {
    Mma { rows: usize },
    Wg,
    Tma { cols: usize },
}

impl GemmTile {
    /// Every tile with a kernel for `dtype` on a device of `arch` (the self-test runs each).
    pub fn all(dtype: GgmlType, arch: &str) -> Vec<GemmTile> {
        let mut tiles = vec![GemmTile::Mma { rows: 64 }, GemmTile::Mma { rows: 128 }];
        if arch == "sm_90" {
            match dtype {
                GgmlType::F16 => {
                    tiles.extend([GemmTile::Tma { cols: 128 }, GemmTile::Tma { cols: 256 }])
                }
                GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => tiles.push(GemmTile::Wg),
                _ => {}
            }
        }
        tiles
    }

    /// Whether a block walks every reduction chunk of its tile (adding a row-parallel
    /// product's tree as each chunk ends), rather than the grid having a block per chunk.
    fn walks_chunks(self) -> bool {
        matches!(self, GemmTile::Wg | GemmTile::Tma { .. })
    }

    /// Threads of a block of the tile's kernel.
    fn threads(self) -> u32 {
        match self {
            GemmTile::Tma { .. } => TMA_THREADS,
            GemmTile::Mma { .. } | GemmTile::Wg => 256,
        }
    }

    fn shape(self) -> (usize, usize) {
        match self {
            GemmTile::Mma { rows } => (rows, TILE_COLS),
            GemmTile::Wg => (WG_ROWS, TILE_COLS),
            GemmTile::Tma { cols } => (WG_ROWS, cols),
        }
    }

    /// Whether a launch of this tile over `chunks` chunks into a tree `sum` keeps the tree on
    /// chip (`gemm_tma128_tree_f16`).
    fn tree_on_chip(self, chunks: usize, sum: bool) -> bool {
        self == GemmTile::Tma { cols: 128 } && sum && chunks <= TMA_TREE_CHUNKS
    }

    fn kernel(self, dtype: GgmlType, tree: bool) -> String {
        match self {
            GemmTile::Mma { rows } => format!("gemm{rows}_{}", dtype.name()),
            GemmTile::Wg => format!("gemm_wg{TILE_COLS}_{}", dtype.name()),
            GemmTile::Tma { cols } if tree => format!("gemm_tma{cols}_tree_{}", dtype.name()),
            GemmTile::Tma { cols } => format!("gemm_tma{cols}_{}", dtype.name()),
        }
    }

    /// The dynamic shared memory of the tile's kernel for `dtype`, as kernels/gemm.cu lays it
    /// out. `Mma`: the activation stages, the weight stages (a row's stored bytes of one
    /// step, padded to 16) and, unless the staged f16 rows feed the products themselves, one
    /// f16 weight tile. `Wg`: the stages (activations in 128-byte lines, then the weights'
    /// stored bytes), two dequantized f16 tiles, and 1 KiB to align them. `Tma`: its stages of
    /// activation and weight lines, with the tree on chip (`tree`) the subtrees of two and of
    /// four chunks (a float per value of the tile each), then a full and an empty barrier (8
    /// bytes each) per stage, and 1 KiB to align them.
    fn shared_bytes(self, dtype: GgmlType, tree: bool) -> usize {
        let f16_row = 2 * GEMM_LD;
        // a weight row's stored bytes of one step where the kernel stages them (0: it does not)
        let staged_row = match dtype {
            GgmlType::F16 => f16_row,
            GgmlType::Q8_0 => (64 + 4usize).next_multiple_of(16),
            GgmlType::Q4_0 => (32 + 4usize).next_multiple_of(16),
            GgmlType::Q4_1 => (32 + 8usize).next_multiple_of(16),
            _ => 0,
        };
        let f16 = dtype == GgmlType::F16;
        match self {
            GemmTile::Mma { rows } => {
                let tile = if f16 { 0 } else { TILE_COLS * f16_row };
                GEMM_STAGES * (rows * f16_row + TILE_COLS * staged_row) + tile
            }
            GemmTile::Wg => {
                WG_STAGES * (WG_ROWS * WG_LINE + TILE_COLS * staged_row)
                    + 2 * TILE_COLS * WG_LINE
                    + 1024
            }
            GemmTile::Tma { cols } => {
                let subtrees = if tree { 2 * WG_ROWS * cols * 4 } else { 0 };
                tma_stages(cols, tree) * ((WG_ROWS + cols) * WG_LINE + 16) + subtrees + 1024
            }
        }
    }
}

/// The groups of a grouped product ([`CudaDevice::gemm_grouped`]): `count` pairs (first row,
/// rows) in `spans`, none longer than `most_rows`; group `g`'s matrix is `g * stride` bytes past
/// the first group's.
#[derive(Clone)]
pub struct Groups {
    pub spans: Span<i32>,
    pub count: usize,
    pub stride: usize,
    pub most_rows: usize,
}

/// A weight matrix as the GEMM reads it, by address: a whole upload or one expert's matrix of
/// a stack (both in the device layout of `DeviceWeight::upload`).
#[derive(Clone, Copy)]
pub struct Matrix {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Device address of the first row.
    pub addr: u64,
}

impl From<&DeviceWeight> for Matrix {
    fn from(w: &DeviceWeight) -> Matrix {
        Matrix {
            dtype: w.dtype,
            rows: w.rows,
            cols: w.cols,
            addr: Span::of(&w.data).addr(),
        }
    }
}

impl CudaDevice {
    /// `y[z][t][n]` = chunk `z` of the product of f16 row `t` of `a` (`w.cols` values a row)
    /// with weight row `n`, for the `chunks` equal chunks of the reduction (`y` holds `chunks`
    /// blocks of `rows * w.rows` values; one chunk is the product itself), in the kernel of
    /// `tile` (by default [`Self::gemm_tile`]).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        stream: &CudaStream,
        w: Matrix,
        a: &impl DevicePtr<u16>,
        rows: usize,
        chunks: usize,
        y: &mut impl DevicePtrMut<f32>,
        tile: Option<GemmTile>,
    ) -> Result<()> {
        let out = (ptr_mut(stream, y), y.len());
        self.gemm_launch(stream, &[(w, out)], a, rows, chunks, tile, None, None)
    }

    /// For each `(w, y)`: `y` = the `rows` rows of `a` times `w`, whole (one chunk); the
    /// weights share `a` (q, k and v; gate and up), and neighbours of one dtype share a launch.
    /// Each output has the bits of its own [`Self::gemm`].
    pub fn gemm_many(
        &self,
        stream: &CudaStream,
        products: &[(Matrix, &Span<f32>)],
        a: &impl DevicePtr<u16>,
        rows: usize,
    ) -> Result<()> {
        for same in products.chunk_by(|p, q| p.0.dtype == q.0.dtype) {
            for launch in same.chunks(GEMM_MAX_WEIGHTS) {
                let outs: Vec<_> = launch
                    .iter()
                    .map(|(w, y)| (*w, (y.addr(), y.len())))
                    .collect();
                self.gemm_launch(stream, &outs, a, rows, 1, None, None, None)?;
            }
        }
        Ok(())
    }

    /// `out` (`rows * w.rows` values) = the `chunks` chunks of the product (as [`Self::gemm`]
    /// computes them) combined in the canonical tree (`tree_sum`'s), in the kernel of `tile`
    /// (by default [`Self::gemm_tile`]); `parts` (`chunks` blocks of `rows * w.rows`) holds
    /// them meanwhile. The warpgroup kernels add the tree as each chunk ends; the others store
    /// every chunk, then `tree_sum` adds them.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_tree(
        &self,
        stream: &CudaStream,
        w: Matrix,
        a: &impl DevicePtr<u16>,
        rows: usize,
        chunks: usize,
        parts: &Span<f32>,
        out: &Span<f32>,
        tile: Option<GemmTile>,
    ) -> Result<()> {
        assert_eq!(
            out.len(),
            rows * w.rows,
            "gemm_tree: out must hold {rows} x {} values",
            w.rows
        );
        assert!(
            chunks.is_power_of_two() && chunks <= MAX_CHUNKS,
            "gemm_tree: {chunks} chunks; the canonical tree takes a power of two up to {MAX_CHUNKS}"
        );
        let tile = tile.unwrap_or_else(|| self.gemm_tile(w.dtype, &[w.rows], rows, chunks));
        let launch = [(w, (parts.addr(), parts.len()))];
        if tile.walks_chunks() {
            return self.gemm_launch(
                stream,
                &launch,
                a,
                rows,
                chunks,
                Some(tile),
                Some(out),
                None,
            );
        }
        self.gemm_launch(stream, &launch, a, rows, chunks, Some(tile), None, None)?;
        self.tree_sum(stream, parts, chunks, &mut out.clone())
    }

    /// The tile of a launch over weights of `weight_rows` rows (in `dtype`) and `rows` token
    /// rows in `chunks` chunks. On sm_90, over more than 64 rows, the warpgroup kernels: for
    /// f16 `gemm_tma` (256 weight rows a tile where those tiles fill the device and the product
    /// is whole, else 128, whose tree of a row-parallel product's chunks stays on chip), for
    /// q8_0, q4_0 and q4_1 `gemm_wg`. Otherwise
    /// `mma.sync`: 128 token rows where those tiles fill the device, else 64 (a few rows fill a
    /// 64-row tile better; grouped products always take it). Every tile gives every output the
    /// same bits.
    pub fn gemm_tile(
        &self,
        dtype: GgmlType,
        weight_rows: &[usize],
        rows: usize,
        chunks: usize,
    ) -> GemmTile {
        let blocks = |tile_rows: usize, tile_cols: usize| -> usize {
            let columns: usize = weight_rows.iter().map(|n| n.div_ceil(tile_cols)).sum();
            columns * rows.div_ceil(tile_rows)
        };
        if self.arch() == "sm_90" && rows > 64 {
            match dtype {
                // a row-parallel product's chunks: its tree on chip in 128-row tiles
                GgmlType::F16 if chunks == 1 && blocks(WG_ROWS, 256) >= self.sm_count() => {
                    return GemmTile::Tma { cols: 256 }
                }
                GgmlType::F16 => return GemmTile::Tma { cols: 128 },
                GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => return GemmTile::Wg,
                _ => {}
            }
        }
        let rows = if rows > 64 && blocks(128, TILE_COLS) * chunks >= self.sm_count() {
            128
        } else {
            64
        };
        GemmTile::Mma { rows }
    }

    /// For each `(w, y)`: the rows of each group of `groups` times that group's matrix of
    /// `w` (`w` is the first group's), into the group's rows of `y`; `a` and every `y` hold
    /// `rows` rows, the groups' spans within them. One launch a dtype and up to three weights,
    /// in the 64-row `mma.sync` tile; each output row has the bits of [`Self::gemm`] of its
    /// row alone with its group's matrix.
    pub fn gemm_grouped(
        &self,
        stream: &CudaStream,
        products: &[(Matrix, &Span<f32>)],
        a: &Span<u16>,
        rows: usize,
        groups: &Groups,
    ) -> Result<()> {
        anyhow::ensure!(
            groups.stride.is_multiple_of(16) && groups.spans.len() >= 2 * groups.count,
            "gemm_grouped: matrices {} bytes apart (not 16-byte aligned) or fewer spans than {} groups",
            groups.stride,
            groups.count
        );
        for same in products.chunk_by(|p, q| p.0.dtype == q.0.dtype) {
            for launch in same.chunks(GEMM_MAX_WEIGHTS) {
                let outs: Vec<_> = launch
                    .iter()
                    .map(|(w, y)| (*w, (y.addr(), y.len())))
                    .collect();
                let tile = Some(GemmTile::Mma { rows: 64 });
                self.gemm_launch(stream, &outs, a, rows, 1, tile, None, Some(groups))?;
            }
        }
        Ok(())
    }

    /// One launch over the weights of `outs` (each with its output's address and length) in
    /// the kernel of `tile`, by default [`Self::gemm_tile`]; with `sum` (a warpgroup tile and
    /// one weight) its chunks' tree goes there, else each chunk to its place in the output;
    /// with `groups` (an `mma.sync` tile, one chunk), a product per group.
    #[allow(clippy::too_many_arguments)]
    fn gemm_launch(
        &self,
        stream: &CudaStream,
        outs: &[(Matrix, (u64, usize))],
        a: &impl DevicePtr<u16>,
        rows: usize,
        chunks: usize,
        tile: Option<GemmTile>,
        sum: Option<&Span<f32>>,
        groups: Option<&Groups>,
    ) -> Result<()> {
        let w0 = outs[0].0;
        assert!(
            (1..=GEMM_MAX_WEIGHTS).contains(&outs.len())
                && outs
                    .iter()
                    .all(|(w, _)| w.dtype == w0.dtype && w.cols == w0.cols),
            "gemm: 1 to {GEMM_MAX_WEIGHTS} weights of one dtype and width a launch"
        );
        assert!(
            chunks > 0 && w0.cols.is_multiple_of(chunks * GEMM_DEPTH),
            "gemm: {} columns do not split into {chunks} chunks of whole {GEMM_DEPTH}-value steps",
            w0.cols
        );
        for (w, (_, len)) in outs {
            assert!(
                rows > 0 && a.len() >= rows * w.cols && *len == chunks * rows * w.rows,
                "gemm: a must hold {rows} rows of {} values and y {chunks} x {rows} x {} values",
                w.cols,
                w.rows
            );
            // the weights' stages are copied 16 bytes at a time
            anyhow::ensure!(
                w.addr.is_multiple_of(16),
                "gemm: a {} weight at address {:#x}, not 16-byte aligned",
                w.dtype.name(),
                w.addr
            );
        }
        let weight_rows: Vec<usize> = outs.iter().map(|(w, _)| w.rows).collect();
        let tile = tile.unwrap_or_else(|| self.gemm_tile(w0.dtype, &weight_rows, rows, chunks));
        assert!(
            GemmTile::all(w0.dtype, self.arch()).contains(&tile),
            "gemm: no {tile:?} kernel for {} on {}",
            w0.dtype.name(),
            self.arch()
        );
        assert!(
            sum.is_none() || (outs.len() == 1 && tile.walks_chunks()),
            "gemm: a tree sum takes one weight in a warpgroup tile"
        );
        assert!(
            groups.is_none_or(|g| chunks == 1 && !tile.walks_chunks() && g.count > 0),
            "gemm: a grouped launch takes one chunk in an mma.sync tile"
        );
        let (tile_rows, tile_cols) = tile.shape();
        let columns: usize = weight_rows.iter().map(|n| n.div_ceil(tile_cols)).sum();
        let tree = tile.tree_on_chip(chunks, sum.is_some());
        let name = tile.kernel(w0.dtype, tree);
        let smem = tile.shared_bytes(w0.dtype, tree);
        self.allow_dynamic_shared(&name, 0, smem)?;
        let mut job = GemmJob {
            w: [0; GEMM_MAX_WEIGHTS],
            y: [0; GEMM_MAX_WEIGHTS],
            n: [0; GEMM_MAX_WEIGHTS],
            count: int(outs.len()),
            spans: groups.map_or(0, |g| g.spans.addr()),
            w_stride: groups.map_or(0, |g| g.stride as u64),
            row_tiles: groups.map_or(0, |g| int(g.most_rows.div_ceil(tile_rows).max(1))),
        };
        for (i, (w, (y, _))) in outs.iter().enumerate() {
            job.w[i] = w.addr;
            job.y[i] = *y;
            job.n[i] = int(w.rows);
        }
        let ap = ptr(stream, a);
        let (m, k, c) = (int(rows), int(w0.cols), int(chunks));
        // a warpgroup block walks every chunk of its tile
        let chunk_blocks = if tile.walks_chunks() { 1 } else { chunks };
        // the token-row tiles of a tile column are neighbours in launch order (gemm_part)
        let (row_tiles, group_blocks) = match groups {
            Some(g) => (job.row_tiles as usize, g.count),
            None => (rows.div_ceil(tile_rows), 1),
        };
        let cfg = LaunchConfig {
            grid_dim: (
                (columns * row_tiles) as u32,
                group_blocks as u32,
                chunk_blocks as u32,
            ),
            block_dim: (tile.threads(), 1, 1),
            shared_mem_bytes: smem as u32,
        };
        if tile.walks_chunks() {
            // the warpgroup kernels store (and read back) pairs of values
            let addrs = outs
                .iter()
                .map(|(_, (y, _))| *y)
                .chain(sum.map(|y| y.addr()));
            for addr in addrs {
                anyhow::ensure!(
                    addr.is_multiple_of(8),
                    "gemm: an output at address {addr:#x}, not 8-byte aligned"
                );
            }
        }
        let sum = sum.map_or(0, |y| y.addr());
        if let GemmTile::Tma { cols } = tile {
            let mut maps = TmaMaps {
                a: f16_tensor_map(ap, rows, w0.cols, WG_ROWS)?,
                w: [[0; 16]; GEMM_MAX_WEIGHTS],
            };
            for (map, (w, _)) in maps.w.iter_mut().zip(outs) {
                *map = f16_tensor_map(w.addr, w.rows, w.cols, cols)?;
            }
            return self.launch(stream, &name, cfg, |l| {
                l.arg(&maps).arg(&job).arg(&m).arg(&k).arg(&c).arg(&sum);
            });
        }
        self.launch(stream, &name, cfg, |l| {
            l.arg(&ap).arg(&job).arg(&m).arg(&k).arg(&c);
            if tile.walks_chunks() {
                l.arg(&sum);
            }
        })
    }

    /// `out = x` narrowed to f16 (round to nearest even).
    pub fn to_f16(
        &self,
        stream: &CudaStream,
        x: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<u16>,
    ) -> Result<()> {
        assert!(out.len() >= x.len(), "to_f16: out is shorter than x");
        let (xp, op, n) = (ptr(stream, x), ptr_mut(stream, out), int(x.len()));
        self.launch(stream, "to_f16_f32", grid(x.len(), 256), |l| {
            l.arg(&xp).arg(&op).arg(&n);
        })
    }

    /// `out = silu(gate) * up`, elementwise; with `limit`, gate and up clamped first
    /// (the CPU kernel `silu_mul_clamped`); with `out16`, `out` narrowed to f16 there too (the
    /// bits of [`Self::to_f16`] of `out`), in the same launch.
    pub fn swiglu_rows(
        &self,
        stream: &CudaStream,
        gate: &impl DevicePtr<f32>,
        up: &impl DevicePtr<f32>,
        limit: Option<f32>,
        out: &mut impl DevicePtrMut<f32>,
        out16: Option<&Span<u16>>,
    ) -> Result<()> {
        assert!(
            gate.len() == up.len() && out.len() == gate.len(),
            "swiglu_rows: lengths differ"
        );
        assert!(
            out16.is_none_or(|h| h.len() >= gate.len()),
            "swiglu_rows: out16 is shorter than gate"
        );
        let (gp, up_, op, hp, n) = (
            ptr(stream, gate),
            ptr(stream, up),
            ptr_mut(stream, out),
            out16.map_or(0, Span::addr),
            int(gate.len()),
        );
        let limit = limit.unwrap_or(0.0);
        self.launch(stream, "swiglu_rows_f32", grid(gate.len(), 256), |l| {
            l.arg(&gp).arg(&up_).arg(&op).arg(&hp).arg(&n).arg(&limit);
        })
    }

    /// `x[t] += b` for every row `t` of `x` (rows of `b.len()` values).
    pub fn add_rows(
        &self,
        stream: &CudaStream,
        x: &mut impl DevicePtrMut<f32>,
        b: &impl DevicePtr<f32>,
    ) -> Result<()> {
        assert!(
            !b.is_empty() && x.len().is_multiple_of(b.len()),
            "add_rows: x must hold whole rows of b"
        );
        let n = x.len();
        let (xp, bp, cols, n) = (ptr_mut(stream, x), ptr(stream, b), int(b.len()), int(n));
        self.launch(stream, "add_rows_f32", grid(n as usize, 256), |l| {
            l.arg(&xp).arg(&bp).arg(&cols).arg(&n);
        })
    }

    /// `out[t] = pos[0] + t` for every token row `t` of `out`.
    pub fn row_positions(
        &self,
        stream: &CudaStream,
        pos: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<u32>,
    ) -> Result<()> {
        assert!(!pos.is_empty(), "row_positions: no step position");
        let n = out.len();
        let (pp, op, ni) = (ptr(stream, pos), ptr_mut(stream, out), int(n));
        self.launch(stream, "row_positions_u32", grid(n, 256), |l| {
            l.arg(&pp).arg(&op).arg(&ni);
        })
    }

    /// Writes each token row's k (rotated to position `pos[0] + row`, as `attention` rotates
    /// it) and v into the cache at that position, narrowed to f16; with `slots`, row `r` at
    /// position `pos[r]` of sequence slot `slots[r]` (as `attention`).
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store_rows(
        &self,
        stream: &CudaStream,
        k: &impl DevicePtr<f32>,
        v: &impl DevicePtr<f32>,
        kv: &mut DeviceKv,
        pos: &impl DevicePtr<u32>,
        slots: Option<&Span<u32>>,
        rope: (f32, RopeStyle),
    ) -> Result<()> {
        let (hd, row) = (kv.head_dim, kv.n_kv_heads * kv.head_dim);
        let rows = k.len() / row;
        assert!(
            rows > 0 && k.len() == rows * row && v.len() == k.len() && !pos.is_empty(),
            "kv_store_rows: k and v must hold whole rows of {row} values"
        );
        assert!(
            slots.is_none_or(|sl| sl.len() >= rows && pos.len() >= rows),
            "kv_store_rows: slots and pos must name every row's slot and position"
        );
        let slp = slots.map_or(0, Span::addr);
        let (theta, style) = rope;
        // the host computes the angle step as `attention` does, so the bits are the same
        let theta_scale = theta.powf(-2.0 / hd as f32);
        let neox = i32::from(style == RopeStyle::Neox);
        let (kp, vp, pp) = (ptr(stream, k), ptr(stream, v), ptr(stream, pos));
        let (kc, vc) = (ptr_mut(stream, &mut kv.k), ptr_mut(stream, &mut kv.v));
        let (nkv, hdi, cap) = (int(kv.n_kv_heads), int(hd), int(kv.capacity));
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, kv.n_kv_heads as u32, 1),
            block_dim: (64, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(stream, "kv_store_rows_f16", cfg, |l| {
            l.arg(&kp).arg(&vp).arg(&kc).arg(&vc).arg(&pp).arg(&slp);
            l.arg(&nkv).arg(&hdi).arg(&cap).arg(&theta_scale).arg(&neox);
        })
    }
}

/// Head dimensions the tensor-core attention takes (`flash_attention_hd*`).
pub const FLASH_HEAD_DIMS: [usize; 2] = [64, 128];
/// Query rows of one block of it (FA_ROWS in kernels/flash.cu).
const FLASH_ROWS: usize = 64;

impl CudaDevice {
    /// Causal attention of the `rows` token rows of `q` (whole heads of `kv.head_dim`, one of
    /// `FLASH_HEAD_DIMS`; row `r` at position `pos[0] + r`, rotated here as `attention`
    /// rotates it) over the cache `kv_store_rows` wrote, scale `1 / sqrt(head_dim)`, into
    /// `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attention(
        &self,
        stream: &CudaStream,
        q: &impl DevicePtr<f32>,
        kv: &DeviceKv,
        pos: &impl DevicePtr<u32>,
        rows: usize,
        rope: (f32, RopeStyle),
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let hd = kv.head_dim;
        assert!(
            FLASH_HEAD_DIMS.contains(&hd),
            "flash_attention: head_dim {hd} is not one of {FLASH_HEAD_DIMS:?}"
        );
        let n_heads = q.len() / (rows.max(1) * hd);
        assert!(
            rows > 0
                && q.len() == rows * n_heads * hd
                && out.len() == q.len()
                && n_heads.is_multiple_of(kv.n_kv_heads)
                && !pos.is_empty(),
            "flash_attention: q and out must hold {rows} rows of whole heads grouping over the kv heads"
        );
        let (theta, style) = rope;
        // the host computes the angle step as `attention` does
        let theta_scale = theta.powf(-2.0 / hd as f32);
        let scale = 1.0 / (hd as f32).sqrt();
        let neox = i32::from(style == RopeStyle::Neox);
        let (qp, kc, vc, op, pp) = (
            ptr(stream, q),
            ptr(stream, &kv.k),
            ptr(stream, &kv.v),
            ptr_mut(stream, out),
            ptr(stream, pos),
        );
        let (m, nh, nkv) = (int(rows), int(n_heads), int(kv.n_kv_heads));
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(FLASH_ROWS) as u32, n_heads as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let name = format!("flash_attention_hd{hd}");
        self.launch(stream, &name, cfg, |l| {
            l.arg(&qp).arg(&kc).arg(&vc).arg(&op).arg(&pp);
            l.arg(&m)
                .arg(&nh)
                .arg(&nkv)
                .arg(&scale)
                .arg(&theta_scale)
                .arg(&neox);
        })
    }
}
