#!/usr/bin/env bash
# EP-4 wide diagnostic (scratch, not committed)
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin; M=/tmp/m; P=/tmp/p; mkdir -p $M $P models $OUT/d
$B/memra-synth --shape qwen3-30b-a3b --layers 1 --dtype q4_1 -o $M/l1.gguf 2>/dev/null &
$B/memra-synth --shape qwen3-30b-a3b --layers 8 --dtype q4_1 -o $M/l8.gguf 2>/dev/null &
wait
mk() { # name layers src [extra toml]
  sed "s#gguf = .*#gguf = \"$M/l$2.gguf\"#" plans/synthetic/cuda/$3.toml > $P/$1.toml
  [ -n "$4" ] && printf '%b\n' "$4" >> $P/$1.toml
  $B/memra-compile -q -o $P/$1.plan.toml $P/$1.toml || echo "compile $1 failed"
}
mk l1-ref 1 qwen3-30b-a3b-l8-eager
mk l1-ep4 1 qwen3-30b-a3b-l8-ep4
mk l1-ep4-eager 1 qwen3-30b-a3b-l8-ep4 '[capture]\nmode = "eager"'
mk l8-ep4 8 qwen3-30b-a3b-l8-ep4
mk l8-ep4-eager 8 qwen3-30b-a3b-l8-ep4 '[capture]\nmode = "eager"'
grep -n 'island\|eager\|run ' $P/l1-ep4.plan.toml | head -20 > $OUT/d/l1-ep4-plan-head.txt
cp $P/l1-ep4.plan.toml $OUT/d/
gen() { # name timeout plan model [env]
  local t=$(date +%s); shift 0
  env $5 timeout -k 5 $2 $B/memra-run generate --backend cuda -n 3 -p hello --temp 0 --model $4 $3 > $OUT/d/$1.log 2>&1
  echo "$1 rc=$? $(( $(date +%s)-t ))s $(grep -m1 -i error $OUT/d/$1.log | cut -c1-150)"
}
gen l1-ep4 60 $P/l1-ep4.plan.toml $M/l1.gguf
gen l1-ep4-eager 60 $P/l1-ep4-eager.plan.toml $M/l1.gguf
gen l8-ep4-eager 80 $P/l8-ep4-eager.plan.toml $M/l8.gguf
gen l8-ep4-lazyoff 80 $P/l8-ep4.plan.toml $M/l8.gguf CUDA_MODULE_LOADING=EAGER
gen l8-ep4 80 $P/l8-ep4.plan.toml $M/l8.gguf
t=$(date +%s)
timeout -k 5 150 compute-sanitizer --tool memcheck --error-exitcode 3 $B/memra-run generate --backend cuda -n 2 -p hello --temp 0 --model $M/l1.gguf $P/l1-ep4-eager.plan.toml > $OUT/d/memcheck-l1.log 2>&1
echo "memcheck l1-ep4-eager rc=$? $(( $(date +%s)-t ))s $(grep -m2 -E 'SUMMARY|Invalid' $OUT/d/memcheck-l1.log|tr '\n' ' ')"
