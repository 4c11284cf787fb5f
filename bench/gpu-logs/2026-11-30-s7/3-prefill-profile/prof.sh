# scratch: pp512 of llama8b q4_1 TP-2 on one device against 1 rank; where a prefill chunk's time goes (nsys or ncu)
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=.dev/bin; M=/tmp/fm; P=/tmp/fp; mkdir -p $M $P models $OUT
date -u +%Y-%m-%dT%H:%MZ | tee $OUT/date.txt
which nsys ncu; ls /usr/local/cuda/bin | grep -i nsys
$B/memra-synth --shape llama8b --dtype f16 -o $M/llama8b-f16.gguf 2>/dev/null &
$B/memra-synth --shape llama8b --dtype q4_1 -o $M/llama8b-q4_1.gguf 2>/dev/null; wait
pl() { ln -sfn $M/$1.gguf models/${1%-*}.gguf; $B/memra-compile -q -o $P/$1-$2.plan.toml plans/synthetic/$2.toml; echo $P/$1-$2.plan.toml; }
b() { timeout 150 $B/memra-run bench --backend cuda "$@" 2>&1 | tee -a $OUT/bench.log | grep -E 'tok/s' | sed 's/.*prompt/prompt/' | cut -c1-120; }
echo "1 rank: $(b --prompt 512 -n 4 --reps 3 --model $M/llama8b-q4_1.gguf $(pl llama8b-q4_1 llama8b))"
echo "tp2 one device: $(b --prompt 512 -n 4 --reps 3 --model $M/llama8b-q4_1.gguf $(pl llama8b-q4_1 llama8b-tp2))"
plan=$(pl llama8b-f16 llama8b)
if command -v nsys >/dev/null; then
  timeout 200 nsys profile -o $OUT/pp -t cuda --force-overwrite true $B/memra-run bench --backend cuda --prompt 512 -n 1 --reps 1 --model $M/llama8b-f16.gguf $plan > $OUT/nsys.log 2>&1
  nsys stats -r cuda_gpu_kern_sum -f csv $OUT/pp.nsys-rep 2>/dev/null | head -30 | cut -c1-200 | tee $OUT/kern.csv
  rm -f $OUT/pp.nsys-rep $OUT/pp.sqlite
else
  timeout 250 ncu --launch-count 600 --metrics gpu__time_duration.sum --csv $B/memra-run bench --backend cuda --prompt 512 -n 1 --reps 1 --model $M/llama8b-f16.gguf $plan > $OUT/ncu.csv 2>$OUT/ncu.err
  python3 - $OUT/ncu.csv <<'PY'
import csv,sys,collections
t=collections.Counter(); c=collections.Counter()
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; ki=h.index('Kernel Name'); vi=h.index('Metric Value')
for r in rows[1:]:
    try: v=float(r[vi].replace(',',''))
    except: continue
    k=r[ki].split('(')[0]; t[k]+=v; c[k]+=1
tot=sum(t.values())
for k,v in t.most_common(20): print(f"{k:30s} {c[k]:5d} {v/1e3:10.1f} us {100*v/tot:5.1f}%")
PY
fi
