# Session 7's final GPU run (scratch), one call: the helpers of scripts/gpu.sh, one self-test for
# all suites, then the rows of the prefill, prefill-arch, glm5 and batch suites that fit, and
# llama.cpp's pp512/pp4096 and batched bench of the same files, built while memra runs.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=final7
BUDGET=${1:-330}
logs_in /tmp/memra-final7
stamp name,driver_version,memory.total
build_llamacpp llama-bench llama-batched-bench >"$LOG/llama-build.log" 2>&1 &
build=$!
for s in llama8b:q4_1 llama8b:q8_0 llama8b:f16 llama1b:q4_1; do synth "${s%:*}" "${s#*:}" & done
for s in tiny-qwen3moe tiny-deepseek2 tiny-deepseek2-lite tiny-kimi-linear tiny-glm5-next; do synth $s q8_0 & done
synth tiny-glm5-next f32 &
limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "PASS|FAIL" "$LOG/selftest.log" | grep -v " PASS$" | head -20
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait $(jobs -p | grep -v "^$build$")
prompt=$(for _ in $(seq 13); do printf 'The quick brown fox jumps over the lazy dog. '; done)
short=$(for _ in $(seq 5); do printf 'The quick brown fox jumps over the lazy dog. '; done)

# #14: dense prefill gates (the gemm and collective changes), MoE/MLA/KDA prefill gates
ref=$(plan llama1b q4_1 llama1b-eager)
for cand in llama1b llama1b-tp2 llama1b-pp2-tp2; do
    late "prefill gate $cand q4_1" ||
        gate "prefill gate $cand q4_1" 120 "$M/llama1b-q4_1.gguf" "$ref" "$(plan llama1b q4_1 $cand)" -p "$prompt" -n 8
done
for c in tiny-qwen3moe:tp2 tiny-qwen3moe:tp4 tiny-qwen3moe:ep4 tiny-deepseek2:tp2 tiny-deepseek2-lite:tp2 tiny-kimi-linear:tp2 tiny-kimi-linear:tp4 tiny-kimi-linear:pp2; do
    shape=${c%:*} cand=cuda/${c%:*}-${c#*:}
    late "prefill gate $cand q8_0" ||
        gate "prefill gate $cand q8_0" 120 "$M/$shape-q8_0.gguf" "$(plan $shape q8_0 cuda/$shape-eager)" \
            "$(plan $shape q8_0 $cand)" -p "$short" -n 8
done

# #14: speed (llama.cpp at the end)
for dtype in q4_1 q8_0 f16; do
    late "pp512 llama8b $dtype" ||
        bench "pp512 llama8b $dtype" 100 "$M/llama8b-$dtype.gguf" "$(plan llama8b $dtype llama8b)" --prompt 512 -n 16 --reps 3
done
late "pp512 llama1b q4_1" ||
    bench "pp512 llama1b q4_1" 60 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b)" --prompt 512 -n 16 --reps 3
late "pp512 llama8b-tp2 q4_1 (one device)" ||
    bench "pp512 llama8b-tp2 q4_1 (one device)" 100 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-tp2)" --prompt 512 -n 16 --reps 3
late "ttft 4096 llama8b q4_1" ||
    bench "ttft 4096 llama8b q4_1" 100 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-ctx8k)" --prompt 4096 -n 2 --reps 2
# #13: glm5-next on CUDA, tiny model
for dtype in f32 q8_0; do
    ref=$(plan tiny-glm5-next $dtype cuda/tiny-glm5-next-eager)
    for cand in "" -tp2 -tp4 -ep2 -pp2 -mla-eager; do
        late "gate tiny-glm5-next$cand $dtype" ||
            gate "gate tiny-glm5-next$cand $dtype" 60 "$M/tiny-glm5-next-$dtype.gguf" "$ref" \
                "$(plan tiny-glm5-next $dtype cuda/tiny-glm5-next$cand)"
    done
done
late "cuda vs cpu tiny-glm5-next f32" ||
    against_cpu "cuda vs cpu tiny-glm5-next f32" 1e-3 "$M/tiny-glm5-next-f32.gguf" \
        "$(plan tiny-glm5-next f32 cuda/tiny-glm5-next)" 64
cp "$LOG/compare.log" "$LOG/compare-glm5-f32.log" 2>/dev/null
late "bench tiny-glm5-next q8_0" ||
    bench "bench tiny-glm5-next q8_0" 60 "$M/tiny-glm5-next-q8_0.gguf" "$(plan tiny-glm5-next q8_0 cuda/tiny-glm5-next)" -n 128 --reps 3

# #16: batch gates and throughput
for cand in llama1b-batch8 llama1b-batch8-tp2 llama1b-batch8-pp2; do
    late "batch gate $cand vs llama1b-decode" ||
        gate "batch gate $cand vs llama1b-decode" 150 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b-decode)" \
            "$(plan llama1b q4_1 $cand)" --batch
done
for b in 1 4 16 64; do
    late "batch $b llama8b q4_1" ||
        bench "batch $b llama8b q4_1" 120 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-batch64)" \
            --batch $b --prompt 8 -n 128 --reps 2
done

wait $build
rc=$?
row "llama.cpp build" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/llama-build.log" | cut -c1-120)"
BUDGET=$((BUDGET + 110)) # llama.cpp's rows run once it is built
for model in llama8b-q4_1 llama8b-q8_0 llama8b-f16 llama1b-q4_1; do
    late "llama-bench pp512 $model" || llama_bench "llama-bench pp512 $model" "$M/$model.gguf" -p 512 -n 0
done
late "llama-bench pp4096 llama8b-q4_1" ||
    llama_bench "llama-bench pp4096 llama8b-q4_1" "$M/llama8b-q4_1.gguf" -p 4096 -n 0
if ! late "llama-batched-bench llama8b-q4_1"; then
    out=$(CUDA_VISIBLE_DEVICES=0 limit 200 /tmp/llama-build/bin/llama-batched-bench \
        -m "$M/llama8b-q4_1.gguf" -c 9216 -b 2048 -ub 512 -npp 8 -ntg 128 -npl 1,4,16,64 -ngl 99 -fa on 2>&1)
    rc=$?
    echo "$out" >>"$LOG/llama-batched-bench.txt"
    result "llama-batched-bench llama8b-q4_1" $rc "$out" \
        "$(echo "$out" | grep -E '^\| +8 \| +128 \|' | awk -F'|' '{ printf "B=%d S_TG %s t/s; ", $4, $9 }' | tr -s ' ')"
fi
table
