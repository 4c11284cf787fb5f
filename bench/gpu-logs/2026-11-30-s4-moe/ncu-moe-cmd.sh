B=.dev/bin; M=/tmp/m; mkdir -p $M models; export LD_LIBRARY_PATH=/usr/local/cuda/lib64
$B/memra-synth --shape qwen3-30b-a3b --layers 4 --dtype q4_1 -o $M/q.gguf 2>/dev/null
ln -sfn $M/q.gguf models/qwen3-30b-a3b-l8.gguf
sed 's/\[pipeline\]/[capture]\nmode = "eager"\n\n[pipeline]/' plans/synthetic/cuda/qwen3-30b-a3b-l8.toml > plans/synthetic/cuda/q-eager.toml
$B/memra-compile -q -o $M/q.plan.toml plans/synthetic/cuda/q-eager.toml
n=$(ncu --metrics gpu__time_duration.sum --csv $B/memra-run generate --backend cuda --temp 0 -n 1 -p a --model $M/q.gguf $M/q.plan.toml 2>/dev/null | grep -c '"gpu__time_duration.sum"')
ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none --clock-control none --csv --launch-skip $((15*n)) --launch-count $n $B/memra-run generate --backend cuda --temp 0 -n 16 -p a --model $M/q.gguf $M/q.plan.toml > $OUT/ncu-moe.csv 2>$OUT/ncu-moe.err
echo "kernels per step: $n"
python3 - $OUT/ncu-moe.csv <<'PY'
import csv,sys,collections
rows=list(csv.DictReader([l for l in open(sys.argv[1]) if l.startswith('"')]))
t=collections.defaultdict(float); b=collections.defaultdict(float); c=collections.Counter()
for r in rows:
    k=r["Kernel Name"].split("(")[0]; v=float(r["Metric Value"].replace(",",""))
    if r["Metric Name"]=="gpu__time_duration.sum":
        v*={"ns":1e-3,"nsecond":1e-3,"us":1,"usecond":1,"ms":1e3,"msecond":1e3}[r["Metric Unit"]]; t[k]+=v; c[k]+=1
    else:
        v*={"byte":1,"Kbyte":1e3,"Mbyte":1e6,"Gbyte":1e9}.get(r["Metric Unit"],1); b[k]+=v
for k in sorted(t,key=t.get,reverse=True): print(f"{k:<24} {t[k]:9.1f} us {c[k]:4d} launches {t[k]/c[k]:7.2f} us avg {b[k]/1e6:8.1f} MB {b[k]/t[k]/1e6 if t[k] else 0:6.2f} TB/s")
print("total", sum(t.values()))
PY
