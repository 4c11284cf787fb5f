#!/usr/bin/env bash
# Session 14, call 3: warpgroup GEMMs (chunk walk, 6 stages, q8_0/q4_x dequantized) and the
# batched decode's graphs per bucket (helper's change), merged.
source scripts/gpu.sh
SUITE=s14c3
BUDGET=420
logs_in /tmp/memra-s14c3
stamp name,driver_version,memory.total
synth llama1b q4_1 &
s1=$!
(synth llama8b q4_1; synth llama8b f16; synth llama8b q8_0) &
s8=$!
limit 200 "$BIN/cuda_selftest" --prefill-bench >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^[a-z_0-9]+ " "$LOG/selftest.log" | grep -v " PASS$" | grep -v '^kernel\|^gemm_wg\|^ ' | head -20
grep -E "pad rows" "$LOG/selftest.log" | head -3
sed -n '/prefill products over/,/^$/p' "$LOG/selftest.log"
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait $s1
prompt=$(sentences 13)
ref=$(plan llama1b q4_1 llama1b-eager)
for cand in llama1b-tp2 llama1b-pp2-tp2; do
    gate "prefill gate $cand q4_1" 40 "$M/llama1b-q4_1.gguf" "$ref" "$(plan llama1b q4_1 $cand)" -p "$prompt" -n 8
done
for cand in llama1b-pp2 llama1b-pp3 llama1b-pp2-tp2; do
    gate "decode gate $cand q4_1" 60 "$M/llama1b-q4_1.gguf" "$ref" "$(plan llama1b q4_1 $cand)"
done
for cand in llama1b-batch8 llama1b-batch8-tp2 llama1b-batch8-pp2; do
    out=$(plan llama1b q4_1 $cand)
    gate "batch gate $cand vs llama1b-decode" 100 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b-decode)" "$out" --batch
done
wait $s8
gate "batch gate llama8b-batch64 vs llama8b-decode" 150 "$M/llama8b-q4_1.gguf" \
    "$(plan llama8b q4_1 llama8b-decode)" "$(plan llama8b q4_1 llama8b-batch64)" --batch
grep -h "arm: cuda graphs" "$LOG/gates.log"
for dtype in f16 q8_0 q4_1; do
    bench "pp512 llama8b $dtype" 100 "$M/llama8b-$dtype.gguf" "$(plan llama8b $dtype llama8b)" --prompt 512 -n 16 --reps 3
done
for b in 1 4 16 64; do
    bench "batch $b llama8b q4_1" 100 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-batch64)" \
        --batch $b --prompt 8 -n 128 --reps 2
done
grep -h "^cuda graphs" "$LOG/bench.log"
table
