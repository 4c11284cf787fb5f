# Session 10 (scratch), one GPU: the self-test with moe_rows against exact products (binT);
# Nsight Compute sections of one decode step's latency-bound kernels on the 4-layer cut.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s10b
BUDGET=${1:-240}
logs_in "$OUT"
stamp name,driver_version,memory.total
limit 120 .dev/binT/cuda_selftest >"$LOG/selftest-T.txt" 2>&1
rc=$?
grep -E "FAIL|moe_rows " "$LOG/selftest-T.txt" | head -12
row "selftest T" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest-T.txt" | cut -c1-120)"
eager=$(config_plan cuda/glm-5.3-flash-l4-eager)
limit 200 ncu --kernel-name "regex:hc_pre_f32|hc_post_f32|matvec_thin_f32|matvec_q4_k|matvec_f32|kda_delta_f32|dsa_select_f32|moe_route_f32|rms_norm_f32" \
    --launch-skip 70 --launch-count 70 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis \
    "$BIN/memra-run" bench --backend cuda -n 3 --reps 1 --weights synthetic "$eager" >"$LOG/ncu-sections.txt" 2>"$LOG/ncu.err"
row "ncu sections" "$(ok_or_fail $?)" "$(grep -c '^  [a-z_0-9]* (' "$LOG/ncu-sections.txt") kernels"
grep -E '^  [a-z_0-9]+ \(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued' "$LOG/ncu-sections.txt" | head -150
table
