#!/usr/bin/env bash
# Builds the CUDA self-test here (the GPU machine has no Rust) and stages it in .dev/bin/,
# the git-ignored folder the device runner carries (`carry: [".dev"]`). Then, on the GPU
# machine, from the repository root: bash scripts/gpu-selftest.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-cuda}"
cargo build --release -p memra-executor --example cuda_selftest
mkdir -p .dev/bin
cp "$CARGO_TARGET_DIR/release/examples/cuda_selftest" .dev/bin/cuda_selftest
strip .dev/bin/cuda_selftest
ls -l .dev/bin/cuda_selftest
