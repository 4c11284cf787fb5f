#!/usr/bin/env bash
# Session 15, call 2: the TMA warp-specialized f16 products (gemm_tma), the norm and SiLU gate
# leaving the products' f16 rows, blocks ordered token-row tile first: self-test, products
# alone, prefill gates, pp512.
source scripts/gpu.sh
SUITE=s15c2
BUDGET=420
logs_in /tmp/memra-s15c2
stamp name,driver_version,memory.total
(synth llama1b q4_1; synth llama1b f16) &
s1=$!
(synth llama8b f16; synth llama8b q4_1) &
s8=$!
limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
rc=$?
grep -E "^(gemm_f16|rms_norm|swiglu_rows)" "$LOG/selftest.log" | grep -v " PASS$" | head -20
grep -E "Tma|narrowing" "$LOG/selftest.log" | head -30
row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
limit 120 "$BIN/cuda_selftest" --prefill-bench >"$LOG/prefill-bench.log" 2>&1
row "prefill-bench" "$(ok_or_fail $?)" "$(grep -c TFLOP "$LOG/prefill-bench.log") rows"
grep "TFLOP" "$LOG/prefill-bench.log" | grep "^f16"
wait $s1
prompt=$(sentences 13)
for dtype in f16 q4_1; do
    for cand in llama1b-tp2 llama1b-pp2-tp2; do
        gate "prefill gate $cand $dtype" 40 "$M/llama1b-$dtype.gguf" "$(plan llama1b $dtype llama1b-eager)" \
            "$(plan llama1b $dtype $cand)" -p "$prompt" -n 8
    done
done
wait $s8
for dtype in f16 q4_1; do
    bench "pp512 llama8b $dtype" 60 "$M/llama8b-$dtype.gguf" "$(plan llama8b $dtype llama8b)" --prompt 512 -n 16 --reps 3
done
bench "pp512 llama1b q4_1" 60 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b)" --prompt 512 -n 16 --reps 3
p8=$(plan llama8b f16 llama8b)
limit 150 ncu --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
    "$BIN/memra-run" bench --backend cuda --prompt 512 -n 2 --reps 1 --model "$M/llama8b-f16.gguf" "$p8" \
    >"$LOG/ncu-f16.csv" 2>"$LOG/ncu-f16.err"
row "ncu f16 pp512" "$(ok_or_fail $?)" "$(wc -l <"$LOG/ncu-f16.csv") lines"
python3 - "$LOG/ncu-f16.csv" <<'PY' | tee "$LOG/ncu-f16.txt"
import csv, sys, collections
rows = list(csv.DictReader([l for l in open(sys.argv[1]) if l.startswith('"')]))
t = collections.defaultdict(float); n = collections.Counter()
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    v *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
    name = r["Kernel Name"].split("(")[0]
    t[name] += v; n[name] += 1
total = sum(t.values())
print("== llama8b f16, bench --prompt 512 -n 2 --reps 1 (2 prefill chunks, 4 decode steps): kernel time")
print(f"{'kernel':<26} {'us total':>10} {'launches':>9} {'avg us':>8} {'share':>6}")
for k in sorted(t, key=t.get, reverse=True):
    print(f"{k:<26} {t[k]:10.1f} {n[k]:9d} {t[k] / n[k]:8.2f} {100 * t[k] / total:5.1f}%")
print(f"{'all kernels':<26} {total:10.1f} {sum(n.values()):9d}")
PY
table
