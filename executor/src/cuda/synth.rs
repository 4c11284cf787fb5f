//! The shards that check the device drawing of synthetic weights (`--weights synthetic`;
//! kernels/synth.cu, launched by `weights`): every quantized format, whole and split, and the
//! host's picture of what the device should hold for each. The GPU self-test
//! (`synth_blocks`) compares the device's draw with it, and `synthetic::kernel_check` the
//! kernel compiled for the host.

use anyhow::{bail, Result};
use memra_compiler::plan::{Split, WeightShard};

use super::weights::device_layout;
use crate::synthetic::{self, BlocksDrawn, DrawnBlocks};
use crate::weights::Shard;

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
