# Session 10 (scratch), one GPU: the persistent matvec grid sized to at least N items a block
# (MEMRA_MIN_ITEMS, an experiment-only build in .dev/binX; 1 is main's grid): the 4-layer
# cut's decode speed (synthetic weights) and its per-kernel times at N = 1 and the best.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s10e
BUDGET=${1:-150}
logs_in "$OUT"
stamp name,driver_version,memory.total
BIN=.dev/binX
l4=$(config_plan cuda/glm-5.3-flash-l4)
for n in 1 2 4 8 1 16 3; do
    export MEMRA_MIN_ITEMS=$n; bench "bench l4 min_items=$n" 60 "" "$l4" -n 128 --reps 3 --weights synthetic
done
eager=$(config_plan cuda/glm-5.3-flash-l4-eager)
for n in 1 4; do
    export MEMRA_MIN_ITEMS=$n; limit 60 ncu --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
        --kernel-name matvec_q4_k --launch-skip 48 --launch-count 24 \
        "$BIN/memra-run" bench --backend cuda -n 3 --reps 1 --weights synthetic "$eager" >"$LOG/ncu-q4k-$n.csv" 2>/dev/null
    row "ncu q4_k min_items=$n" "$(ok_or_fail $?)" "$(grep gpu__time "$LOG/ncu-q4k-$n.csv" | awk -F'","' '{print $8":"$NF}' | tr -d '"' | tr '\n' ' ' | cut -c1-600)"
done
table
