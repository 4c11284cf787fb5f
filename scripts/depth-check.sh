#!/usr/bin/env bash
# The checks of the depth suite's files that need no GPU (scripts/gpu.sh depth writes the same
# files at real widths there): for each architecture, scripts/depth_models.py's small widths
# (--tiny) in F32 and F16 compiled by memra-compile and decoded for 8 greedy tokens by memra-run
# on the CPU backend; the 2-block cuts of the 4-block files likewise (the first two blocks, and
# for kimi-linear the last two, renumbered); the real-width headers
# (--sparse: the tensor data a hole) compiled with the suite's own placements. With LLAMA_BIN,
# a folder holding a CPU build of llama.cpp's llama-quantize and llama-bench (cmake -S
# .llama/llama.cpp -DGGML_CUDA=OFF, targets llama-quantize llama-bench), each tiny F16 file is
# also quantized as the suite quantizes it (Q4_1, Q8_0 token embedding), decoded by memra from
# that, and decoded by llama-bench at depths 0 and 64, and each cut decoded by llama-bench, so
# llama.cpp loads every file memra is checked on.
#
#   bash scripts/depth-check.sh [DIR]      (default /tmp/memra-depth-check)
#
# Needs python3 with gguf 0.19.0 and numpy (a venv with `pip install gguf==0.19.0` will do),
# and memra-compile and memra-run (BIN, default target/release: cargo build --release). Prints
# one line per check; a refusal is printed with its message, and the exit status is 1 when any
# check failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${1:-/tmp/memra-depth-check}
bin=${BIN:-target/release}
failed=0
rm -rf "$dir" && mkdir -p "$dir"

line() { printf '%-44s %s\n' "$1" "$2"; }
check() { # name command...: one line, the last line of the output when it fails
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        line "$name" ok
    else
        line "$name" "FAIL: $(echo "$out" | grep -v '^\s*$' | tail -1 | cut -c1-300)"
        failed=1
        return 1
    fi
}
placement() { # gguf max_context: a one-device placement of it beside it
    printf '[model]\ngguf = "%s"\n\n[[devices]]\nids = [0]\nmemory_gib = 141\n\n[runtime]\nmax_context = %s\n\n[pipeline]\ndevices = [[0]]\n' \
        "$1" "$2" >"${1%.gguf}.toml"
}
memra() { # gguf: compiled, then 8 greedy tokens on the CPU backend
    local f=$1 name
    name=$(basename "${f%.gguf}")
    placement "$f" 256
    check "compile $name" "$bin/memra-compile" -q -o "${f%.gguf}.plan.toml" "${f%.gguf}.toml" &&
        check "generate $name (cpu)" "$bin/memra-run" generate --backend cpu --temp 0 -n 8 \
            -p "The quick brown fox" "${f%.gguf}.plan.toml"
}

models=(llama8b qwen3moe deepseek2 kimi-linear glm5-next)
for outtype in f32 f16; do
    python3 scripts/depth_models.py write "${models[@]}" --tiny --outtype $outtype --out "$dir" >/dev/null
    mkdir -p "$dir/omit"
    python3 scripts/depth_models.py write glm5-next --tiny --outtype $outtype --no-indexer-types \
        --out "$dir/omit" >/dev/null
    mv "$dir/omit/depth-glm5-next-l4-$outtype.gguf" "$dir/depth-glm5-next-omit-l4-$outtype.gguf"
done
for f in "$dir"/depth-*-f32.gguf "$dir"/depth-*-f16.gguf; do memra "$f"; done
for m in kimi-linear glm5-next glm5-next-omit; do
    python3 scripts/depth_models.py cut "$dir/depth-$m-l4-f16.gguf" "$dir/cut-$m-l2-f16.gguf" \
        --layers 2 >/dev/null
    memra "$dir/cut-$m-l2-f16.gguf"
done
# a second half, renumbered (the suite's half cut of the real-width hybrids): blocks 2 and 3 of
# the tiny kimi-linear, KDA and MLA (tiny glm5-next's block 3 shares block 1's indexer)
python3 scripts/depth_models.py cut "$dir/depth-kimi-linear-l4-f16.gguf" \
    "$dir/cut-kimi-linear-from2-l2-f16.gguf" --layers 2 --from 2 >/dev/null
memra "$dir/cut-kimi-linear-from2-l2-f16.gguf"

# the real widths, header only, with the suite's placements
mkdir -p "$dir/sparse" models
python3 scripts/depth_models.py write "${models[@]}" --sparse --out "$dir/sparse" >/dev/null
python3 scripts/depth_models.py write glm5-next --sparse --no-indexer-types --out "$dir/sparse/omit" >/dev/null
for m in "${models[@]}" glm5-next-omit; do
    base=${m%-omit}
    f=$(ls "$dir"/sparse/depth-"$base"-l*-f16.gguf)
    [ "$m" = "$base" ] || f=$(ls "$dir"/sparse/omit/depth-"$base"-l*-f16.gguf)
    l=$(basename "$f" | sed 's/.*-l\([0-9]*\)-f16.gguf/\1/')
    link=models/depth-$base-l$l.gguf
    [ ! -e "$link" ] || [ -L "$link" ] || { line "compile real-width $m" "skip: $link is a file"; continue; }
    ln -sfn "$f" "$link"
    check "compile real-width $m" "$bin/memra-compile" -q -o "$dir/sparse/$m.plan.toml" \
        "plans/synthetic/depth/depth-$base-l$l.toml"
    rm -f "$link"
done

if [ -n "${LLAMA_BIN:-}" ]; then
    for f in "$dir"/depth-*-f16.gguf; do
        name=$(basename "${f%-f16.gguf}")
        q=$dir/$name-q4_1.gguf
        check "llama-quantize $name Q4_1" "$LLAMA_BIN/llama-quantize" --token-embedding-type q8_0 \
            "$f" "$q" Q4_1 || continue
        memra "$q"
        check "llama-bench $name q4_1 d0,64" "$LLAMA_BIN/llama-bench" -m "$q" -p 0 -n 8 -d 0,64 -r 1 -t 2
        check "llama-bench $name f16" "$LLAMA_BIN/llama-bench" -m "$f" -p 0 -n 8 -r 1 -t 2
    done
    for f in "$dir"/cut-*-f16.gguf; do
        check "llama-bench $(basename "${f%-f16.gguf}") f16" "$LLAMA_BIN/llama-bench" -m "$f" -p 0 -n 8 -r 1 -t 2
    done
fi
exit $failed
