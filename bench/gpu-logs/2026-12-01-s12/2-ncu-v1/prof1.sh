#!/usr/bin/env bash
# profile one matvec_mma_q4_1 launch (B=64, 14336x4096) of the selftest bench
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin/cuda_selftest
R=""
for r in barrier long_scoreboard short_scoreboard mio_throttle lg_throttle wait math_pipe_throttle not_selected selected no_instruction dispatch_stall tex_throttle branch_resolving drain membar imc_miss sleeping; do
  R="$R,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
R=${R#,}
timeout 500 ncu --clock-control none --kernel-name matvec_mma_q4_1 --launch-skip 1130 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
  --section MemoryWorkloadAnalysis --section SourceCounters --metrics "$R" --print-details all \
  $B --bench --no-checks > $OUT/ncu-mma64.txt 2>&1
echo "ncu rc $?"
grep -E "Duration|SM Frequency|DRAM Through|Memory Through|L1/TEX Hit|L2 Hit|Compute \(SM\)|Achieved Occ|Registers|Warp Cycles Per Issued|Issued Warp|No Eligible|Block Limit|Shared Memory Config|stalled" $OUT/ncu-mma64.txt | sed 's/  */ /g' | head -60
