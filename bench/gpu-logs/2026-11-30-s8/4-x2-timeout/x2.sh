# Session 8's two-GPU run (scratch): GLM-5.3-Flash at all 45 layers with synthetic weights
# across both H200s (PP-2 and TP-2 gated against the PP-2 eager run, decode speed), then the
# batched decode on tensor cores (self-test, llama8b batch-64 gate, bench --batch) against
# llama-batched-bench built meanwhile.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=x2
BUDGET=${1:-520}
logs_in /tmp/memra-x2
stamp name,driver_version,memory.total
build_llamacpp llama-batched-bench >"$LOG/llama-build.log" 2>&1 &
build=$!
synth llama8b q4_1 &
synth8b=$!
timed() { # row: runs the rest, adds its wall seconds to the row's detail
    local t=$(date +%s)
    "${@:2}"
    rows[-1]="${rows[-1]} [$(($(date +%s) - t)) s]"
}
ref=$(config_plan cuda/glm-5.3-flash-pp2-eager)
late "bench glm-5.3-flash-pp2 synthetic" ||
    timed x bench "bench glm-5.3-flash-pp2 synthetic" 200 "" "$(config_plan cuda/glm-5.3-flash-pp2)" \
        -n 128 --reps 3 --weights synthetic
grep -iE "load|drew|weights" "$LOG/bench.log" | tail -4
for cand in glm-5.3-flash-tp2 glm-5.3-flash-pp2; do
    late "gate $cand synthetic" ||
        timed x gate "gate $cand synthetic" 240 "" "$ref" "$(config_plan cuda/$cand)" \
            --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
done
late "bench glm-5.3-flash-tp2 synthetic" ||
    timed x bench "bench glm-5.3-flash-tp2 synthetic" 150 "" "$(config_plan cuda/glm-5.3-flash-tp2)" \
        -n 128 --reps 3 --weights synthetic
# #16
wait $synth8b
limit 200 "$BIN/cuda_selftest" --bench >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^(matvec_mma|matvec_rows8|quantize)" "$LOG/selftest.log" | grep -v " PASS$" | head -20
sed -n '/decode step of B sequences/,/^$/p' "$LOG/selftest.log"
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
late "batch gate llama8b-batch64 vs llama8b-decode" ||
    gate "batch gate llama8b-batch64 vs llama8b-decode" 200 "$M/llama8b-q4_1.gguf" \
        "$(plan llama8b q4_1 llama8b-decode)" "$(plan llama8b q4_1 llama8b-batch64)" --batch
for b in 1 4 16 64; do
    late "batch $b llama8b q4_1" ||
        bench "batch $b llama8b q4_1" 100 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-batch64)" \
            --batch $b --prompt 8 -n 128 --reps 2
done
llamacpp_built $build
if ! late "llama-batched-bench llama8b-q4_1"; then
    out=$(CUDA_VISIBLE_DEVICES=0 limit 150 /tmp/llama-build/bin/llama-batched-bench \
        -m "$M/llama8b-q4_1.gguf" -c 9216 -b 2048 -ub 512 -npp 8 -ntg 128 -npl 1,4,16,64 \
        -ngl 99 -fa on 2>&1)
    rc=$?
    echo "$out" >>"$LOG/llama-batched-bench.txt"
    result "llama-batched-bench llama8b-q4_1" $rc "$out" \
        "$(echo "$out" | grep -E '^\| +8 \| +128 \|' | awk -F'|' '{ printf "B=%d S_TG %s t/s; ", $4, $9 }' | tr -s ' ')"
fi
table
