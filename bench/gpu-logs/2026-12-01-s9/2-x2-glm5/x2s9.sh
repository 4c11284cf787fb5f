# Session 9's two-GPU run (scratch): GLM-5.3-Flash at all 45 layers with synthetic weights drawn
# on the devices: PP-2 and TP-2 decode speed, each gated against the PP-2 eager run; then the
# real-width 4-layer cut's gates on one device.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=x2s9
BUDGET=${1:-470}
logs_in "$OUT"
stamp name,driver_version,memory.total
timed() { # row: runs the rest, adds its wall seconds to the row's detail
    local t=$(date +%s)
    "${@:2}"
    rows[-1]="${rows[-1]} [$(($(date +%s) - t)) s]"
    printf '%s\n' "${rows[-1]}" >>"$OUT/rows.txt"
}
ref=$(config_plan cuda/glm-5.3-flash-pp2-eager)
late "bench glm-5.3-flash-pp2 synthetic" ||
    timed x bench "bench glm-5.3-flash-pp2 synthetic" 150 "" "$(config_plan cuda/glm-5.3-flash-pp2)" \
        -n 128 --reps 3 --weights synthetic
grep -iE "weights read|MiB in use" "$LOG/bench.log" | tail -4
late "gate glm-5.3-flash-tp2 synthetic" ||
    timed x gate "gate glm-5.3-flash-tp2 synthetic" 200 "" "$ref" "$(config_plan cuda/glm-5.3-flash-tp2)" \
        --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
late "bench glm-5.3-flash-tp2 synthetic" ||
    timed x bench "bench glm-5.3-flash-tp2 synthetic" 150 "" "$(config_plan cuda/glm-5.3-flash-tp2)" \
        -n 128 --reps 3 --weights synthetic
late "gate glm-5.3-flash-pp2 synthetic" ||
    timed x gate "gate glm-5.3-flash-pp2 synthetic" 200 "" "$ref" "$(config_plan cuda/glm-5.3-flash-pp2)" \
        --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
cut=glm-5.3-flash-l4
ref=$(config_plan cuda/$cut-eager)
for cand in $cut-pp2 $cut-tp2 $cut-mla-eager $cut; do
    late "gate $cand synthetic" ||
        timed x gate "gate $cand synthetic" 120 "" "$ref" "$(config_plan cuda/$cand)" \
            --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 16
done
table
