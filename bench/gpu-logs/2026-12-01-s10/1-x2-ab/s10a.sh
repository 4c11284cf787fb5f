# Session 10's first two-GPU call (scratch): self-tests of main (69d61ce), planar-q4k (P) and
# mhc-fast (M); the 4-layer cut's speed with each; GLM-5.3-Flash 45 layers PP-2/TP-2 speed and
# gates with main's kernels, then PP-2 speed with P and M.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s10a
BUDGET=${1:-480}
logs_in "$OUT"
stamp name,driver_version,memory.total
st() { # variant gpu
    local b=.dev/bin$1
    [ "$1" = main ] && b=.dev/bin
    CUDA_VISIBLE_DEVICES=$2 limit 150 $b/cuda_selftest --bench >"$LOG/selftest-$1.txt" 2>&1
    echo $? >"$LOG/selftest-$1.rc"
}
st main 0 & st P 1 & wait
st M 0
for v in main P M; do
    rc=$(cat "$LOG/selftest-$v.rc")
    grep -E "FAIL" "$LOG/selftest-$v.txt" | head -5
    row "selftest $v" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest-$v.txt" | cut -c1-120)"
done
for v in main P M; do sed -n '/dtype *shape/,/^$/p' "$LOG/selftest-$v.txt" | grep -E "q4_k|dtype" | head -6; done
l4=$(config_plan cuda/glm-5.3-flash-l4)
for v in main P M; do
    BIN=.dev/bin; [ $v = main ] || BIN=.dev/bin$v
    cp -n .dev/bin/memra-compile .dev/bin/memra-synth .dev/bin$v/ 2>/dev/null
    late "bench l4 $v" || bench "bench l4 synthetic $v" 90 "" "$l4" -n 128 --reps 3 --weights synthetic
done
BIN=.dev/bin
ref=$(config_plan cuda/glm-5.3-flash-pp2-eager)
pp2=$(config_plan cuda/glm-5.3-flash-pp2)
tp2=$(config_plan cuda/glm-5.3-flash-tp2)
late "bench pp2 main" || bench "bench glm-5.3-flash-pp2 main" 150 "" "$pp2" -n 128 --reps 3 --weights synthetic
grep -iE "MiB in use" "$LOG/bench.log" | tail -2
late "bench tp2 main" || bench "bench glm-5.3-flash-tp2 main" 150 "" "$tp2" -n 128 --reps 3 --weights synthetic
late "gate tp2" || gate "gate glm-5.3-flash-tp2 vs pp2-eager" 200 "" "$ref" "$tp2" \
    --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
late "gate pp2" || gate "gate glm-5.3-flash-pp2 vs pp2-eager" 200 "" "$ref" "$pp2" \
    --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
for v in P M; do
    [ "$(cat "$LOG/selftest-$v.rc")" = 0 ] || continue
    BIN=.dev/bin$v
    late "bench pp2 $v" || bench "bench glm-5.3-flash-pp2 $v" 150 "" "$pp2" -n 128 --reps 3 --weights synthetic
done
table
