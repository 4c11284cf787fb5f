cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin; M=/tmp/pm; P=/tmp/pp; mkdir -p $M $P models $OUT
prompt=$(for _ in $(seq 13); do printf 'The quick brown fox jumps over the lazy dog. '; done)
for dt in q8_0 q4_1; do $B/memra-synth --shape llama1b --dtype $dt -o $M/llama1b-$dt.gguf 2>/dev/null & done
$B/memra-synth --shape smol135m --dtype q8_0 -o $M/smol135m-q8_0.gguf 2>/dev/null &
wait
pl() { ln -sfn $M/$1-$2.gguf models/$1.gguf; $B/memra-compile -q -o $P/$2-$3.plan.toml plans/synthetic/$3.toml; echo $P/$2-$3.plan.toml; }
for dt in q8_0 q4_1; do
  ref=$(pl llama1b $dt llama1b-eager)
  for c in llama1b llama1b-pp2 llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2; do
    cand=$(pl llama1b $dt $c)
    out=$(timeout 120 $B/memra-run gate --backend cuda -p "$prompt" -n 8 --model $M/llama1b-$dt.gguf --reference $ref $cand 2>&1); rc=$?
    echo "$out" >> $OUT/gates.log
    echo "prefill gate $c $dt rc=$rc $(echo "$out" | grep -E 'gate passed|differ|error|mismatch' | tail -1 | cut -c1-160)"
  done
done
smol=$(pl smol135m q8_0 smol135m)
timeout 120 $B/memra-run compare --backend cuda -n 16 --tolerance 5e-2 --teacher-forced -p "$prompt" --model $M/smol135m-q8_0.gguf $smol 2>&1 | tail -1
timeout 120 $B/memra-run generate --backend cuda -n 8 --temp 0 -p "$prompt" --model $M/smol135m-q8_0.gguf $smol 2>&1 | grep -i 'notice\|prompt' | head -3
