#!/usr/bin/env bash
# Builds the CUDA self-test and the memra binaries here (the GPU machine has no Rust) and
# stages them in .dev/bin/, the git-ignored folder the device runner carries
# (`carry: [".dev"]`). Then, on the GPU machine, from the repository root:
# bash scripts/gpu-selftest.sh, bash scripts/gpu-gates.sh or bash scripts/gpu-multi.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-cuda}"
cargo build --release -p memra-executor --example cuda_selftest --bin memra-run
cargo build --release -p memra-compiler --bin memra-compile
cargo build --release -p memra-gguf --bin memra-synth
# the gpu-tests end-to-end tests, as one binary (run it with gpu-tests.sh)
gpu_tests=$(cargo test --release -p memra-executor --features gpu-tests --test gpu --no-run \
    --message-format=json | grep '"kind":\["test"\]' | grep '"name":"gpu"' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')
mkdir -p .dev/bin
cp "$gpu_tests" .dev/bin/gpu-tests
cp "$CARGO_TARGET_DIR/release/examples/cuda_selftest" .dev/bin/
for bin in memra-run memra-compile memra-synth; do
    cp "$CARGO_TARGET_DIR/release/$bin" .dev/bin/
done
strip .dev/bin/*
ls -l .dev/bin/
