#!/usr/bin/env bash
# Runs on a machine with 2 GPUs, from the repository root, after the binaries were staged in
# .dev/bin: tensor parallelism across two devices.
#   - the all-reduce alone (cuda_selftest --collective): two members on devices 0,1 and on 0,0;
#   - gates against the 1-rank eager run, llama1b-shaped q8_0: TP-2 and PP-2 across 0,1 and
#     TP-2 on device 0, every logit bit, both arms;
#   - llama8b-shaped decode speed for DTYPES (default q4_1): one GPU, TP-2 and PP-2 on 0,1.
# Logs go to /tmp/memra-tp (packed into $OUT/tp-logs.tar.gz); the last lines are the table.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${BIN:-.dev/bin}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
LOG=/tmp/memra-tp
M=/tmp/memra-models
P=/tmp/memra-plans-tp
DTYPES="${DTYPES:-q4_1}"
mkdir -p "$LOG" "$M" "$P" models
date -u +%Y-%m-%dT%H:%MZ | tee "$LOG/date.txt"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$LOG/gpu.txt"
nvidia-smi topo -m >"$LOG/topo.txt" 2>&1

rows=()
failed=0
row() { # name, status, detail
    rows+=("$(printf '%-30s %-4s %s' "$1" "$2" "$3")")
    [ "$2" = ok ] || failed=1
}
limit() { timeout --kill-after=5 "$@"; }
compile() { # SHAPE DTYPE PLACEMENT... (paths under plans/synthetic)
    local shape=$1 dtype=$2
    shift 2
    ln -sf "$M/$shape-$dtype.gguf" "models/$shape.gguf"
    mkdir -p "$P/$dtype"
    for path in "$@"; do
        "$BIN/memra-compile" -o "$P/$dtype/$(basename "$path").plan.toml" "plans/synthetic/$path.toml" \
            >/dev/null 2>>"$LOG/compile.log" || row "compile $path $dtype" FAIL "see compile.log"
    done
}

for pair in 0,1 0,0; do
    out=$(limit 120 "$BIN/cuda_selftest" --collective "$pair" 2>&1)
    rc=$?
    echo "$out" | tee -a "$LOG/collective.log"
    if [ $rc -eq 0 ]; then
        row "all-reduce $pair" ok "$(echo "$out" | grep ' 4 KiB\| 16 KiB' | head -1 | sed 's/^ *//')"
    else
        row "all-reduce $pair" FAIL "exit $rc: $(echo "$out" | tail -1)"
    fi
done

"$BIN/memra-synth" --shape llama1b --dtype q8_0 -o "$M/llama1b-q8_0.gguf" 2>"$LOG/synth-l1.log"
compile llama1b q8_0 llama1b-eager llama1b-tp2 multi/llama1b-tp2 multi/llama1b-pp2
for cand in llama1b-tp2 multi/llama1b-tp2 multi/llama1b-pp2; do
    out=$(limit 200 "$BIN/memra-run" gate --backend cuda --model "$M/llama1b-q8_0.gguf" \
        --reference "$P/q8_0/llama1b-eager.plan.toml" "$P/q8_0/$(basename "$cand").plan.toml" 2>&1)
    rc=$?
    echo "$out" >>"$LOG/gates.log"
    if [ $rc -eq 0 ]; then
        row "gate $cand q8_0" ok "$(echo "$out" | grep -oE '\(serial.*logits\)')"
    else
        row "gate $cand q8_0" FAIL "exit $rc: $(echo "$out" | tail -1 | cut -c1-300)"
    fi
done

for dtype in $DTYPES; do
    "$BIN/memra-synth" --shape llama8b --dtype "$dtype" -o "$M/llama8b-$dtype.gguf" 2>"$LOG/synth-l8-$dtype.log"
    compile llama8b "$dtype" multi/llama8b multi/llama8b-tp2 multi/llama8b-pp2
    for cand in llama8b llama8b-tp2 llama8b-pp2; do
        out=$(limit 200 "$BIN/memra-run" bench --backend cuda -n 128 --reps 3 \
            --model "$M/llama8b-$dtype.gguf" "$P/$dtype/$cand.plan.toml" 2>&1)
        rc=$?
        echo "$out" >>"$LOG/bench.log"
        if [ $rc -eq 0 ]; then
            row "bench $cand $dtype" ok "$(echo "$out" | tail -1 | sed 's/^[^:]*: cuda, //')"
        else
            row "bench $cand $dtype" FAIL "exit $rc: $(echo "$out" | tail -1 | cut -c1-300)"
        fi
    done
    rm -f "$M/llama8b-$dtype.gguf"
done

[ -n "${OUT:-}" ] && tar -czf "$OUT/tp-logs.tar.gz" -C "$LOG" .
echo
printf '%s\n' "${rows[@]}"
exit $failed
