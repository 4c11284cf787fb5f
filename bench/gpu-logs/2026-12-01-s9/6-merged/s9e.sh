# Session 9, one GPU (scratch): the merged tree (matvec: q4_k lanes by chunk length, few-rows
# f32 kernel; dsa/mhc/kda kernels restructured): smoke, tiny glm5 PP-4 soak, kimi-linear gates,
# then the GLM-5.3-Flash 4-layer cut's speed and per-kernel time.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s9e
BUDGET=${1:-200}
logs_in "$OUT/extra"
cut=glm-5.3-flash-l4
synth_cut glm-5.3-flash 4 q4_k &
sl4=$!
mkdir -p "$OUT/smoke"
OUT=$OUT/smoke bash scripts/gpu.sh smoke 120 > "$LOG/smoke.txt" 2>&1
tail -22 "$LOG/smoke.txt"
synth tiny-kimi-linear q8_0
gates_of tiny-kimi-linear q8_0 cuda/tiny-kimi-linear-eager cuda/tiny-kimi-linear cuda/tiny-kimi-linear-tp2 cuda/tiny-kimi-linear-pp2 cuda/tiny-kimi-linear-mla-eager
gate "soak tiny-glm5-next-pp4 q8_0 x100" 120 "$M/tiny-glm5-next-q8_0.gguf" "$(plan tiny-glm5-next q8_0 cuda/tiny-glm5-next-eager)" \
    "$(plan tiny-glm5-next q8_0 cuda/tiny-glm5-next-pp4)" --repeat 100
wait $sl4
bench "bench $cut-gguf q4_k" 150 "$M/$cut-q4_k.gguf" "$(plan $cut q4_k cuda/$cut-gguf)" -n 128 --reps 3
t=$(date +%s)
limit "$(capped 100)" bash scripts/gpu.sh ncu-token $cut q4_k 6 cuda/$cut-gguf >"$LOG/ncu-token.txt" 2>&1
row "ncu-token $cut q4_k" "$(ok_or_fail $?)" "$(tail -1 "$LOG/ncu-token.txt") [$(( $(date +%s) - t )) s]"
tail -20 "$LOG/ncu-token.txt"
table
