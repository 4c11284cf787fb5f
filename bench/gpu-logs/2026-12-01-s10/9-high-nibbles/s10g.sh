# Session 10 (scratch), one GPU: high nibbles dotted in place (q & 0xf0f0f0f0, unsigned x signed dp4a, one shift at the end; new, .dev/binN)
# against 34689be (old, .dev/bin): self-test of new; the 4-layer cut's
# gates (new); decode speed of the cut (synthetic) and llama8b q4_1, old and new alternating.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=s10g
BUDGET=${1:-240}
logs_in "$OUT"
stamp name,driver_version,memory.total
synth llama8b q4_1 &
sp=$!
limit 150 .dev/binN/cuda_selftest >"$LOG/selftest.txt" 2>&1
rc=$?
grep -E "FAIL" "$LOG/selftest.txt" | head -12
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.txt" | cut -c1-120)"
[ $rc = 0 ] || table
cut=glm-5.3-flash-l4
ref=$(config_plan cuda/$cut-eager)
for cand in $cut $cut-tp2; do
    BIN=.dev/binN gate "gate $cand synthetic" 90 "" "$ref" "$(config_plan cuda/$cand)" --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 16
done
wait $sp
l4=$(config_plan cuda/$cut)
p8=$(plan llama8b q4_1 llama8b)
NEW=.dev/binN; OLD=$BIN
for v in old new old new; do
    BIN=$NEW; [ $v = old ] && BIN=$OLD
    bench "bench l4 $v" 60 "" "$l4" -n 128 --reps 3 --weights synthetic
    bench "bench llama8b q4_1 $v" 60 "$M/llama8b-q4_1.gguf" "$p8" -n 128 --reps 3
done
table
