//! Synthetic weights drawn on the device (kernels/synth.cu) byte for byte against the host's
//! drawing of the same shards in the device layout (`cuda::synth::checked_shards`: every
//! quantized format, whole matrices, row and column splits, and expert and head ranges of
//! stacks with their padded strides).

use anyhow::Result;

use super::Ctx;
use crate::cuda::synth::{checked_shards, host_layout};

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    for (case, blocks) in checked_shards()? {
        let stride = blocks.matrix_bytes().next_multiple_of(256);
        let got = dev.download(s, &dev.draw_blocks(s, &blocks, stride)?)?;
        let want = host_layout(&blocks, stride)?;
        let mismatches = if got.len() == want.len() {
            got.iter().zip(&want).filter(|(a, b)| a != b).count()
        } else {
            got.len().max(want.len())
        };
        cx.report
            .exact("synth_blocks", format!("{case} == host"), mismatches);
    }
    Ok(())
}
