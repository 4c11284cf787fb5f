#!/usr/bin/env bash
# Nsight Compute of the session-13 kernels in cuda_selftest --bench: the general form on the down
# projection (4096x14336) over 64 rows (matvec_mma_k2_q4_1) and 16 rows (matvec_mma16_q4_1), the
# single form's 64 x 32 tile (matvec_mma_single_q4_1: 14336x4096 over 64 rows, its first launch
# at 64 rows) and its 32 x 16 tile over 16 rows (matvec_mma16_single_q4_1)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin/cuda_selftest
for spec in matvec_mma_k2_q4_1:3 matvec_mma16_q4_1:3 matvec_mma_single_q4_1:3 matvec_mma16_single_q4_1:40; do
  k=${spec%:*} skip=${spec#*:}
  timeout 120 ncu --clock-control none --kernel-name $k --launch-skip $skip --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    --section SourceCounters --print-details all $B --bench --no-checks > $OUT/ncu-$k.txt 2>&1
  echo "== $k rc $?"
  grep -E "Grid Size|Block Size|Duration|DRAM Through|Compute \(SM\) Throughput|Achieved Occ|Registers Per|Warp Cycles Per Issued|Issued Warp|Executed Instructions  " $OUT/ncu-$k.txt | sed 's/  */ /g' | head -12
  grep -E "^ *smsp__pcsamp_warps_issue_stalled_[a-z_]+ " $OUT/ncu-$k.txt | sed 's/  */ /g; s/smsp__pcsamp_warps_issue_stalled_//' | sort -t' ' -k4 -n -r 2>/dev/null | awk '{printf "%s=%s ", $1, $3} END {print ""}'
done
