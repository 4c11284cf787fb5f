# scratch: the one-shot all-reduce with batched pushes too: alone on device 0, llama1b TP prefill gates, llama8b TP-2-on-one-device pp512/decode vs 1 rank
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin; M=/tmp/fm; P=/tmp/fp; mkdir -p $M $P models $OUT
date -u +%Y-%m-%dT%H:%MZ | tee $OUT/date.txt
$B/memra-synth --shape llama1b --dtype q4_1 -o $M/llama1b-q4_1.gguf 2>/dev/null &
$B/memra-synth --shape llama8b --dtype q4_1 -o $M/llama8b-q4_1.gguf 2>/dev/null &
timeout 120 $B/cuda_selftest --collective 0,0 2>&1 | tee $OUT/collective.log | tail -5
grep -E '^(all_reduce|gather)' $OUT/selftest.log 2>/dev/null
wait
pl() { ln -sfn $M/$1.gguf models/${1%-*}.gguf; $B/memra-compile -q -o $P/$1-${2//\//-}.plan.toml plans/synthetic/$2.toml; echo $P/$1-${2//\//-}.plan.toml; }
prompt=$(for _ in $(seq 13); do printf 'The quick brown fox jumps over the lazy dog. '; done)
ref=$(pl llama1b-q4_1 llama1b-eager)
for c in llama1b-tp2 llama1b-tp4; do
  out=$(timeout 120 $B/memra-run gate --backend cuda -p "$prompt" -n 8 --model $M/llama1b-q4_1.gguf --reference $ref $(pl llama1b-q4_1 $c) 2>&1); rc=$?
  echo "$out" >> $OUT/gates.log; echo "prefill gate $c rc=$rc $(echo "$out" | grep -E 'gate passed|differ|error' | tail -1 | cut -c1-110)"
done
b() { timeout 150 $B/memra-run bench --backend cuda "$@" 2>&1 | tee -a $OUT/bench.log | grep -E 'tok/s' | sed 's/.*placement [0-9a-f]*, //' | cut -c1-150; }
echo "llama1b-tp2: $(b --prompt 512 -n 128 --reps 3 --model $M/llama1b-q4_1.gguf $(pl llama1b-q4_1 llama1b-tp2))"
for c in llama8b llama8b-tp2; do echo "$c: $(b --prompt 512 -n 64 --reps 3 --model $M/llama8b-q4_1.gguf $(pl llama8b-q4_1 $c))"; done
