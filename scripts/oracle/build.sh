#!/usr/bin/env bash
# Builds the oracle harness scripts/oracle/logits.cpp against a CPU build of llama.cpp.
#   LLAMA_SRC:   llama.cpp source tree (llama-cpp-python==0.3.36 sdist, vendor/llama.cpp)
#   LLAMA_BUILD: its cmake build directory, holding bin/libllama.so and the ggml libraries
#   OUT:         where the binary goes (default: $LLAMA_BUILD/bin/memra-oracle-logits)
set -euo pipefail
: "${LLAMA_SRC:?set LLAMA_SRC to the llama.cpp source tree}"
: "${LLAMA_BUILD:?set LLAMA_BUILD to the llama.cpp build directory}"
OUT=${OUT:-$LLAMA_BUILD/bin/memra-oracle-logits}
here=$(cd "$(dirname "$0")" && pwd)
g++ -std=c++17 -O2 -Wall -Wextra \
    -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" \
    "$here/logits.cpp" -o "$OUT" \
    -L"$LLAMA_BUILD/bin" -lllama -lggml -lggml-base \
    -Wl,-rpath,"$LLAMA_BUILD/bin"
echo "$OUT"
