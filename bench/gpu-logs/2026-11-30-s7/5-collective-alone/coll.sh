# scratch: the one-shot all-reduce alone with both members on device 0 (now with a 512-row prefill size), llama1b decode 1 rank vs TP-2 on one device
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin; M=/tmp/fm; P=/tmp/fp; mkdir -p $M $P models $OUT
date -u +%Y-%m-%dT%H:%MZ | tee $OUT/date.txt
$B/memra-synth --shape llama1b --dtype q4_1 -o $M/llama1b-q4_1.gguf 2>/dev/null &
timeout 120 $B/cuda_selftest --collective 0,0 2>&1 | tee $OUT/collective.log | tail -8
wait
pl() { ln -sfn $M/$1.gguf models/${1%-*}.gguf; $B/memra-compile -q -o $P/$1-${2//\//-}.plan.toml plans/synthetic/$2.toml; echo $P/$1-${2//\//-}.plan.toml; }
b() { timeout 150 $B/memra-run bench --backend cuda "$@" 2>&1 | tee -a $OUT/bench.log | grep -E 'tok/s' | sed 's/.*placement [0-9a-f]*, //' | cut -c1-150; }
for c in llama1b llama1b-tp2; do echo "$c: $(b --prompt 512 -n 128 --reps 3 --model $M/llama1b-q4_1.gguf $(pl llama1b-q4_1 $c))"; done
