//! The device weights and the launch helpers every op family shares: how a weight reaches
//! its rank's device (uploaded from the rank's shards in the device layout, planar for the
//! 32-value block types, or drawn there by kernels/synth.cu for `--weights synthetic`), the
//! stacks of experts and heads, the canonical chunk count of a whole product, and the small
//! pieces each typed launch helper is made of (grid, device address, i32 size, the launch).
//! Every layer kind (`moe`, `mla`, `dsa`, `kda`, `mhc`) and every kernel family's helpers
//! import these from here, so no layer kind's file depends on another's.

use std::sync::Arc;

use anyhow::{bail, Result};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig};
use memra_compiler::plan::{reduction_chunks, Plan};
use memra_gguf::GgmlType;

use super::device::{CudaDevice, DeviceBuffer, KernelArgs};
use crate::synthetic::DrawnBlocks;
use crate::weights::{Matrix, RankWeights, Stack};

/// A weight matrix on the device: `rows` rows of `cols` values of `dtype`, in GGUF's row
/// layout except for the 32-value block types of [`Planes`], which are split in two planes.
pub struct DeviceWeight {
    /// Element type; one of `memra_gguf::SUPPORTED`.
    pub dtype: GgmlType,
    /// The tensor bytes in the device layout.
    pub data: DeviceBuffer<u8>,
    /// Output dimension.
    pub rows: usize,
    /// Reduction dimension (K), a whole number of `dtype` blocks.
    pub cols: usize,
}

impl DeviceWeight {
    /// Uploads a checked weight: supported dtype, whole blocks per row, exact byte count.
    pub fn upload(
        dev: &CudaDevice,
        stream: &Arc<CudaStream>,
        dtype: GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<DeviceWeight> {
        dtype.check_supported()?;
        let Some(row_bytes) = dtype.bytes_for(cols as u64) else {
            anyhow::bail!(
                "{cols} columns is not a multiple of the {dtype} block size {}",
                dtype.block_size()
            );
        };
        let need = row_bytes as usize * rows;
        if bytes.len() != need {
            anyhow::bail!(
                "a {rows}x{cols} {dtype} weight takes {need} bytes, got {}",
                bytes.len()
            );
        }
        let data = match Planes::of(dtype) {
            Some(planes) => dev.upload(stream, &planes.split(bytes))?,
            None => dev.upload(stream, bytes)?,
        };
        Ok(DeviceWeight {
            dtype,
            data,
            rows,
            cols,
        })
    }
}

/// Uploads a weight matrix taken from the rank's shards.
pub(super) fn upload_matrix(
    dev: &CudaDevice,
    s: &Arc<CudaStream>,
    m: Matrix,
) -> Result<DeviceWeight> {
    DeviceWeight::upload(dev, s, m.dtype, &m.data, m.rows, m.cols)
}

/// The matrix `name` of the rank's shards on the device: drawn there if it waited to be
/// drawn, else taken on the host and uploaded.
pub(super) fn device_matrix(
    dev: &CudaDevice,
    s: &Arc<CudaStream>,
    w: &mut RankWeights,
    name: &str,
) -> Result<DeviceWeight> {
    match w.take_drawn_matrix(name) {
        Some(blocks) => Ok(DeviceWeight {
            dtype: blocks.dtype(),
            data: dev.draw_blocks(s, &blocks, blocks.matrix_bytes())?,
            rows: blocks.rows as usize,
            cols: blocks.cols() as usize,
        }),
        None => upload_matrix(dev, s, w.take_matrix(name)?),
    }
}

/// The canonical chunk count of a product over a whole K.
pub(super) fn full_chunks(w: &DeviceWeight) -> usize {
    reduction_chunks(w.cols as u64, w.dtype.block_size() as u64) as usize
}

/// The experts `first..first + count` of a 3-D expert tensor on the device: one matrix of
/// `rows x cols` each, each in the device layout of its own (planar for the 32-value block
/// types), `stride` bytes apart (16-byte aligned).
pub(super) struct DeviceStack {
    /// Shape and dtype of one matrix; `data` holds all of them.
    pub weight: DeviceWeight,
    pub first: usize,
    pub count: usize,
    pub stride: usize,
}

impl DeviceStack {
    /// Bytes from one matrix of `n` bytes to the next.
    fn stride(n: usize) -> usize {
        n.next_multiple_of(256)
    }

    /// The stack `name` of the rank's shards on the device: drawn there if it waited to be
    /// drawn (synthetic weights), else taken on the host and uploaded.
    pub fn take(
        dev: &CudaDevice,
        s: &Arc<CudaStream>,
        w: &mut RankWeights,
        name: &str,
    ) -> Result<DeviceStack> {
        let Some(blocks) = w.take_drawn_stack(name) else {
            return DeviceStack::upload(dev, s, &w.take_stack(name)?);
        };
        let stride = Self::stride(blocks.matrix_bytes());
        Ok(DeviceStack {
            weight: DeviceWeight {
                dtype: blocks.dtype(),
                data: dev.draw_blocks(s, &blocks, stride)?,
                rows: blocks.rows as usize,
                cols: blocks.cols() as usize,
            },
            first: (blocks.first_row / blocks.rows) as usize,
            count: blocks.count as usize,
            stride,
        })
    }

    /// Uploads a stack this rank holds.
    pub fn upload(dev: &CudaDevice, s: &Arc<CudaStream>, st: &Stack) -> Result<DeviceStack> {
        st.dtype.check_supported()?;
        if !st.cols.is_multiple_of(st.dtype.block_size()) {
            bail!(
                "{} columns is not a multiple of the {} block size {}",
                st.cols,
                st.dtype,
                st.dtype.block_size()
            );
        }
        let n = st.matrix_bytes();
        let stride = Self::stride(n);
        let mut bytes = device_layout(st.dtype, &st.data[..n * st.count], n, stride);
        bytes.resize(stride * st.count.max(1), 0);
        Ok(DeviceStack {
            weight: DeviceWeight {
                dtype: st.dtype,
                data: dev.upload(s, &bytes)?,
                rows: st.rows,
                cols: st.cols,
            },
            first: st.first,
            count: st.count,
            stride,
        })
    }
}

/// Matrices of `matrix_bytes` GGUF bytes each, back to back in `matrices`, in the device
/// layout (planar for the 32-value block types, else as stored), each `stride` bytes after
/// the one before it, zeros between: a stack of experts or heads as the device holds it.
pub(crate) fn device_layout(
    dtype: GgmlType,
    matrices: &[u8],
    matrix_bytes: usize,
    stride: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; stride * matrices.len().div_ceil(matrix_bytes.max(1))];
    for (m, to) in matrices
        .chunks_exact(matrix_bytes)
        .zip(out.chunks_mut(stride))
    {
        match Planes::of(dtype) {
            Some(p) => to[..matrix_bytes].copy_from_slice(&p.split(m)),
            None => to[..matrix_bytes].copy_from_slice(m),
        }
    }
    out
}

/// The planar device layout of the 32-value block types (q8_0, q4_0, q4_1): every block's quant
/// bytes first, in GGUF's (row, block) order, then every block's scale bytes in the same order.
/// A row's quants are then contiguous and 16-byte aligned, so the matvec kernels load 16 quant
/// bytes at once instead of gathering them around each block's scales (kernels/matvec.cu);
/// the size is unchanged and the values are the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planes {
    /// Scale bytes at the start of each GGUF block (f16 d, or f16 d and m).
    pub scale_bytes: usize,
    /// Quant bytes after them.
    pub quant_bytes: usize,
}

impl Planes {
    /// The planes of `dtype`, if it is stored planar.
    pub fn of(dtype: GgmlType) -> Option<Planes> {
        let scale_bytes = match dtype {
            GgmlType::Q8_0 | GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 4,
            _ => return None,
        };
        Some(Planes {
            scale_bytes,
            quant_bytes: dtype.block_bytes() - scale_bytes,
        })
    }

    /// GGUF blocks (a whole number of them) in the planar layout.
    pub fn split(self, blocks: &[u8]) -> Vec<u8> {
        let block = self.scale_bytes + self.quant_bytes;
        let n = blocks.len() / block;
        let mut out = vec![0u8; blocks.len()];
        let (quants, scales) = out.split_at_mut(n * self.quant_bytes);
        for (i, b) in blocks.chunks_exact(block).enumerate() {
            let (s, q) = b.split_at(self.scale_bytes);
            scales[i * self.scale_bytes..(i + 1) * self.scale_bytes].copy_from_slice(s);
            quants[i * self.quant_bytes..(i + 1) * self.quant_bytes].copy_from_slice(q);
        }
        out
    }
}

/// Threads of a block of `synth_blocks`, and most blocks of its grid (it strides over more).
const SYNTH_THREADS: u32 = 256;
const SYNTH_MAX_BLOCKS: u64 = 1 << 16;

/// The kernel parameter (`SynthJob` in kernels/synth.cu, C layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct SynthJob {
    dst: u64,
    key: u64,
    count: i64,
    rows: i64,
    col_blocks: i64,
    row_blocks: i64,
    first_row: i64,
    first_col_block: i64,
    stride: i64,
    format: i32,
    planar: i32,
    d: u16,
    m: u16,
    top: i32,
    span: i32,
}

// SAFETY: a plain C struct of integers and a device address, laid out as the kernel reads it
unsafe impl DeviceRepr for SynthJob {}

/// The kernel's format code of `dtype` (SYNTH_* in kernels/synth.cu).
pub(crate) fn kernel_format(dtype: GgmlType) -> Result<i32> {
    Ok(match dtype {
        GgmlType::Q8_0 => 0,
        GgmlType::Q4_0 => 1,
        GgmlType::Q4_1 => 2,
        GgmlType::Q4_K => 3,
        GgmlType::Q6_K => 4,
        other => bail!("the device draws no synthetic {other} blocks"),
    })
}

impl CudaDevice {
    /// `blocks` drawn into a fresh buffer in the device layout (each matrix planar for the
    /// 32-value types), matrix `e` at `e * stride` bytes (`stride` at least a matrix's bytes).
    pub fn draw_blocks(
        &self,
        s: &Arc<CudaStream>,
        blocks: &DrawnBlocks,
        stride: usize,
    ) -> Result<DeviceBuffer<u8>> {
        let n = blocks.matrix_bytes();
        assert!(
            stride >= n,
            "draw_blocks: a stride of {stride} for matrices of {n} bytes"
        );
        let count = blocks.count as usize;
        let buf = self.alloc::<u8>(s, stride * count)?;
        let f = blocks.kernel_fields();
        let job = SynthJob {
            dst: ptr(s, &buf),
            key: f.key,
            count: blocks.count as i64,
            rows: blocks.rows as i64,
            col_blocks: blocks.col_blocks as i64,
            row_blocks: blocks.row_blocks as i64,
            first_row: blocks.first_row as i64,
            first_col_block: blocks.first_col_block as i64,
            stride: stride as i64,
            format: kernel_format(blocks.dtype())?,
            planar: i32::from(Planes::of(blocks.dtype()).is_some()),
            d: f.d,
            m: f.m,
            top: i32::from(f.top),
            span: i32::from(f.span),
        };
        let total = blocks.count * blocks.rows * blocks.col_blocks;
        let grid = total
            .div_ceil(u64::from(SYNTH_THREADS))
            .clamp(1, SYNTH_MAX_BLOCKS);
        let cfg = LaunchConfig {
            grid_dim: (grid as u32, 1, 1),
            block_dim: (SYNTH_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(s, "synth_blocks", cfg, |a| {
            a.arg(&job);
        })?;
        Ok(buf)
    }
}

/// A one-dimensional launch of `threads`-thread blocks over `n` values (at least one block).
pub(super) fn grid(n: usize, threads: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(threads).max(1) as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The device address of `b` for a kernel parameter.
pub(super) fn ptr<T>(stream: &CudaStream, b: &impl DevicePtr<T>) -> u64 {
    // the guard records nothing: event tracking is off for memra contexts
    b.device_ptr(stream).0
}

/// The device address of `b`, which the kernel writes.
pub(super) fn ptr_mut<T>(stream: &CudaStream, b: &mut impl DevicePtrMut<T>) -> u64 {
    b.device_ptr_mut(stream).0
}

/// A size as the kernels' i32.
pub(super) fn int(n: usize) -> i32 {
    i32::try_from(n).expect("invariant: kernel sizes fit in i32")
}

/// Where a layer's device weights come from, for the layer kinds' `take`: the plan, the
/// layer, the rank's host shards and the device and stream they are uploaded on.
pub(super) struct LayerLoad<'a> {
    pub plan: &'a Plan,
    pub l: u32,
    pub w: &'a mut RankWeights,
    pub dev: &'a CudaDevice,
    pub s: &'a Arc<CudaStream>,
}

impl CudaDevice {
    /// Launches `name` with the parameters `push` pushes; only the typed helpers call it.
    pub(super) fn launch<'a>(
        &self,
        stream: &CudaStream,
        name: &str,
        cfg: LaunchConfig,
        push: impl FnOnce(&mut KernelArgs<'a>),
    ) -> Result<()> {
        // SAFETY: each typed helper pushes exactly the parameters of its kernel's signature, in
        // order and with matching types; the pointers are live device buffers of the sizes the
        // helper checked
        unsafe { self.launch_kernel(stream, name, cfg, push) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planes_put_every_quant_before_every_scale_in_block_order() {
        // three q4_1 blocks, each byte its block number * 20 + offset
        let blocks: Vec<u8> = (0..60).collect();
        let planes = Planes::of(GgmlType::Q4_1).unwrap();
        let split = planes.split(&blocks);
        let mut want: Vec<u8> = Vec::new();
        for b in 0..3u8 {
            want.extend(20 * b + 4..20 * b + 20);
        }
        for b in 0..3u8 {
            want.extend(20 * b..20 * b + 4);
        }
        assert_eq!(split, want);
        assert_eq!(Planes::of(GgmlType::Q8_0).unwrap().quant_bytes, 32);
        assert_eq!(Planes::of(GgmlType::Q4_0).unwrap().scale_bytes, 2);
        assert_eq!(Planes::of(GgmlType::Q4_K), None);
        assert_eq!(Planes::of(GgmlType::F16), None);
    }

    #[test]
    fn a_stack_lies_matrix_by_matrix_at_its_stride() {
        // two q4_1 matrices of two blocks each: each planar, 48 bytes apart, zeros between
        let matrices: Vec<u8> = (0..80).collect();
        let planes = Planes::of(GgmlType::Q4_1).unwrap();
        let laid = device_layout(GgmlType::Q4_1, &matrices, 40, 48);
        let mut want = planes.split(&matrices[..40]);
        want.resize(48, 0);
        want.extend(planes.split(&matrices[40..]));
        want.resize(96, 0);
        assert_eq!(laid, want);
        // other types keep their bytes
        let kept = device_layout(GgmlType::Q4_K, &matrices, 40, 40);
        assert_eq!(kept, matrices);
    }
}
