# Session 8 (scratch): the tensor-core batched products after the loop-order rewrite: self-test
# (bit-exact against the one-row decode), llama8b batch-64 gate, bench --batch 1 4 16 64.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=v8c
BUDGET=${1:-170}
logs_in "${OUT:-/tmp/memra-v8c}"
stamp name,driver_version,memory.total
synth llama8b q4_1 &
synth8b=$!
limit 100 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^(matvec_mma|quantize)" "$LOG/selftest.log" | grep -v " PASS$" | head -10
grep -E "^matvec_mma_q4_1 " "$LOG/selftest.log" | head -1
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait $synth8b
late "batch gate llama8b-batch64 vs llama8b-decode" ||
    gate "batch gate llama8b-batch64 vs llama8b-decode" 60 "$M/llama8b-q4_1.gguf" \
        "$(plan llama8b q4_1 llama8b-decode)" "$(plan llama8b q4_1 llama8b-batch64)" --batch
for b in 64 16 4 1; do
    late "batch $b llama8b q4_1" ||
        bench "batch $b llama8b q4_1" 40 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-batch64)" \
            --batch $b --prompt 8 -n 128 --reps 2
done
table
