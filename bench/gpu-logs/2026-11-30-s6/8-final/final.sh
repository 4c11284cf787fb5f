# session 6 final GPU check (scratch): selftest, prefill gates (one process and launched),
# pp512 / ttft / decode speed, memory
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin; M=/tmp/fm; P=/tmp/fp; mkdir -p $M $P models $OUT
date -u +%Y-%m-%dT%H:%MZ | tee $OUT/date.txt
prompt=$(for _ in $(seq 13); do printf 'The quick brown fox jumps over the lazy dog. '; done)
$B/memra-synth --shape llama1b --dtype q4_1 -o $M/llama1b-q4_1.gguf 2>/dev/null &
$B/memra-synth --shape llama8b --dtype q4_1 -o $M/llama8b-q4_1.gguf 2>/dev/null &
timeout 150 $B/cuda_selftest > $OUT/selftest.log 2>&1; echo "selftest rc=$? $(tail -1 $OUT/selftest.log)"
grep -E '^(gemm|attention_f16|kda)' $OUT/selftest.log | grep -v ' PASS$' | head
wait
pl() { ln -sfn $M/$1-$2.gguf models/$1.gguf; $B/memra-compile -q -o $P/$2-${3//\//-}.plan.toml plans/synthetic/$3.toml; echo $P/$2-${3//\//-}.plan.toml; }
ref=$(pl llama1b q4_1 llama1b-eager)
for c in llama1b llama1b-pp2 llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2; do
  out=$(timeout 120 $B/memra-run gate --backend cuda -p "$prompt" -n 8 --model $M/llama1b-q4_1.gguf --reference $ref $(pl llama1b q4_1 $c) 2>&1); rc=$?
  echo "$out" >> $OUT/gates.log; echo "prefill gate $c rc=$rc $(echo "$out" | grep -E 'gate passed|differ|error' | tail -1 | cut -c1-150)"
done
for c in multi/llama1b-tp2-nccl multi/llama1b-pp2; do
  cand=$(pl llama1b q4_1 $c)
  out=$(timeout 120 $B/memra-run launch $cand -- gate --backend cuda -p "$prompt" -n 8 --model $M/llama1b-q4_1.gguf --reference $ref 2>&1); rc=$?
  echo "$out" >> $OUT/gates.log; echo "launched prefill gate $c rc=$rc $(echo "$out" | grep -E 'gate passed|differ|error' | tail -1 | cut -c1-150)"
done
b() { timeout 150 $B/memra-run bench --backend cuda "$@" 2>&1 | tee -a $OUT/bench.log | grep -E 'tok/s|MiB in use' | cut -c1-260; }
b --prompt 512 -n 16 --reps 3 --model $M/llama8b-q4_1.gguf $(pl llama8b q4_1 llama8b)
b --prompt 512 -n 16 --reps 3 --model $M/llama1b-q4_1.gguf $(pl llama1b q4_1 llama1b)
b --prompt 4096 -n 2 --reps 2 --model $M/llama8b-q4_1.gguf $(pl llama8b q4_1 llama8b-ctx8k)
b -n 128 --reps 3 --model $M/llama8b-q4_1.gguf $P/q4_1-llama8b.plan.toml
