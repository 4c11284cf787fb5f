#!/usr/bin/env bash
# The Python package the depth suite (scripts/gpu.sh depth) writes its files with, for the GPU
# machine, which has no network: llama.cpp's gguf-py (the PyPI package `gguf`, 0.19.0, the
# version llama.cpp 0c1e570 vendors; pure Python) as a wheel in .dev/wheels (git-ignored; the
# device runner carries it with `carry: [".dev", ...]`). The machine's image has what gguf
# imports besides (numpy, tqdm, pyyaml), so they stay behind: numpy's wheel alone is 16 MB, and
# .dev/bin, .llama and the checkout already take most of a call's 64 MiB. `--numpy` adds a
# CPython 3.12 manylinux numpy wheel all the same. Needs pip and network.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=.dev/wheels
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$dest" gguf==0.19.0
if [ "${1:-}" = --numpy ]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$dest" numpy==2.3.5
fi
ls -l "$dest"
