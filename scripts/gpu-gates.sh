#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-build.sh staged the
# binaries in .dev/bin here: writes synthetic models to /tmp, compiles the placements of
# plans/synthetic/ for them, then proves the CUDA backend:
#   - gates: every plan bit-identical to the 1-rank eager CUDA run (serial and pipelined arms,
#     16 generated tokens), llama1b-shaped q8_0 and q4_1: graphs, PP-2, PP-3 uneven, PP-5,
#     TP-2, TP-4, PP-2 x TP-2, all ranks on device 0; llama8b-shaped q4_1: TP-2, TP-4, PP-2;
#   - soak: the pipelined PP-4 gate 100 times in one process, counting mismatching runs;
#   - CUDA against the CPU backend on a smol135m-shaped model, 64 greedy steps;
#   - compute-sanitizer memcheck (PP-4, 8 tokens) and racecheck (PP-2, 3 tokens), graphs;
#   - decode speed of the llama1b-shaped q4_1 plans.
# Usage: gpu-gates.sh [SECONDS]: a section that would start after SECONDS (default 540) is
# skipped and its rows say so, so a lease that is short of device time still gets its table.
# Logs go to /tmp/memra-gpu (and, packed, to $OUT/gates-logs.tar.gz); the last lines printed
# are the result table. Every command has a time limit. Exits non-zero if any row failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${BIN:-.dev/bin}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
LOG=/tmp/memra-gpu
M=/tmp/memra-models
P=/tmp/memra-plans
mkdir -p "$LOG" "$M" models
date -u +%Y-%m-%dT%H:%MZ | tee "$LOG/date.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOG/gpu.txt"

rows=()
failed=0
row() { # name, status, detail
    rows+=("$(printf '%-32s %-4s %s' "$1" "$2" "$3")")
    [ "$2" = ok ] || failed=1
}
limit() { timeout --kill-after=5 "$@"; }
BUDGET="${1:-540}"
late() { # section name: true (and a row) when the budget is spent
    if [ $(($(date +%s) - t0)) -ge "$BUDGET" ]; then
        row "$1" skip "device-time budget of ${BUDGET}s spent"
        return 0
    fi
    return 1
}
# compile PLACEMENT... for the model DTYPE of SHAPE into $P/DTYPE/
compile() {
    local shape=$1 dtype=$2
    shift 2
    ln -sf "$M/$shape-$dtype.gguf" "models/$shape.gguf"
    mkdir -p "$P/$dtype"
    for name in "$@"; do
        "$BIN/memra-compile" -o "$P/$dtype/$name.plan.toml" "plans/synthetic/$name.toml" >/dev/null ||
            row "compile $name $dtype" FAIL "see $LOG"
    done
}

t0=$(date +%s)
"$BIN/memra-synth" --shape smol135m --dtype q8_0 -o "$M/smol135m-q8_0.gguf" 2>"$LOG/synth-smol.log" &
"$BIN/memra-synth" --shape llama1b --dtype q8_0 -o "$M/llama1b-q8_0.gguf" 2>"$LOG/synth-l1-q8.log" &
"$BIN/memra-synth" --shape llama1b --dtype q4_1 -o "$M/llama1b-q4_1.gguf" 2>"$LOG/synth-l1-q41.log" &
wait
# the 8B shape is written while the first gates run
"$BIN/memra-synth" --shape llama8b --dtype q4_1 -o "$M/llama8b-q4_1.gguf" 2>"$LOG/synth-l8-q41.log" &
synth8b=$!
echo "models written in $(($(date +%s) - t0)) s"

LLAMA=(llama1b-eager llama1b llama1b-pp2 llama1b-pp3 llama1b-pp5 llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2)
gates() { # shape dtype placement... (the first is the reference)
    local shape=$1 dtype=$2
    shift 2
    local names=("$@")
    compile "$shape" "$dtype" "${names[@]}"
    for cand in "${names[@]:1}"; do
        late "gate $cand $dtype" && continue
        t=$(date +%s%N)
        out=$(limit 150 "$BIN/memra-run" gate --backend cuda --model "$M/$shape-$dtype.gguf" \
            --reference "$P/$dtype/${names[0]}.plan.toml" "$P/$dtype/$cand.plan.toml" 2>&1)
        rc=$?
        echo "$out" >>"$LOG/gates.log"
        dt=$((($(date +%s%N) - t) / 100000000))
        dt="$((dt / 10)).$((dt % 10))"
        summary=$(echo "$out" | grep -oE "\(serial.*logits\)|differs.*" | head -1)
        if [ $rc -eq 0 ]; then
            row "gate $cand $dtype" ok "$summary ${dt}s"
        else
            row "gate $cand $dtype" FAIL "exit $rc ${dt}s: $(echo "$out" | tail -1 | cut -c1-300)"
        fi
    done
}
soak() {
    out=$(limit 200 "$BIN/memra-run" gate --backend cuda --repeat 100 --model "$M/smol135m-q8_0.gguf" \
        --reference "$P/q8_0/smol135m-eager.plan.toml" "$P/q8_0/smol135m-pp4.plan.toml" 2>&1)
    rc=$?
    echo "$out" >"$LOG/soak.log"
    if [ $rc -eq 0 ]; then
        row "soak smol135m-pp4 x100" ok "$(echo "$out" | grep -oE '[0-9]+ of [0-9]+ runs differed')"
    else
        row "soak smol135m-pp4 x100" FAIL "exit $rc: $(echo "$out" | tail -1 | cut -c1-300)"
    fi
}

against_cpu() {
    out=$(limit 150 "$BIN/memra-run" compare --backend cuda -n 64 --tolerance 1e-3 \
        --model "$M/smol135m-q8_0.gguf" "$P/q8_0/smol135m.plan.toml" 2>&1)
    rc=$?
    echo "$out" >"$LOG/compare.log"
    if [ $rc -eq 0 ]; then
        row "cuda vs cpu smol135m q8_0" ok "$(echo "$out" | tail -1 | sed 's/^compare [^:]*: //')"
    else
        row "cuda vs cpu smol135m q8_0" FAIL "exit $rc: $(echo "$out" | tail -1 | cut -c1-300)"
    fi
}

sanitize() { # tool plan tokens (under racecheck a PP-4 decode of 8 tokens had its target killed
    # by signal 9 twice, cause not found, with 0 hazards reported; a PP-2 decode of 3 completes)
    limit 240 compute-sanitizer --tool "$1" --error-exitcode 3 "$BIN/memra-run" generate --backend cuda \
        --temp 0 -n "$3" -p "hello" --model "$M/smol135m-q8_0.gguf" "$P/q8_0/$2.plan.toml" \
        >"$LOG/$1.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        row "sanitizer $1 $2 -n $3" ok "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$1.log" | head -1)"
    else
        row "sanitizer $1 $2 -n $3" FAIL "exit $rc: $(grep -E 'SUMMARY|rror' "$LOG/$1.log" | head -2 | tr '\n' ' ')"
    fi
}

speed() { # plan
    out=$(limit 100 "$BIN/memra-run" bench --backend cuda -n 128 --reps 3 --model "$M/llama1b-q4_1.gguf" \
        "$P/q4_1/$1.plan.toml" 2>&1)
    rc=$?
    echo "$out" >>"$LOG/bench.log"
    if [ $rc -eq 0 ]; then
        row "bench $1 q4_1" ok "$(echo "$out" | tail -1 | sed 's/^[^:]*: cuda, //')"
    else
        row "bench $1 q4_1" FAIL "exit $rc: $(echo "$out" | tail -1 | cut -c1-300)"
    fi
}

# most important first: what is skipped when the budget runs out comes last
gates llama1b q8_0 "${LLAMA[@]}"
compile smol135m q8_0 smol135m smol135m-eager smol135m-pp2 smol135m-pp4
late "soak smol135m-pp4 x100" || soak
late "cuda vs cpu smol135m q8_0" || against_cpu
gates llama1b q4_1 "${LLAMA[@]}"
wait $synth8b
gates llama8b q4_1 llama8b-eager llama8b-tp2 llama8b-tp4 llama8b-pp2
for cand in llama1b-eager llama1b llama1b-pp2 llama1b-tp2; do
    late "bench $cand q4_1" || speed "$cand"
done
late "sanitizer memcheck" || sanitize memcheck smol135m-pp4 8
late "sanitizer racecheck" || sanitize racecheck smol135m-pp2 3

[ -n "${OUT:-}" ] && tar -czf "$OUT/gates-logs.tar.gz" -C "$LOG" .
echo
echo "total $(($(date +%s) - t0)) s"
printf '%s\n' "${rows[@]}"
exit $failed
