//! kernels/synth.cu, compiled for the host, draws the blocks `DrawnBlocks::bytes` draws, in
//! the device layout: its source with the CUDA built-ins it uses replaced by host stand-ins
//! (`__umul64hi` by a 128-bit product, the grid by loops over blocks and threads) is built
//! with the machine's C++ compiler (`c++`, g++ on the dev and CI machines) and run over
//! `cuda::synth::checked_shards` (every quantized format, whole and split, matrices and
//! stacks). The GPU self-test
//! (`synth_blocks`) checks the same on a device; this keeps the kernel's logic checked in CI.

use std::path::Path;
use std::process::Command;

use crate::cuda::synth::{checked_shards, host_layout};
use crate::cuda::weights::{kernel_format, Planes};

/// The CUDA names synth.cu uses, for the host.
const SHIM: &str = r#"
#include <cstdio>
#include <vector>
typedef unsigned char u8; typedef signed char i8; typedef unsigned short u16;
typedef unsigned int u32; typedef unsigned long long u64;
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
struct Dim { unsigned x; };
static Dim blockIdx, threadIdx, blockDim, gridDim;
static inline u64 __umul64hi(u64 a, u64 b) { return (u64)(((unsigned __int128)a * b) >> 64); }
static inline void overlap_with_neighbours() {}
"#;

/// Reads one job per line of `jobs.txt`, runs the kernel over a grid of 3 blocks of 256
/// threads (so threads stride over the blocks), writes `got{i}.bin` with each matrix at its
/// stride.
const MAIN: &str = r#"
int main() {
    FILE* f = fopen("jobs.txt", "r");
    int i, format, planar, d, m, top, span;
    unsigned long long key;
    long long count, rows, cb, rb, fr, fc, stride;
    while (fscanf(f, "%d %llu %lld %lld %lld %lld %lld %lld %lld %d %d %d %d %d %d", &i, &key,
                  &count, &rows, &cb, &rb, &fr, &fc, &stride, &format, &planar, &d, &m, &top,
                  &span) == 15) {
        std::vector<u8> buf(stride * count, 0);
        SynthJob j = {buf.data(), key, count, rows, cb, rb, fr, fc, stride, format, planar,
                      (u16)d, (u16)m, top, span};
        blockDim.x = 256;
        gridDim.x = 3;
        for (unsigned b = 0; b < gridDim.x; ++b)
            for (unsigned t = 0; t < blockDim.x; ++t) {
                blockIdx.x = b;
                threadIdx.x = t;
                synth_blocks(j);
            }
        char path[32];
        snprintf(path, sizeof path, "got%d.bin", i);
        FILE* out = fopen(path, "wb");
        fwrite(buf.data(), 1, buf.size(), out);
        fclose(out);
    }
    return 0;
}
"#;

#[test]
fn the_device_kernel_compiled_for_the_host_draws_the_hosts_blocks() {
    let dir = std::env::temp_dir().join(format!("memra-synth-kernel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = include_str!("../../../kernels/synth.cu").replace("#include \"common.cuh\"", "");
    std::fs::write(dir.join("check.cpp"), format!("{SHIM}\n{kernel}\n{MAIN}")).unwrap();
    let mut jobs = String::new();
    let mut wants = Vec::new();
    for (i, (case, blocks)) in checked_shards().unwrap().into_iter().enumerate() {
        let stride = blocks.matrix_bytes().next_multiple_of(256);
        wants.push((case, host_layout(&blocks, stride).unwrap()));
        let f = blocks.kernel_fields();
        let planar = Planes::of(blocks.dtype()).is_some();
        jobs += &format!(
            "{i} {} {} {} {} {} {} {} {stride} {} {} {} {} {} {}\n",
            f.key,
            blocks.count,
            blocks.rows,
            blocks.col_blocks,
            blocks.row_blocks,
            blocks.first_row,
            blocks.first_col_block,
            kernel_format(blocks.dtype()).unwrap(),
            i32::from(planar),
            f.d,
            f.m,
            f.top,
            f.span
        );
    }
    std::fs::write(dir.join("jobs.txt"), jobs).unwrap();
    run(
        &dir,
        "c++",
        &["-O1", "-std=c++17", "-o", "check", "check.cpp"],
    );
    run(&dir, "./check", &[]);
    for (i, (case, want)) in wants.iter().enumerate() {
        let got = std::fs::read(dir.join(format!("got{i}.bin"))).unwrap();
        let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
        assert!(
            got.len() == want.len() && differ == 0,
            "{case}: {differ} of {} bytes differ ({} drawn)",
            want.len(),
            got.len()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `program` in `dir`, failing the test with its output unless it succeeds.
fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (this check needs a C++ compiler, `c++`)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
