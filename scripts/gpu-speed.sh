#!/usr/bin/env bash
# Runs on the GPU machine: the matvec speed record of bench/cuda-speed.md. Times the matvec
# benchmark of a baseline build (BEFORE, if staged), then runs the self-test with the benchmark
# on the build under test (AFTER) and the self-test under compute-sanitizer memcheck. Stage
# both here with scripts/gpu-build.sh (copy the binary to the names below). Logs go to $OUT (or
# /tmp/memra-gpu); the last lines printed are the tables. Exits non-zero if a run fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BEFORE="${BEFORE:-.dev/bin/speed_before}"
AFTER="${AFTER:-.dev/bin/speed_after}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
LOG="${OUT:-/tmp/memra-gpu}"
mkdir -p "$LOG"
date -u +%Y-%m-%dT%H:%MZ | tee "$LOG/date.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$LOG/nvidia-smi.txt"

tables() { sed -n '/^matvec bandwidth/,/^per-op/p' "$1" | grep -v '^per-op'; }
before=0
if [ -x "$BEFORE" ]; then
    "$BEFORE" --bench --no-checks >"$LOG/before.log" 2>&1
    before=$?
    echo "== before ($BEFORE)"
    tables "$LOG/before.log"
fi
"$AFTER" --bench >"$LOG/after.log" 2>&1
after=$?
compute-sanitizer --tool memcheck --error-exitcode 3 "$AFTER" >"$LOG/memcheck.log" 2>&1
memcheck=$?
echo "== after ($AFTER)"
grep -E "^matvec_" "$LOG/after.log" | head -8
grep -E "^  matvec_" "$LOG/after.log"
grep -E "FAIL|rror" "$LOG/after.log" | head -20
tables "$LOG/after.log"
echo "memcheck: $(grep -E "ERROR SUMMARY|passed, " "$LOG/memcheck.log" | tr '\n' ' ')"
tail -1 "$LOG/after.log"
printf '%-18s exit %s\n' "before --bench" "$before" "after --bench" "$after" "memcheck" "$memcheck"
[ "$before" -eq 0 ] && [ "$after" -eq 0 ] && [ "$memcheck" -eq 0 ]
