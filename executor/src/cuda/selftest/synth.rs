//! Synthetic weights drawn on the device (kernels/synth.cu) byte for byte against the host's
//! drawing of the same shards (`DrawnBlocks::bytes`, then the device layout): every quantized
//! format, whole matrices, row and column splits, and expert and head ranges of stacks with
//! their padded strides.

use anyhow::{bail, Result};
use memra_compiler::plan::{Split, WeightShard};

use super::Ctx;
use crate::cuda::ops::Planes;
use crate::synthetic::{self, BlocksDrawn};
use crate::weights::Shard;

/// (tensor, dtype, shape, split): names as a model's, so their spreads vary.
const CASES: [(&str, &str, &[u64], Split); 9] = [
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

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    for (tensor, dtype, shape, split) in CASES {
        let shard = WeightShard {
            tensor: tensor.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
            split,
            bytes: 0,
        };
        let blocks = match synthetic::shard(&shard, 30, BlocksDrawn::OnDevice)? {
            Shard::DrawnMatrix(b) | Shard::DrawnStack(b) => b,
            _ => bail!("{tensor}: a {dtype} shard is drawn on the device"),
        };
        let n = blocks.matrix_bytes();
        let stride = n.next_multiple_of(256);
        let got = dev.download(s, &dev.draw_blocks(s, &blocks, stride)?)?;
        let mut want = Vec::new();
        for m in blocks.bytes()?.chunks_exact(n) {
            match Planes::of(blocks.dtype()) {
                Some(p) => want.extend(p.split(m)),
                None => want.extend_from_slice(m),
            }
            want.resize(want.len().next_multiple_of(stride), 0);
        }
        let mismatches = if got.len() == want.len() {
            got.iter().zip(&want).filter(|(a, b)| a != b).count()
        } else {
            got.len().max(want.len())
        };
        cx.report.exact(
            "synth_blocks",
            format!("{dtype} {shape:?} {split} == host"),
            mismatches,
        );
    }
    Ok(())
}
