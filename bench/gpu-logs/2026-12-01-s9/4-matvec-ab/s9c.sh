# Session 9, one GPU (scratch): matvec A (L2 prefetch a round ahead, float lanes) against B (A
# plus q4_k with eight lanes per super-block): self-test with the matvec bench, tiny glm5
# gates, GLM-5.3-Flash 4-layer cut decode speed; Nsight Compute per kernel of B.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s9c
BUDGET=${1:-300}
logs_in "$OUT"
stamp name,driver_version,memory.total
cut=glm-5.3-flash-l4
synth_cut glm-5.3-flash 4 q4_k &
sl4=$!
synth tiny-glm5-next q8_0 &
for v in A B; do
    b=.dev/bin; [ $v = B ] && b=.dev/binB
    limit 150 $b/cuda_selftest --bench >"$LOG/selftest-$v.log" 2>&1
    rc=$?
    grep -E "FAIL" "$LOG/selftest-$v.log" | head -10
    row "selftest $v" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest-$v.log" | cut -c1-120)"
done
wait
for v in A B; do
    BIN=.dev/bin; [ $v = B ] && BIN=.dev/binB
    gates_of tiny-glm5-next q8_0 cuda/tiny-glm5-next-eager cuda/tiny-glm5-next cuda/tiny-glm5-next-tp2 cuda/tiny-glm5-next-pp2
    bench "bench $cut-gguf q4_k $v" 150 "$M/$cut-q4_k.gguf" "$(plan $cut q4_k cuda/$cut-gguf)" -n 128 --reps 3
done
BIN=.dev/binB
t=$(date +%s)
BIN=.dev/binB limit "$(capped 120)" bash scripts/gpu.sh ncu-token $cut q4_k 6 cuda/$cut-gguf >"$LOG/ncu-token.txt" 2>&1
row "ncu-token $cut q4_k B" "$(ok_or_fail $?)" "$(tail -1 "$LOG/ncu-token.txt") [$(( $(date +%s) - t )) s]"
for v in A B; do sed -n '/bandwidth\|GB\/s/p' "$LOG/selftest-$v.log" | grep -iE "q4_k|f32|dtype|kernel" | head -12; done
tail -22 "$LOG/ncu-token.txt"
table
