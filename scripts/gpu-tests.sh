#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-build.sh staged the
# binaries in .dev/bin here: the `gpu-tests` feature's end-to-end tests (executor/tests/gpu.rs),
# the same as `cargo test --release -p memra-executor --features gpu-tests --test gpu` where
# Rust and a GPU meet. The test binary finds the repository at the path it was built in, so
# that path is linked to this checkout first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
built_in="${MEMRA_BUILT_IN:-/work/main}"
if [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")"
    ln -s "$PWD" "$built_in"
fi
.dev/bin/gpu-tests --test-threads 1 "$@"
