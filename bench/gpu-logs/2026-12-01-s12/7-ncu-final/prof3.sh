#!/usr/bin/env bash
# Nsight Compute source pages (per SASS instruction) of the final kernels: 14336x4096 over 64 rows
# (matvec_mma_q4_1, the 64 x 32 tile) and over 4 rows (matvec_mma8_q4_1)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin/cuda_selftest
for spec in matvec_mma_q4_1:10 matvec_mma8_q4_1:330; do
  k=${spec%:*} skip=${spec#*:}
  timeout 150 ncu --clock-control none --kernel-name $k --launch-skip $skip --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section SourceCounters \
    --section MemoryWorkloadAnalysis --print-details all $B --bench --no-checks > $OUT/ncu-$k.txt 2>&1
  echo "== $k rc $?"
  grep -E "Grid Size|Duration|DRAM Through|Memory Through|L2 Hit|Compute \(SM\)|Achieved Occ|Registers Per|Warp Cycles Per Issued|Issued Warp|Executed Ipc|smsp__pcsamp_warps_issue_stalled" $OUT/ncu-$k.txt | sed 's/  */ /g' | grep -v "not_issued" | head -40
  [ $k = matvec_mma_q4_1 ] || continue
  timeout 150 ncu --clock-control none --kernel-name $k --launch-skip $skip --launch-count 1 \
    --section SourceCounters --page source --print-source sass --csv $B --bench --no-checks > $OUT/src-$k.csv 2>/dev/null
  echo "source rc $? $(wc -l < $OUT/src-$k.csv) lines"
done
cd $OUT && gzip -f src-*.csv
