#!/usr/bin/env bash
# Session 14, final call B (on the machine of call A): batched decode throughput, memra with
# graphs per bucket and llama.cpp's llama-batched-bench from call A's build, same file.
source scripts/gpu.sh
SUITE=s14batch
BUDGET=220
logs_in /tmp/memra-s14batch
stamp name,driver_version,memory.total
[ -f "$M/llama8b-q4_1.gguf" ] || synth llama8b q4_1
for b in 1 4 16 64; do
    bench "batch $b llama8b q4_1" 60 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-batch64)" \
        --batch $b --prompt 8 -n 128 --reps 2
done
grep -h "^cuda graphs" "$LOG/bench.log"
if [ -x /tmp/llama-build/bin/llama-batched-bench ]; then
    out=$(CUDA_VISIBLE_DEVICES=0 limit 120 /tmp/llama-build/bin/llama-batched-bench \
        -m "$M/llama8b-q4_1.gguf" -c 9216 -b 2048 -ub 512 -npp 8 -ntg 128 -npl 1,4,16,64 -ngl 99 -fa on 2>&1)
    rc=$?
    echo "$out" >"$LOG/llama-batched-bench.txt"
    result "llama-batched-bench llama8b-q4_1" $rc "$out" \
        "$(echo "$out" | grep -E '^\| +8 \| +128 \|' | awk -F'|' '{ printf "B=%d S_TG %s t/s; ", $4, $9 }' | tr -s ' ')"
else
    row "llama.cpp" skip "a fresh machine: no llama.cpp build from call A"
fi
table
