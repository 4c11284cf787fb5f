#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-build.sh staged the
# binaries in .dev/bin (this machine has Nsight Compute, not Nsight Systems): writes a
# synthetic model, then measures every kernel of one eager decode step, the last of STEPS (so
# attention reads STEPS positions), under Nsight Compute (duration only, caches and clocks left
# alone) and prints that token's kernel time by kernel. Launch gaps are not in these numbers:
# compare their sum with `memra-run bench`. Usage: gpu-ncu-token.sh SHAPE DTYPE [STEPS]
# (default 64). Logs go to $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=.dev/bin
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
LOG="${OUT:-/tmp/memra-gpu}"
M=/tmp/memra-models
P=/tmp/memra-plans
mkdir -p "$LOG" "$M" "$P" models
shape=$1 dtype=$2 steps=${3:-64}
[ -f "$M/$shape-$dtype.gguf" ] || "$BIN/memra-synth" --shape "$shape" --dtype "$dtype" -o "$M/$shape-$dtype.gguf" 2>/dev/null
ln -sfn "$M/$shape-$dtype.gguf" "models/$shape.gguf"
"$BIN/memra-compile" -q -o "$P/$shape-eager.plan.toml" "plans/synthetic/$shape-eager.toml"
csv="$LOG/ncu-$shape-$dtype.csv"
run() { # steps, then ncu options: a one-token prompt, so `steps` decode steps of equal launches
    local n=$1
    shift
    ncu --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv "$@" \
        "$BIN/memra-run" generate --backend cuda --temp 0 -n "$n" -p "a" \
        --model "$M/$shape-$dtype.gguf" "$P/$shape-eager.plan.toml"
}
per_step=$(run 1 2>/dev/null | grep -c '"gpu__time_duration.sum"')
run "$steps" --launch-skip $(((steps - 1) * per_step)) --launch-count "$per_step" >"$csv" 2>"$LOG/ncu-$shape-$dtype.err"
python3 - "$csv" 1 "$shape $dtype, decode step $steps" <<'PY'
import csv, sys, collections
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.DictReader(lines))
steps = int(sys.argv[2])
t = collections.defaultdict(float); n = collections.Counter()
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    v *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
    name = r["Kernel Name"].split("(")[0]
    t[name] += v; n[name] += 1
total = sum(t.values())
print(f"== {sys.argv[3]}: kernel time of one eager decode step (Nsight Compute)")
print(f"{'kernel':<22} {'us/token':>9} {'launches':>9} {'avg us':>7} {'share':>6}")
for k in sorted(t, key=t.get, reverse=True):
    print(f"{k:<22} {t[k] / steps:9.1f} {n[k] / steps:9.1f} {t[k] / n[k]:7.2f} {100 * t[k] / total:5.1f}%")
print(f"{'all kernels':<22} {total / steps:9.1f} {sum(n.values()) / steps:9.1f}")
PY
