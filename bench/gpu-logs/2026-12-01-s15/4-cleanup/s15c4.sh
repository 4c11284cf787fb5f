#!/usr/bin/env bash
# Session 15, call 4: the build with gemm_wg's f16 kernels removed (f16 takes gemm_tma only):
# self-test, prefill gates (f16, q4_1, q8_0), a batch gate (joining prompts prefilled), pp512
# f16; q8_0 pp512 with its default mma.sync tiles against gemm_wg128_q8_0 (.dev/memra-run-q8wg,
# the same tree with q8_0 taking the warpgroup tile).
source scripts/gpu.sh
SUITE=s15c4
BUDGET=330
logs_in /tmp/memra-s15c4
stamp name,driver_version,memory.total
(synth llama1b q4_1; synth llama1b f16; synth llama1b q8_0) &
s1=$!
(synth llama8b f16; synth llama8b q8_0) &
s8=$!
limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^[a-z_0-9]+ " "$LOG/selftest.log" | grep -v " PASS$" | grep -v '^kernel\|^matvec\|^quantize\|^attention\|^ ' | head -20
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait $s1
prompt=$(sentences 13)
for dtype in f16 q4_1 q8_0; do
    gate "prefill gate llama1b-tp2 $dtype" 40 "$M/llama1b-$dtype.gguf" "$(plan llama1b $dtype llama1b-eager)" \
        "$(plan llama1b $dtype llama1b-tp2)" -p "$prompt" -n 8
done
gate "prefill gate llama1b-pp2-tp2 f16" 40 "$M/llama1b-f16.gguf" "$(plan llama1b f16 llama1b-eager)" \
    "$(plan llama1b f16 llama1b-pp2-tp2)" -p "$prompt" -n 8
gate "batch gate llama1b-batch8 vs decode" 60 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b-decode)" \
    "$(plan llama1b q4_1 llama1b-batch8)" --batch
wait $s8
bench "pp512 llama8b f16" 60 "$M/llama8b-f16.gguf" "$(plan llama8b f16 llama8b)" --prompt 512 -n 16 --reps 3
p=$(plan llama8b q8_0 llama8b)
bench "pp512 llama8b q8_0 (mma.sync)" 60 "$M/llama8b-q8_0.gguf" "$p" --prompt 512 -n 16 --reps 3
BIN_RUN=$BIN; BIN=.dev-q8; mkdir -p $BIN; cp .dev/memra-run-q8wg $BIN/memra-run
bench "pp512 llama8b q8_0 (gemm_wg)" 60 "$M/llama8b-q8_0.gguf" "$p" --prompt 512 -n 16 --reps 3
BIN=$BIN_RUN
table
