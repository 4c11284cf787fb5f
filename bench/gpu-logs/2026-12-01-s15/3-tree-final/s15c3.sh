#!/usr/bin/env bash
# Session 15, call 3: the row-parallel products' chunk tree on chip (gemm_tma128_tree_f16);
# self-test, products alone, prefill gates, then prefill speed of memra and llama.cpp's
# llama-bench on the same files (llama.cpp built from the carried source while the gates run).
source scripts/gpu.sh
SUITE=s15c3
BUDGET=500
logs_in /tmp/memra-s15c3
stamp name,driver_version,memory.total
build_llamacpp llama-bench >"$LOG/llama-build.log" 2>&1 &
build=$!
(synth llama1b q4_1; synth llama1b f16) &
s1=$!
(synth llama8b f16; synth llama8b q4_1; synth llama8b q8_0) &
s8=$!
limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^[a-z_0-9]+ " "$LOG/selftest.log" | grep -v " PASS$" | grep -v '^kernel\|^matvec\|^quantize\|^attention\|^ ' | head -20
grep -E "tree in Tma" "$LOG/selftest.log" | head -8
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
limit 150 "$BIN/cuda_selftest" --prefill-bench >"$LOG/prefill-bench.log" 2>&1
row "prefill-bench" "$(ok_or_fail $?)" "$(grep -c TFLOP "$LOG/prefill-bench.log") rows"
grep "TFLOP" "$LOG/prefill-bench.log" | grep -E "^(f16|q4_1|q8_0)"
wait $s1
prompt=$(sentences 13)
for dtype in f16 q4_1; do
    for cand in llama1b-tp2 llama1b-tp4 llama1b-pp2 llama1b-pp2-tp2; do
        gate "prefill gate $cand $dtype" 40 "$M/llama1b-$dtype.gguf" "$(plan llama1b $dtype llama1b-eager)" \
            "$(plan llama1b $dtype $cand)" -p "$prompt" -n 8
    done
done
wait $s8
llamacpp_built $build
for dtype in f16 q4_1 q8_0; do
    bench "pp512 llama8b $dtype" 60 "$M/llama8b-$dtype.gguf" "$(plan llama8b $dtype llama8b)" --prompt 512 -n 16 --reps 3
done
bench "pp512 llama8b-tp2 q4_1 (one device)" 60 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-tp2)" \
    --prompt 512 -n 16 --reps 3
bench "pp512 llama8b-tp2 f16 (one device)" 60 "$M/llama8b-f16.gguf" "$(plan llama8b f16 llama8b-tp2)" \
    --prompt 512 -n 16 --reps 3
bench "pp512 llama1b q4_1" 60 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b)" --prompt 512 -n 16 --reps 3
bench "ttft 4096 llama8b q4_1" 60 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-ctx8k)" --prompt 4096 -n 2 --reps 2
for model in llama8b-q4_1 llama8b-q8_0 llama8b-f16 llama1b-q4_1; do
    late "llama-bench pp512 $model" || llama_bench "llama-bench pp512 $model" "$M/$model.gguf" -p 512 -n 0
done
table
