#!/usr/bin/env bash
# Session 13 final: llama8b q4_1 decode (one sequence, graphs) and bench --batch 1/4/16/64 on the
# 64-slot plan, then llama.cpp's llama-batched-bench on the same file (built here from the
# carried .llama/llama.cpp while memra runs), as suite_batch's rows without its self-test and gates.
ROOT=$PWD
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT"
SUITE=final13
BUDGET=400
logs_in /tmp/memra-final13
stamp name,driver_version,memory.total
build_llamacpp llama-batched-bench >"$LOG/llama-build.log" 2>&1 &
build=$!
synth llama8b q4_1
bench "decode llama8b q4_1 one sequence" 100 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b)" -n 128 --reps 3
for b in 1 4 16 64; do
    bench "batch $b llama8b q4_1" 200 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-batch64)" \
        --batch $b --prompt 8 -n 128 --reps 2
done
memory_check "memory llama8b-batch64 q4_1"
llamacpp_built $build
out=$(CUDA_VISIBLE_DEVICES=0 limit 200 /tmp/llama-build/bin/llama-batched-bench \
    -m "$M/llama8b-q4_1.gguf" -c 9216 -b 2048 -ub 512 -npp 8 -ntg 128 -npl 1,4,16,64 \
    -ngl 99 -fa on 2>&1)
rc=$?
echo "$out" >>"$LOG/llama-batched-bench.txt"
result "llama-batched-bench llama8b-q4_1" $rc "$out" \
    "$(echo "$out" | grep -E '^\| +8 \| +128 \|' | awk -F'|' '{ printf "B=%d S_TG %s t/s; ", $4, $9 }' | tr -s ' ')"
cp "$LOG/llama-batched-bench.txt" "$OUT/" 2>/dev/null
table
