# Session 8's first GPU run (scratch): verifies the tree after session 7's last GPU call
# (segments split, rank module split, gemm_many grouping, cached shared-memory limits and SM
# count, compare --conditioning) with the self-test and a cross-section of gates.
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=v8a
BUDGET=${1:-300}
logs_in /tmp/memra-v8a
stamp name,driver_version,memory.total
synth llama1b q4_1 &
for s in tiny-qwen3moe tiny-deepseek2 tiny-kimi-linear tiny-glm5-next; do synth $s q8_0 & done
synth tiny-glm5-next f32 &
limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "PASS|FAIL" "$LOG/selftest.log" | grep -v " PASS$" | head -20
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
wait
prompt=$(for _ in $(seq 13); do printf 'The quick brown fox jumps over the lazy dog. '; done)
short=$(for _ in $(seq 5); do printf 'The quick brown fox jumps over the lazy dog. '; done)
ref=$(plan llama1b q4_1 llama1b-eager)
for cand in llama1b llama1b-tp2 llama1b-pp2-tp2; do
    late "prefill gate $cand q4_1" ||
        gate "prefill gate $cand q4_1" 120 "$M/llama1b-q4_1.gguf" "$ref" "$(plan llama1b q4_1 $cand)" -p "$prompt" -n 8
done
for c in tiny-qwen3moe:tp2 tiny-qwen3moe:ep4 tiny-deepseek2:tp2 tiny-kimi-linear:tp2 tiny-kimi-linear:pp2; do
    shape=${c%:*} cand=cuda/${c%:*}-${c#*:}
    late "prefill gate $cand q8_0" ||
        gate "prefill gate $cand q8_0" 120 "$M/$shape-q8_0.gguf" "$(plan $shape q8_0 cuda/$shape-eager)" \
            "$(plan $shape q8_0 $cand)" -p "$short" -n 8
done
for dtype in f32 q8_0; do
    ref=$(plan tiny-glm5-next $dtype cuda/tiny-glm5-next-eager)
    for cand in "" -tp2 -pp2 -mla-eager; do
        late "gate tiny-glm5-next$cand $dtype" ||
            gate "gate tiny-glm5-next$cand $dtype" 60 "$M/tiny-glm5-next-$dtype.gguf" "$ref" \
                "$(plan tiny-glm5-next $dtype cuda/tiny-glm5-next$cand)"
    done
done
late "cuda vs cpu tiny-glm5-next f32" ||
    against_cpu "cuda vs cpu tiny-glm5-next f32" 1e-3 "$M/tiny-glm5-next-f32.gguf" \
        "$(plan tiny-glm5-next f32 cuda/tiny-glm5-next)" 64
late "cuda vs cpu tiny-glm5-next q8_0" ||
    against_cpu "cuda vs cpu tiny-glm5-next q8_0" 5e-2 "$M/tiny-glm5-next-q8_0.gguf" \
        "$(plan tiny-glm5-next q8_0 cuda/tiny-glm5-next)" 32 --teacher-forced --conditioning 1e-6
late "cuda vs cpu tiny-kimi-linear q8_0" ||
    against_cpu "cuda vs cpu tiny-kimi-linear q8_0" 5e-2 "$M/tiny-kimi-linear-q8_0.gguf" \
        "$(plan tiny-kimi-linear q8_0 cuda/tiny-kimi-linear)" 64 --teacher-forced --conditioning 1e-6
for cand in llama1b-batch8 llama1b-batch8-tp2; do
    late "batch gate $cand vs llama1b-decode" ||
        gate "batch gate $cand vs llama1b-decode" 150 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b-decode)" \
            "$(plan llama1b q4_1 $cand)" --batch
done
table
