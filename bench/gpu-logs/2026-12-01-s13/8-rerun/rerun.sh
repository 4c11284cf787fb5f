#!/usr/bin/env bash
# Session 13: the final rows again with the machine otherwise idle (the final call's memra rows
# ran while llama.cpp compiled on the host's cores); llama.cpp's binary from that call where the
# machine is still the same one.
ROOT=$PWD
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT"
SUITE=rerun13
BUDGET=170
logs_in /tmp/memra-rerun13
stamp name,driver_version,memory.total
[ -f "$M/llama8b-q4_1.gguf" ] || synth llama8b q4_1
for b in 1 4 16 64; do
    bench "batch $b llama8b q4_1" 60 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-batch64)" \
        --batch $b --prompt 8 -n 128 --reps 2
done
if [ -x /tmp/llama-build/bin/llama-batched-bench ]; then
    out=$(CUDA_VISIBLE_DEVICES=0 limit 90 /tmp/llama-build/bin/llama-batched-bench \
        -m "$M/llama8b-q4_1.gguf" -c 9216 -b 2048 -ub 512 -npp 8 -ntg 128 -npl 1,4,16,64 -ngl 99 -fa on 2>&1)
    rc=$?
    echo "$out" >"$OUT/llama-batched-bench.txt"
    result "llama-batched-bench llama8b-q4_1" $rc "$out" \
        "$(echo "$out" | grep -E '^\| +8 \| +128 \|' | awk -F'|' '{ printf "B=%d S_TG %s t/s; ", $4, $9 }' | tr -s ' ')"
else
    row "llama.cpp" skip "a fresh machine: no llama.cpp build from the final call"
fi
table
