# Session 10 (scratch), two GPUs: the mHC/reciprocal/norm latency work (rcp_rn, hc_mix on a
# warp, wide norm unroll, thin matvec's early weights): self-test; the 4-layer cut's gates and
# speed; GLM-5.3-Flash 45 layers PP-2/TP-2 speed and gates; per-kernel times of a cut step.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s10c
BUDGET=${1:-420}
logs_in "$OUT"
stamp name,driver_version,memory.total
limit 150 "$BIN/cuda_selftest" >"$LOG/selftest.txt" 2>&1
rc=$?
grep -E "FAIL|rcp_rn|hc_pre" "$LOG/selftest.txt" | head -12
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.txt" | cut -c1-120)"
[ $rc = 0 ] || table
cut=glm-5.3-flash-l4
ref=$(config_plan cuda/$cut-eager)
for cand in $cut $cut-pp2 $cut-tp2 $cut-mla-eager; do
    late "gate $cand" || gate "gate $cand synthetic" 90 "" "$ref" "$(config_plan cuda/$cand)" \
        --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 16
done
late "bench l4" || bench "bench $cut synthetic" 90 "" "$(config_plan cuda/$cut)" -n 128 --reps 3 --weights synthetic
ref=$(config_plan cuda/glm-5.3-flash-pp2-eager)
pp2=$(config_plan cuda/glm-5.3-flash-pp2)
tp2=$(config_plan cuda/glm-5.3-flash-tp2)
late "bench pp2" || bench "bench glm-5.3-flash-pp2" 150 "" "$pp2" -n 128 --reps 3 --weights synthetic
late "bench tp2" || bench "bench glm-5.3-flash-tp2" 150 "" "$tp2" -n 128 --reps 3 --weights synthetic
late "gate tp2" || gate "gate glm-5.3-flash-tp2 vs pp2-eager" 200 "" "$ref" "$tp2" \
    --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
late "gate pp2" || gate "gate glm-5.3-flash-pp2 vs pp2-eager" 200 "" "$ref" "$pp2" \
    --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
if ! late "ncu step"; then
    limit 120 ncu --metrics gpu__time_duration.sum --csv --launch-skip 180 --launch-count 91 \
        "$BIN/memra-run" bench --backend cuda -n 4 --reps 1 --weights synthetic "$(config_plan cuda/$cut-eager)" \
        >"$LOG/ncu-step.csv" 2>"$LOG/ncu-step.err"
    row "ncu step" "$(ok_or_fail $?)" "$(grep -c gpu__time "$LOG/ncu-step.csv") kernels"
fi
table
