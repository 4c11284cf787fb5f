# Session 10 (scratch), one GPU: where the latency-bound kernels of the 4-layer cut stall,
# per SASS instruction (Nsight Compute source page): matvec_thin_f32 (the mHC mixes, 24 x
# 24576 with its norm), kda_delta_f32 and moe_route_f32.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s10d
BUDGET=${1:-200}
logs_in "$OUT"
stamp name,driver_version,memory.total
eager=$(config_plan cuda/glm-5.3-flash-l4-eager)
for k in matvec_thin_f32:8 kda_delta_f32:3 moe_route_f32:3 matvec_q4_k:18; do
    name=${k%%:*} skip=${k##*:}
    late "$name" && continue
    limit 100 ncu --kernel-name "$name" --launch-skip "$skip" --launch-count 1 \
        --section SourceCounters --section WarpStateStats --section SpeedOfLight \
        --page source --print-source sass --csv \
        "$BIN/memra-run" bench --backend cuda -n 3 --reps 1 --weights synthetic "$eager" >"$LOG/sass-$name.csv" 2>"$LOG/sass-$name.err"
    row "sass $name" "$(ok_or_fail $?)" "$(wc -l <"$LOG/sass-$name.csv") lines"
    limit 60 ncu --kernel-name "$name" --launch-skip "$skip" --launch-count 1 \
        --section SourceCounters --section WarpStateStats --section LaunchStats \
        "$BIN/memra-run" bench --backend cuda -n 3 --reps 1 --weights synthetic "$eager" >"$LOG/sum-$name.txt" 2>&1
done
table
