#!/usr/bin/env bash
# Session 14, final call A: llama.cpp built (llama-bench, llama-batched-bench) while the gates
# run; then prefill speed, memra and llama.cpp's llama-bench on the same files.
source scripts/gpu.sh
SUITE=s14final
BUDGET=470
logs_in /tmp/memra-s14final
stamp name,driver_version,memory.total
build_llamacpp llama-bench llama-batched-bench >"$LOG/llama-build.log" 2>&1 &
build=$!
(synth llama1b q4_1; synth llama1b f16) &
s1=$!
(synth llama8b q4_1; synth llama8b f16; synth llama8b q8_0) &
s8=$!
limit 150 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^[a-z_0-9]+ " "$LOG/selftest.log" | grep -v " PASS$" | grep -v '^kernel\|^gemm_wg\|^matvec\|^quantize\|^attention\|^ ' | head -20
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait $s1
prompt=$(sentences 13)
for dtype in q4_1 f16; do
    gate "prefill gate llama1b-tp2 $dtype" 40 "$M/llama1b-$dtype.gguf" "$(plan llama1b $dtype llama1b-eager)" \
        "$(plan llama1b $dtype llama1b-tp2)" -p "$prompt" -n 8
done
gate "batch gate llama1b-batch8-tp2 vs llama1b-decode" 60 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b-decode)" \
    "$(plan llama1b q4_1 llama1b-batch8-tp2)" --batch
wait $s8
llamacpp_built $build
for dtype in q4_1 q8_0 f16; do
    bench "pp512 llama8b $dtype" 60 "$M/llama8b-$dtype.gguf" "$(plan llama8b $dtype llama8b)" --prompt 512 -n 16 --reps 3
done
bench "pp512 llama8b-tp2 q4_1 (one device)" 60 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-tp2)" \
    --prompt 512 -n 16 --reps 3
bench "pp512 llama1b q4_1" 60 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b)" --prompt 512 -n 16 --reps 3
bench "ttft 4096 llama8b q4_1" 60 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-ctx8k)" --prompt 4096 -n 2 --reps 2
for model in llama8b-q4_1 llama8b-q8_0 llama8b-f16 llama1b-q4_1; do
    late "llama-bench pp512 $model" || llama_bench "llama-bench pp512 $model" "$M/$model.gguf" -p 512 -n 0
done
table
