# Session 9, one GPU (scratch): matvec D (q4_k lanes by chunk length, few-rows f32 kernel, L2
# prefetch a round ahead) against E (D without the prefetch ahead): self-test, tiny glm5 gates,
# GLM-5.3-Flash 4-layer cut decode speed.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s9d
BUDGET=${1:-240}
logs_in "$OUT"
stamp name,driver_version,memory.total
cut=glm-5.3-flash-l4
synth_cut glm-5.3-flash 4 q4_k &
synth tiny-glm5-next q8_0 &
synth llama8b q4_1 &
for v in D E; do
    b=.dev/bin$v
    limit 150 $b/cuda_selftest --bench >"$LOG/selftest-$v.txt" 2>&1
    rc=$?
    grep -E "FAIL" "$LOG/selftest-$v.txt" | head -10
    row "selftest $v" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest-$v.txt" | cut -c1-120)"
done
wait
for v in D E; do
    BIN=.dev/bin$v
    gates_of tiny-glm5-next q8_0 cuda/tiny-glm5-next-eager cuda/tiny-glm5-next-tp2 cuda/tiny-glm5-next-pp2
    bench "bench $cut-gguf q4_k $v" 150 "$M/$cut-q4_k.gguf" "$(plan $cut q4_k cuda/$cut-gguf)" -n 128 --reps 3
    bench "bench llama8b q4_1 $v" 100 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b)" -n 128 --reps 3
done
grep -E "matvec_(q4_k|f32|thin)" "$LOG/selftest-D.txt" | grep -v PASS | head; grep -E "^matvec_(q4_k|thin|f32) " "$LOG/selftest-D.txt" | head -5
for v in D E; do sed -n '/dtype *shape/,/^$/p' "$LOG/selftest-$v.txt" | head -14; done
table
