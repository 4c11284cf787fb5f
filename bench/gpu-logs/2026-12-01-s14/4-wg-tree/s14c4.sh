#!/usr/bin/env bash
# Session 14, call 4: warpgroup GEMMs with the chunks' tree added in the kernel (gemm_tree),
# float2 stores, 4 against 6 stages; f16 and q4_1 prefill gates across plans.
source scripts/gpu.sh
SUITE=s14c4
BUDGET=300
logs_in /tmp/memra-s14c4
stamp name,driver_version,memory.total
(synth llama1b q4_1; synth llama1b f16) &
s1=$!
(synth llama8b f16; synth llama8b q4_1) &
s8=$!
limit 200 "$BIN/cuda_selftest" --prefill-bench >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^gemm_" "$LOG/selftest.log" | grep -v " PASS$" | head -20
grep -c "tree in" "$LOG/selftest.log"
sed -n '/prefill products over/,/^$/p' "$LOG/selftest.log"
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait $s1
prompt=$(sentences 13)
for dtype in q4_1 f16; do
    ref=$(plan llama1b $dtype llama1b-eager)
    for cand in llama1b-tp2 llama1b-pp2-tp2 llama1b-tp4; do
        gate "prefill gate $cand $dtype" 40 "$M/llama1b-$dtype.gguf" "$ref" "$(plan llama1b $dtype $cand)" -p "$prompt" -n 8
    done
done
wait $s8
for dtype in f16 q4_1; do
    bench "pp512 llama8b $dtype" 100 "$M/llama8b-$dtype.gguf" "$(plan llama8b $dtype llama8b)" --prompt 512 -n 16 --reps 3
done
table
