//! Synthetic weights drawn on the device (`--weights synthetic`; kernels/synth.cu): a
//! quantized shard the rank loaded undrawn (`RankWeights::take_drawn_*`) is written straight
//! into its device buffer, in the device layout, with the bytes the host would draw
//! (`DrawnBlocks::bytes`), so a load of a large synthetic model copies nothing over PCIe.
//! Anything else is taken on the host and uploaded.

use std::sync::Arc;

use anyhow::{bail, Result};
use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig};
use memra_compiler::plan::{Split, WeightShard};
use memra_gguf::GgmlType;

use super::device::{CudaDevice, DeviceBuffer};
use super::ops::{device_layout, DeviceWeight, Planes};
use super::rank::upload_matrix;
use crate::synthetic::{self, BlocksDrawn, DrawnBlocks};
use crate::weights::{RankWeights, Shard};

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
            dst: super::ops::ptr(s, &buf),
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

/// Shards of every quantized format, whole, split by rows and by columns, and expert and head
/// ranges of stacks (names as a model's, so their spreads vary): what the checks of the device
/// drawing draw (the self-test's `synth_blocks`, and `synthetic::kernel_check` on the host).
const CHECKED: [(&str, &str, &[u64], Split); 9] = [
    ("blk.1.ffn_down.weight", "q4_k", &[64, 1024], Split::Full),
    (
        "blk.1.attn_q.weight",
        "q4_k",
        &[64, 1024],
        Split::Cols {
            start: 256,
            end: 768,
        },
    ),
    (
        "blk.2.ffn_up_exps.weight",
        "q4_k",
        &[8, 16, 512],
        Split::Experts { start: 3, end: 6 },
    ),
    (
        "blk.3.ffn_down.weight",
        "q6_k",
        &[40, 512],
        Split::Rows { start: 8, end: 40 },
    ),
    ("blk.4.attn_k.weight", "q8_0", &[33, 256], Split::Full),
    (
        "blk.4.attn_v.weight",
        "q8_0",
        &[8, 4, 128],
        Split::Heads { start: 1, end: 3 },
    ),
    (
        "blk.5.attn_output.weight",
        "q4_0",
        &[17, 320],
        Split::Cols {
            start: 64,
            end: 320,
        },
    ),
    ("blk.6.ffn_gate.weight", "q4_1", &[21, 96], Split::Full),
    (
        "blk.7.ffn_gate_exps.weight",
        "q4_1",
        &[4, 8, 64],
        Split::Experts { start: 1, end: 4 },
    ),
];

/// The checked shards' blocks, undrawn, each with its name for a report.
pub(crate) fn checked_shards() -> Result<Vec<(String, DrawnBlocks)>> {
    CHECKED
        .into_iter()
        .map(|(tensor, dtype, shape, split)| {
            let shard = WeightShard {
                tensor: tensor.into(),
                dtype: dtype.into(),
                shape: shape.to_vec(),
                split,
                bytes: 0,
            };
            match synthetic::shard(&shard, 30, BlocksDrawn::OnDevice)? {
                Shard::DrawnMatrix(b) | Shard::DrawnStack(b) => {
                    Ok((format!("{dtype} {shape:?} {split}"), b))
                }
                _ => bail!("{tensor}: {dtype} blocks are left to the device"),
            }
        })
        .collect()
}

/// `blocks` drawn on the host as the device holds them (`CudaDevice::draw_blocks` with
/// `stride`): each matrix in the device layout, `stride` bytes apart, zeros between.
pub(crate) fn host_layout(blocks: &DrawnBlocks, stride: usize) -> Result<Vec<u8>> {
    Ok(device_layout(
        blocks.dtype(),
        &blocks.bytes()?,
        blocks.matrix_bytes(),
        stride,
    ))
}
