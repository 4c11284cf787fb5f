#!/usr/bin/env bash
# Session 14, call 2: the warpgroup (wgmma) f16 GEMM: self-test (every tile's bits against
# tiles of 64 rows, accuracy per tile), the prefill products per tile, llama8b f16 pp512.
source scripts/gpu.sh
SUITE=wg1
BUDGET=300
logs_in /tmp/memra-wg1
stamp name,driver_version,memory.total
synth llama8b f16 &
s1=$!
limit 200 "$BIN/cuda_selftest" --prefill-bench >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^gemm_" "$LOG/selftest.log" | grep -v " PASS$" | head -30
sed -n '/prefill products over/,/^$/p' "$LOG/selftest.log"
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait $s1
bench "pp512 llama8b f16" 150 "$M/llama8b-f16.gguf" "$(plan llama8b f16 llama8b)" --prompt 512 -n 16 --reps 3
table
