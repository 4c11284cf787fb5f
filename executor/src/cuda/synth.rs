//! Synthetic weights drawn on the device (`--weights synthetic`; kernels/synth.cu): a
//! quantized shard the rank loaded undrawn (`RankWeights::take_drawn_*`) is written straight
//! into its device buffer, in the device layout, with the bytes the host would draw
//! (`DrawnBlocks::bytes`), so a load of a large synthetic model copies nothing over PCIe.
//! Anything else is taken on the host and uploaded.

use std::sync::Arc;

use anyhow::{bail, Result};
use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig};
use memra_gguf::GgmlType;

use super::device::{CudaDevice, DeviceBuffer};
use super::ops::{DeviceWeight, Planes};
use super::rank::upload_matrix;
use crate::synthetic::DrawnBlocks;
use crate::weights::RankWeights;

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
fn format(dtype: GgmlType) -> Result<i32> {
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
            dst: super::ops::ptr(s, &buf),
            key: f.key,
            count: blocks.count as i64,
            rows: blocks.rows as i64,
            col_blocks: blocks.col_blocks as i64,
            row_blocks: blocks.row_blocks as i64,
            first_row: blocks.first_row as i64,
            first_col_block: blocks.first_col_block as i64,
            stride: stride as i64,
            format: format(blocks.dtype())?,
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
