# scratch: the gemm rework on the H200: self-test (gemm rows), ptxas registers/spills, pp512 and ttft
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin; M=/tmp/fm; P=/tmp/fp; mkdir -p $M $P models $OUT
date -u +%Y-%m-%dT%H:%MZ | tee $OUT/date.txt
for s in llama8b-q4_1 llama8b-q8_0 llama8b-f16 llama1b-q4_1; do $B/memra-synth --shape ${s%-*} --dtype ${s##*-} -o $M/$s.gguf 2>/dev/null & done
$B/cuda_selftest --compile-only sm_90 --ptx-dir $OUT/ptx >/dev/null 2>&1 && /usr/local/cuda/bin/ptxas -arch=sm_90 -v $OUT/ptx/gemm.ptx -o /dev/null 2>&1 | grep -A1 -E "gemm(128|64)_(q4_1|f16|q8_0)" | grep -oE "Function properties for [a-z0-9_]+|Used [0-9]+ registers|[0-9]+ bytes spill (stores|loads)" | paste -sd' ' | sed 's/Function properties for/\n/g' | tee $OUT/ptxas.txt
timeout 150 $B/cuda_selftest > $OUT/selftest.log 2>&1; echo "selftest rc=$? $(tail -1 $OUT/selftest.log)"
grep -E '^(gemm)' $OUT/selftest.log | grep -v ' PASS$' | head
wait
pl() { ln -sfn $M/$1.gguf models/${1%-*}.gguf; $B/memra-compile -q -o $P/$1-$2.plan.toml plans/synthetic/$2.toml; echo $P/$1-$2.plan.toml; }
b() { timeout 150 $B/memra-run bench --backend cuda "$@" 2>&1 | tee -a $OUT/bench.log | grep -E 'tok/s' | sed 's/.*prompt/prompt/' | cut -c1-120; }
for s in llama8b-q4_1 llama8b-q8_0 llama8b-f16; do echo "$s: $(b --prompt 512 -n 4 --reps 3 --model $M/$s.gguf $(pl $s llama8b))"; done
echo "llama1b-q4_1: $(b --prompt 512 -n 4 --reps 3 --model $M/llama1b-q4_1.gguf $(pl llama1b-q4_1 llama1b))"
echo "ttft4096: $(b --prompt 4096 -n 2 --reps 2 --model $M/llama8b-q4_1.gguf $(pl llama8b-q4_1 llama8b-ctx8k))"
