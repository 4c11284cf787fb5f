# Session 9's final two-GPU run (scratch): GLM-5.3-Flash at all 45 layers with synthetic weights
# drawn on the devices, PP-2 and TP-2 decode speed and gates against the PP-2 eager run; then
# the 4-layer cut from one file and tiny-glm5-next, memra against llama.cpp's llama-bench.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=x2f
BUDGET=${1:-330}
logs_in "$OUT"
stamp name,driver_version,memory.total
cut=glm-5.3-flash-l4
if [ "${ONLY45:-}" != 1 ]; then
    build_llamacpp llama-bench >"$LOG/llama-build.log" 2>&1 &
    build=$!
    synth_cut glm-5.3-flash 4 q4_k &
    sl4=$!
    synth tiny-glm5-next q8_0 &
fi
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
ref=$(config_plan cuda/glm-5.3-flash-pp2-eager)
for cand in glm-5.3-flash-pp2 glm-5.3-flash-tp2; do
    late "bench $cand synthetic" ||
        bench "bench $cand synthetic" 120 "" "$(config_plan cuda/$cand)" -n 128 --reps 3 --weights synthetic
done
for cand in glm-5.3-flash-tp2 glm-5.3-flash-pp2; do
    late "gate $cand synthetic" ||
        gate "gate $cand synthetic" 150 "" "$ref" "$(config_plan cuda/$cand)" \
            --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
done
fi
[ "${ONLY45:-}" = 1 ] && table
wait $sl4
bench "bench $cut-gguf q4_k" 120 "$M/$cut-q4_k.gguf" "$(plan $cut q4_k cuda/$cut-gguf)" -n 128 --reps 3
memory_check "memory $cut-gguf q4_k"
bench "bench tiny-glm5-next q8_0" 100 "$M/tiny-glm5-next-q8_0.gguf" "$(plan tiny-glm5-next q8_0 cuda/tiny-glm5-next)" -n 128 --reps 3
llamacpp_built $build
late "llama-bench $cut q4_k" || llama_bench "llama-bench $cut q4_k" "$M/$cut-q4_k.gguf"
late "llama-bench tiny-glm5-next q8_0" || llama_bench "llama-bench tiny-glm5-next q8_0" "$M/tiny-glm5-next-q8_0.gguf"
table
