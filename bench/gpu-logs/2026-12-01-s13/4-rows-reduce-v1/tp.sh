#!/usr/bin/env bash
# Session 13: the shared-device rows all-reduce (members read each other's parts in place).
# The helpers of scripts/gpu.sh, then: the collective alone on device 0,0 (bit check + times),
# llama1b q4_1 prefill gates over the TP plans on one device, the llama1b TP-2 batch gate,
# llama8b q4_1 pp512 one rank and TP-2 on one device.
ROOT=$PWD
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT"
SUITE=tp13
BUDGET=420
logs_in /tmp/memra-tp13
stamp name,driver_version,memory.total
synth llama1b q4_1 &
s1=$!
synth llama8b q4_1 &
s8=$!
out=$(limit 120 "$BIN/cuda_selftest" --collective 0,0 2>&1); rc=$?
echo "$out" > "$LOG/collective.log"; echo "$out" | tail -8
result "collective 0,0" $rc "$out" "$(echo "$out" | tail -4 | tr '\n' ';' | tr -s ' ' | cut -c1-300)"
wait $s1
prompt=$(sentences 13)
ref=$(plan llama1b q4_1 llama1b-eager)
for cand in llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2; do
    gate "prefill gate $cand q4_1" 150 "$M/llama1b-q4_1.gguf" "$ref" "$(plan llama1b q4_1 $cand)" -p "$prompt" -n 8
done
gate "batch gate llama1b-batch8-tp2 vs llama1b-decode" 150 "$M/llama1b-q4_1.gguf" \
    "$(plan llama1b q4_1 llama1b-decode)" "$(plan llama1b q4_1 llama1b-batch8-tp2)" --batch
wait $s8
bench "pp512 llama8b q4_1" 150 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b)" --prompt 512 -n 16 --reps 3
bench "pp512 llama8b-tp2 q4_1 (one device)" 150 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-tp2)" --prompt 512 -n 16 --reps 3
table
