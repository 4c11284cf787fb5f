# scratch: the batched poll of the one-shot all-reduce: self-test, llama1b prefill gates of TP plans on one device, llama8b TP-2-on-one-device pp512 and decode against 1 rank
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin; M=/tmp/fm; P=/tmp/fp; mkdir -p $M $P models $OUT
date -u +%Y-%m-%dT%H:%MZ | tee $OUT/date.txt
$B/memra-synth --shape llama8b --dtype q4_1 -o $M/llama8b-q4_1.gguf 2>/dev/null &
$B/memra-synth --shape llama1b --dtype q4_1 -o $M/llama1b-q4_1.gguf 2>/dev/null &
timeout 150 $B/cuda_selftest > $OUT/selftest.log 2>&1; echo "selftest rc=$? $(tail -1 $OUT/selftest.log)"
grep -E '^(all_reduce|gather|collective)' $OUT/selftest.log | head -8
wait
pl() { ln -sfn $M/$1.gguf models/${1%-*}.gguf; $B/memra-compile -q -o $P/$1-${2//\//-}.plan.toml plans/synthetic/$2.toml; echo $P/$1-${2//\//-}.plan.toml; }
prompt=$(for _ in $(seq 13); do printf 'The quick brown fox jumps over the lazy dog. '; done)
ref=$(pl llama1b-q4_1 llama1b-eager)
for c in llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2; do
  out=$(timeout 120 $B/memra-run gate --backend cuda -p "$prompt" -n 8 --model $M/llama1b-q4_1.gguf --reference $ref $(pl llama1b-q4_1 $c) 2>&1); rc=$?
  echo "$out" >> $OUT/gates.log; echo "prefill gate $c rc=$rc $(echo "$out" | grep -E 'gate passed|differ|error' | tail -1 | cut -c1-150)"
done
b() { timeout 150 $B/memra-run bench --backend cuda "$@" 2>&1 | tee -a $OUT/bench.log | grep -E 'tok/s' | sed 's/.*placement [0-9a-f]*, //' | cut -c1-150; }
echo "1 rank: $(b --prompt 512 -n 64 --reps 3 --model $M/llama8b-q4_1.gguf $(pl llama8b-q4_1 llama8b))"
echo "tp2 one device: $(b --prompt 512 -n 64 --reps 3 --model $M/llama8b-q4_1.gguf $(pl llama8b-q4_1 llama8b-tp2))"
