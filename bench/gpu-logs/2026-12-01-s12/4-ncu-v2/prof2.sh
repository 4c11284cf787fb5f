#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin/cuda_selftest
$B --bench --no-checks > $OUT/bench.txt 2>&1
sed -n '/decode step of B sequences/,/^$/p' $OUT/bench.txt
R=""
for r in barrier long_scoreboard short_scoreboard mio_throttle lg_throttle wait math_pipe_throttle not_selected selected dispatch_stall; do
  R="$R,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
R="${R#,},l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
for skip in 10 490; do
timeout 200 ncu --clock-control none --kernel-name matvec_mma_q4_1 --launch-skip $skip --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --metrics "$R" \
  $B --bench --no-checks > $OUT/ncu-$skip.txt 2>&1
echo "== skip $skip rc $?"
grep -E "Grid Size|Duration|DRAM Through|Memory Through|L2 Hit|Compute \(SM\)|Achieved Occ|Registers Per|stalled|wavefronts|inst_executed|warps_active" $OUT/ncu-$skip.txt | sed 's/  */ /g'
done
