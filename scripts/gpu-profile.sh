#!/usr/bin/env bash
# Runs on the GPU machine: the matvec benchmark alone while sampling the SM clock, then Nsight
# Compute on one launch of selected matvec kernels (14336x4096, the third benchmark shape) to
# show what bounds them. Logs go to $OUT (or /tmp/memra-gpu). Usage: gpu-profile.sh [KERNEL...]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${BIN:-.dev/bin/cuda_selftest}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
LOG="${OUT:-/tmp/memra-gpu}"
mkdir -p "$LOG"
kernels=("$@")
[ ${#kernels[@]} -eq 0 ] && kernels=(matvec_q4_1 matvec_f16)

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw --format=csv,noheader -lms 100 >"$LOG/clocks.csv" &
smi=$!
"$BIN" --bench --no-checks >"$LOG/bench.log" 2>&1
bench=$?
kill "$smi"

for k in "${kernels[@]}"; do
    # the benchmark launches each kernel 160 times per shape: launch 330 is in the third shape
    ncu --clock-control none --kernel-name "$k" --launch-skip 330 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis "$BIN" --bench --no-checks >"$LOG/ncu-$k.txt" 2>&1
    echo "== $k"
    grep -E "SM Frequency|DRAM Throughput|Duration|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots|Executed Ipc|L1/TEX Hit|Mem Busy|Max Bandwidth|Block Limit" "$LOG/ncu-$k.txt" | sed 's/  */ /g'
    grep -E "^ *(WRN|INF|OPT) " "$LOG/ncu-$k.txt" | cut -c1-300 | head -6
done
echo "== sm clock (MHz) during the benchmark: $(cut -d, -f2 "$LOG/clocks.csv" | tr -dc '0-9\n' | sort -n | uniq -c | sort -rn | head -4 | tr '\n' ' ')"
grep -E "^(f16|q8_0|q4_1|q4_k) |device-to-device" "$LOG/bench.log"
echo "bench exit $bench"
