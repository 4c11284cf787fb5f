#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-build.sh staged the
# binaries in .dev/bin here. The decode-speed record of the performance issue, plus a short
# re-check that speed work kept the numerics:
#   - the CUDA self-test (every kernel against the CPU reference, TP subtrees bit-exact);
#   - gates on llama1b-shaped q4_1 (graphs, PP-3 uneven, TP-4, PP-2 x TP-2 against 1-rank eager);
#   - CUDA against the CPU backend on the smol135m-shaped q4_1 model, 64 greedy steps;
#   - `memra-run bench` (128 tokens after a one-token prompt, 3 reps after a warm-up) for the
#     smol135m, llama1b and llama8b shapes in q4_1, q8_0 and f16 (token embedding q8_0 for the
#     quantized ones): 1 rank with graphs, 1 rank eager, PP-2 on one device;
#   - the per-kernel time of one llama8b q4_1 token (gpu-ncu-token.sh, Nsight Compute).
# Usage: gpu-bench.sh [SECONDS]: a row that would start after SECONDS (default 480) is
# skipped and says so. The last lines printed are the result table.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${BIN:-.dev/bin}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
LOG=/tmp/memra-bench
M=/tmp/memra-models
P=/tmp/memra-plans
mkdir -p "$LOG" "$M" "$P" models
date -u +%Y-%m-%dT%H:%MZ
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
BUDGET="${1:-480}"
t0=$(date +%s)
rows=()
failed=0
row() { rows+=("$(printf '%-30s %-4s %s' "$1" "$2" "$3")"); [ "$2" = ok ] || [ "$2" = skip ] || failed=1; }
late() { [ $(($(date +%s) - t0)) -ge "$BUDGET" ] && { row "$1" skip "budget of ${BUDGET}s spent"; return 0; }; return 1; }
limit() { timeout --kill-after=5 "$@"; }

# Models: small ones first so the checks can start while the 8B files are written.
for shape in smol135m llama1b; do
    for dtype in q4_1 q8_0 f16; do
        "$BIN/memra-synth" --shape $shape --dtype $dtype -o "$M/$shape-$dtype.gguf" 2>"$LOG/synth-$shape-$dtype.log" &
    done
done
wait
for dtype in q4_1 q8_0 f16; do
    "$BIN/memra-synth" --shape llama8b --dtype $dtype -o "$M/llama8b-$dtype.gguf" 2>"$LOG/synth-llama8b-$dtype.log" &
done
echo "small models written in $(($(date +%s) - t0)) s"

plan() { # shape dtype name -> path of the compiled plan
    local out="$P/$2/$3.plan.toml"
    if [ ! -f "$out" ]; then
        mkdir -p "$P/$2"
        ln -sfn "$M/$1-$2.gguf" "models/$1.gguf"
        "$BIN/memra-compile" -q -o "$out" "plans/synthetic/$3.toml" >>"$LOG/compile.log" 2>&1 || echo "compile $3 $2 failed" >>"$LOG/compile.log"
    fi
    echo "$out"
}

limit 120 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
row "selftest" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"

ref=$(plan llama1b q4_1 llama1b-eager)
for cand in llama1b llama1b-pp3 llama1b-tp4 llama1b-pp2-tp2; do
    late "gate $cand q4_1" && continue
    out=$(limit 120 "$BIN/memra-run" gate --backend cuda --model "$M/llama1b-q4_1.gguf" --reference "$ref" "$(plan llama1b q4_1 $cand)" 2>&1)
    rc=$?
    echo "$out" >>"$LOG/gates.log"
    row "gate $cand q4_1" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(echo "$out" | tail -1 | cut -c1-160)"
done
if ! late "cuda vs cpu smol135m q4_1"; then
    out=$(limit 150 "$BIN/memra-run" compare --backend cuda -n 64 --tolerance 1e-2 --model "$M/smol135m-q4_1.gguf" "$(plan smol135m q4_1 smol135m)" 2>&1)
    rc=$?
    echo "$out" >"$LOG/compare.log"
    row "cuda vs cpu smol135m q4_1" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(echo "$out" | tail -1 | sed 's/^compare [^:]*: //' | cut -c1-200)"
fi

bench() { # shape dtype name
    late "bench $3 $2" && return
    [ -f "$M/$1-$2.gguf" ] || wait
    out=$(limit 150 "$BIN/memra-run" bench --backend cuda -n 128 --reps 3 --model "$M/$1-$2.gguf" "$(plan "$1" "$2" "$3")" 2>&1)
    rc=$?
    echo "$out" >>"$LOG/bench.log"
    row "bench $3 $2" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(echo "$out" | tail -1 | sed 's/^[^:]*: cuda, //' | cut -c1-220)"
}
for name in smol135m smol135m-eager smol135m-pp2; do bench smol135m q4_1 $name; done
for name in llama1b llama1b-eager llama1b-pp2; do bench llama1b q4_1 $name; done
wait
echo "8B models written by $(($(date +%s) - t0)) s"
for dtype in q4_1 q8_0 f16; do bench llama8b $dtype llama8b; done
for name in llama8b-eager llama8b-pp2; do bench llama8b q4_1 $name; done
for dtype in q8_0 f16; do bench llama1b $dtype llama1b; bench smol135m $dtype smol135m; done

if ! late "per-kernel llama8b q4_1"; then
    limit 120 bash scripts/gpu-ncu-token.sh llama8b q4_1 64 >"$LOG/ncu-token.txt" 2>&1
    rc=$?
    row "per-kernel llama8b q4_1" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$LOG/ncu-token.txt (its table is printed above this one)"
fi

[ -n "${OUT:-}" ] && tar -czf "$OUT/bench-logs.tar.gz" -C "$LOG" .
echo
echo "total $(($(date +%s) - t0)) s"
[ -f "$LOG/ncu-token.txt" ] && tail -12 "$LOG/ncu-token.txt"
printf '%s\n' "${rows[@]}"
exit $failed
