#!/usr/bin/env bash
# Session 15, call 5: q8_0 prefill on gemm_wg by default (the final tree): self-test, q8_0
# prefill gates, then pp512 q8_0 of memra and of llama.cpp's llama-bench on the same file
# (llama.cpp built from the carried source while the gates run).
source scripts/gpu.sh
SUITE=s15c5
BUDGET=330
logs_in /tmp/memra-s15c5
stamp name,driver_version,memory.total
build_llamacpp llama-bench >"$LOG/llama-build.log" 2>&1 &
build=$!
synth llama1b q8_0 &
s1=$!
synth llama8b q8_0 &
s8=$!
limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^[a-z_0-9]+ " "$LOG/selftest.log" | grep -v " PASS$" | grep -v '^kernel\|^matvec\|^quantize\|^attention\|^ ' | head -20
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait $s1
prompt=$(sentences 13)
for cand in llama1b-tp2 llama1b-pp2-tp2; do
    gate "prefill gate $cand q8_0" 40 "$M/llama1b-q8_0.gguf" "$(plan llama1b q8_0 llama1b-eager)" \
        "$(plan llama1b q8_0 $cand)" -p "$prompt" -n 8
done
wait $s8
bench "pp512 llama8b q8_0" 60 "$M/llama8b-q8_0.gguf" "$(plan llama8b q8_0 llama8b)" --prompt 512 -n 16 --reps 3
llamacpp_built $build
llama_bench "llama-bench pp512 llama8b-q8_0" "$M/llama8b-q8_0.gguf" -p 512 -n 0
table
