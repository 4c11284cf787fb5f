# Session 9, one GPU (scratch): GLM-5.3-Flash 4-layer cut from one file (memra-synth
# --shape glm-5.3-flash --layers 4 --dtype q4_k): memra bench, Nsight Compute time per kernel
# of one decode step, llama.cpp's llama-bench on the same file; tiny-glm5-next q8_0 both.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s9b
BUDGET=${1:-420}
logs_in "$OUT"
stamp name,driver_version,memory.total
build_llamacpp llama-bench >"$LOG/llama-build.log" 2>&1 &
build=$!
synth tiny-glm5-next q8_0
t=$(date +%s); synth_cut glm-5.3-flash 4 q4_k; echo "synth l4 $(( $(date +%s) - t )) s"
cut=glm-5.3-flash-l4
bench "bench $cut-gguf q4_k" 150 "$M/$cut-q4_k.gguf" "$(plan $cut q4_k cuda/$cut-gguf)" -n 128 --reps 3
memory_check "memory $cut-gguf q4_k"
bench "bench tiny-glm5-next q8_0" 100 "$M/tiny-glm5-next-q8_0.gguf" "$(plan tiny-glm5-next q8_0 cuda/tiny-glm5-next)" -n 128 --reps 3
t=$(date +%s)
limit "$(capped 200)" bash scripts/gpu.sh ncu-token $cut q4_k 6 cuda/$cut-gguf >"$LOG/ncu-token.txt" 2>&1
row "ncu-token $cut q4_k" "$(ok_or_fail $?)" "$(tail -1 "$LOG/ncu-token.txt") [$(( $(date +%s) - t )) s]"
llamacpp_built $build
late "llama-bench $cut q4_k" || llama_bench "llama-bench $cut q4_k" "$M/$cut-q4_k.gguf"
late "llama-bench tiny-glm5-next q8_0" || llama_bench "llama-bench tiny-glm5-next q8_0" "$M/tiny-glm5-next-q8_0.gguf"
cat "$LOG/ncu-token.txt" | tail -60
table
