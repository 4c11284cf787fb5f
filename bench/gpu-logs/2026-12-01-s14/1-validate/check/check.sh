#!/usr/bin/env bash
# Session 13, last: the review fixes of the in-place rows all-reduce (system-scoped flags, the
# group's block count agreed over its members' devices and the ranks on them): the collective
# alone on device 0,0 and llama1b q4_1 prefill gates TP-2 and PP-2 x TP-2 on one device.
source scripts/gpu.sh
SUITE=check13
BUDGET=80
logs_in /tmp/memra-check13
stamp name,driver_version,memory.total
synth llama1b q4_1 &
s1=$!
out=$(limit 60 "$BIN/cuda_selftest" --collective 0,0 2>&1); rc=$?
echo "$out" > "$LOG/collective.log"
result "collective 0,0" $rc "$out" "$(echo "$out" | tail -4 | tr '\n' ';' | tr -s ' ' | cut -c1-300)"
wait $s1
prompt=$(sentences 13)
ref=$(plan llama1b q4_1 llama1b-eager)
for cand in llama1b-tp2 llama1b-pp2-tp2; do
    late "prefill gate $cand q4_1" ||
        gate "prefill gate $cand q4_1" 40 "$M/llama1b-q4_1.gguf" "$ref" "$(plan llama1b q4_1 $cand)" -p "$prompt" -n 8
done
table
