#!/usr/bin/env bash
# The llama.cpp source the GPU suites build their comparison from (scripts/gpu.sh, suites
# prefill, batch, llamacpp, glm5 ...), put at .llama/llama.cpp (git-ignored; carry it with
# the device runner: `carry: [".dev", ".llama"]`). It is llama.cpp 0c1e570 (b11312) as the
# llama-cpp-python 0.3.36 source package vendors it, pruned to what a CUDA build of
# llama-bench and llama-batched-bench reads (about 25 MB, so .dev and .llama fit the 64 MiB a
# call carries): the CPU and CUDA backends of ggml, the tools its tools/CMakeLists.txt adds
# with the server off. Needs pip and network; builds nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=${1:-.llama/llama.cpp}
if [ -e "$dest" ]; then
    echo "$dest exists; remove it to fetch again" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip download --quiet --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$tmp"
tar -xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
src="$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp
mkdir -p "$dest/ggml/src" "$dest/tools"
for p in CMakeLists.txt LICENSE licenses cmake include src common vendor; do
    cp -r "$src/$p" "$dest/"
done
for p in CMakeLists.txt cmake include; do
    cp -r "$src/ggml/$p" "$dest/ggml/"
done
# ggml's own files and its CPU and CUDA backends (the others are added only when switched on)
find "$src/ggml/src" -maxdepth 1 -type f -exec cp {} "$dest/ggml/src/" \;
cp -r "$src/ggml/src/ggml-cpu" "$src/ggml/src/ggml-cuda" "$dest/ggml/src/"
# the tools tools/CMakeLists.txt adds with the server and RPC off
cp "$src/tools/CMakeLists.txt" "$dest/tools/"
for d in "$src"/tools/*/; do
    case $(basename "$d") in
    cli | rpc | server | tuning | ui) ;;
    *) cp -r "$d" "$dest/tools/" ;;
    esac
done
echo "llama.cpp 0c1e570 at $dest ($(du -sh "$dest" | cut -f1))"
