#!/usr/bin/env bash
# Runs on the GPU machine: the CUDA self-test with the matvec bandwidth benchmark, then a short
# self-test under compute-sanitizer memcheck. Logs go to $OUT (or /tmp/memra-gpu); the last
# lines printed are a summary table. Exits non-zero if either run fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${BIN:-.dev/bin/cuda_selftest}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
LOG="${OUT:-/tmp/memra-gpu}"
mkdir -p "$LOG"
date -u +%Y-%m-%dT%H:%MZ | tee "$LOG/date.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$LOG/nvidia-smi.txt"

"$BIN" --bench >"$LOG/selftest.log" 2>&1
selftest=$?
compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN" >"$LOG/memcheck.log" 2>&1
memcheck=$?

grep -E "^(device|kernel|matvec_|rms_|rope|attention|add_|embed_|argmax|tree_sum|graph|  )" "$LOG/selftest.log" | grep -vE " PASS$" | head -80
grep -E "bandwidth|^(dtype|f16|q8_0|q4_1|f32|bf16|q4_0|q4_k|q6_k) |device-to-device" "$LOG/selftest.log"
grep -E "FAIL|error" "$LOG/selftest.log" | head -20
echo "memcheck: $(grep -E "ERROR SUMMARY|passed, " "$LOG/memcheck.log" | tr '\n' ' ')"
tail -1 "$LOG/selftest.log"
printf '%-22s %s\n' "selftest --bench" "exit $selftest" "memcheck selftest" "exit $memcheck"
[ "$selftest" -eq 0 ] && [ "$memcheck" -eq 0 ]
