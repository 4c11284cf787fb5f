#!/usr/bin/env bash
# Runs on a machine with 4 (or more) GPUs, from the repository root, after
# scripts/gpu-build.sh staged the binaries in .dev/bin: the CUDA backend across devices. On 2
# or 3 GPUs it runs the rows that fit (PP-2 and TP-2 on devices 0,1).
#   - the peer-access matrix (nvidia-smi) and device-to-device copy bandwidth per pair;
#   - gates against the 1-rank eager run on device 0, llama1b-shaped q8_0: PP-2 on devices
#     0,1; PP-4 uneven on 0..3; TP-2 on 0,1; TP-4 on 0..3; PP-2 x TP-2 on 0..3; each plan's
#     memory per device (as the engine measured it) checked against the plan's bytes;
#   - llama8b-shaped q4_1 and f16: decode latency of TP-2 and TP-4 and tokens/s of PP-2 and
#     PP-4 against one GPU (one sequence; the executor decodes one sequence at a time);
#   - a pair of devices without P2P refused by name, when the machine has one.
# Logs go to /tmp/memra-multi (packed into $OUT/multi-logs.tar.gz); the last lines printed are
# the result table. Exits non-zero if any row failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${BIN:-.dev/bin}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
LOG=/tmp/memra-multi
M=/tmp/memra-models
P=/tmp/memra-plans-multi
mkdir -p "$LOG" "$M" "$P" models
date -u +%Y-%m-%dT%H:%MZ | tee "$LOG/date.txt"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$LOG/gpu.txt"
gpus=$(nvidia-smi -L | wc -l)

rows=()
failed=0
row() { # name, status, detail
    rows+=("$(printf '%-34s %-4s %s' "$1" "$2" "$3")")
    [ "$2" = ok ] || failed=1
}
limit() { timeout --kill-after=5 "$@"; }
# compile SHAPE DTYPE PLACEMENT... (paths under plans/synthetic) into $P/DTYPE/
compile() {
    local shape=$1 dtype=$2
    shift 2
    ln -sf "$M/$shape-$dtype.gguf" "models/$shape.gguf"
    mkdir -p "$P/$dtype"
    for path in "$@"; do
        "$BIN/memra-compile" -o "$P/$dtype/$(basename "$path").plan.toml" "plans/synthetic/$path.toml" \
            >/dev/null || row "compile $path $dtype" FAIL "see $LOG"
    done
}

if [ "$gpus" -lt 2 ]; then
    echo "this script needs 2 GPUs (4 for every row); the machine has $gpus"
    exit 1
fi
# on 2 or 3 GPUs, only the placements that fit: PP-2 and TP-2 on devices 0,1
fits() { [ "$gpus" -ge 4 ] || [[ "$1" != *4 && "$1" != *pp2-tp2 ]]; }

# 1. peer access and copy bandwidth per pair
nvidia-smi topo -p2p r | tee "$LOG/p2p.txt"
nvidia-smi topo -m >"$LOG/topo.txt"
python3 - <<'PY' 2>&1 | tee "$LOG/bandwidth.txt"
import torch
n = torch.cuda.device_count()
size = 1 << 30
for a in range(n):
    for b in range(n):
        if a == b:
            continue
        src = torch.empty(size, dtype=torch.uint8, device=f"cuda:{a}")
        dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{b}")
        dst.copy_(src)
        torch.cuda.synchronize(a); torch.cuda.synchronize(b)
        start = torch.cuda.Event(enable_timing=True); end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(b):
            start.record()
            for _ in range(5):
                dst.copy_(src, non_blocking=True)
            end.record()
        end.synchronize()
        print(f"copy {a} -> {b}: {5 * size / start.elapsed_time(end) / 1e6:.1f} GB/s, peer {torch.cuda.can_device_access_peer(b, a)}")
PY
pairs=$(grep -c ' GB/s' "$LOG/bandwidth.txt")
if [ "$pairs" -gt 0 ]; then
    row "peer matrix + bandwidth" ok "$pairs pairs measured (bandwidth.txt)"
else
    row "peer matrix + bandwidth" FAIL "no pair measured (the copy test needs python3 with torch): $(tail -1 "$LOG/bandwidth.txt")"
fi

# 2. gates across devices, with memory per device against the plan
"$BIN/memra-synth" --shape llama1b --dtype q8_0 -o "$M/llama1b-q8_0.gguf" 2>"$LOG/synth-l1.log"
MULTI=()
for cand in llama1b-pp2 llama1b-pp4 llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2; do fits "$cand" && MULTI+=("$cand"); done
compile llama1b q8_0 llama1b-eager "${MULTI[@]/#/multi/}"
for cand in "${MULTI[@]}"; do
    out=$(limit 200 "$BIN/memra-run" gate --backend cuda --model "$M/llama1b-q8_0.gguf" \
        --reference "$P/q8_0/llama1b-eager.plan.toml" "$P/q8_0/$cand.plan.toml" 2>&1)
    rc=$?
    echo "$out" >>"$LOG/gates.log"
    if [ $rc -eq 0 ]; then
        row "gate $cand q8_0" ok "$(echo "$out" | grep -oE '\(serial.*logits\)')"
    else
        row "gate $cand q8_0" FAIL "exit $rc: $(echo "$out" | tail -1 | cut -c1-300)"
    fi
    # bench prints "device D (...): ranks ...: X MiB taken, plan Y MiB" per device; taken may
    # exceed the plan by the context, streams and pinned rings, not by more than 10% + 256 MiB
    out=$(limit 100 "$BIN/memra-run" bench --backend cuda -n 32 --reps 1 --model "$M/llama1b-q8_0.gguf" \
        "$P/q8_0/$cand.plan.toml" 2>&1)
    echo "$out" >>"$LOG/memory.log"
    bad=$(echo "$out" | awk '/MiB taken, plan/ { t = $(NF-4); p = $(NF-1); if (t > p * 1.1 + 256 || t < p * 0.9) print }')
    if [ -z "$bad" ] && echo "$out" | grep -q "MiB taken"; then
        row "memory $cand" ok "$(echo "$out" | grep -c 'MiB taken') devices within 10% + 256 MiB of the plan"
    else
        row "memory $cand" FAIL "$(echo "${bad:-no memory report}" | head -1)"
    fi
done

# 3. llama8b speed: TP latency and PP throughput against one GPU
SPEED=()
for cand in llama8b llama8b-tp2 llama8b-tp4 llama8b-pp2 llama8b-pp4; do fits "$cand" && SPEED+=("$cand"); done
for dtype in q4_1 f16; do
    "$BIN/memra-synth" --shape llama8b --dtype "$dtype" -o "$M/llama8b-$dtype.gguf" 2>"$LOG/synth-l8-$dtype.log"
    compile llama8b "$dtype" "${SPEED[@]/#/multi/}"
    for cand in "${SPEED[@]}"; do
        out=$(limit 200 "$BIN/memra-run" bench --backend cuda -n 128 --reps 3 \
            --model "$M/llama8b-$dtype.gguf" "$P/$dtype/$cand.plan.toml" 2>&1)
        rc=$?
        echo "$out" >>"$LOG/bench.log"
        if [ $rc -eq 0 ]; then
            row "bench $cand $dtype" ok "$(echo "$out" | tail -1 | sed 's/^[^:]*: cuda, //')"
        else
            row "bench $cand $dtype" FAIL "exit $rc: $(echo "$out" | tail -1 | cut -c1-300)"
        fi
    done
    rm -f "$M/llama8b-$dtype.gguf"
done

# 4. a pair without P2P must be refused by name (only when the machine has one)
pair=$(awk 'NR > 1 { for (j = 2; j <= NF; j++) if ($j != "OK" && $j != "X") { print NR - 2, j - 2; exit } }' "$LOG/p2p.txt")
if [ -n "$pair" ]; then
    set -- $pair
    sed "s/ids = \[0, 1\]/ids = [$1, $2]/; s/devices = \[\[0\], \[1\]\]/devices = [[$1], [$2]]/" \
        plans/synthetic/multi/llama1b-pp2.toml >"$P/no-p2p.toml"
    sed -i 's#\.\./\.\./\.\./models#'"$PWD"'/models#' "$P/no-p2p.toml"
    ln -sf "$M/llama1b-q8_0.gguf" models/llama1b.gguf
    "$BIN/memra-compile" -o "$P/no-p2p.plan.toml" "$P/no-p2p.toml" >/dev/null
    out=$(limit 100 "$BIN/memra-run" bench --backend cuda -n 4 --reps 1 --model "$M/llama1b-q8_0.gguf" \
        "$P/no-p2p.plan.toml" 2>&1)
    if echo "$out" | grep -q "devices $1 and $2 have no peer-to-peer access"; then
        row "no-p2p pair $1,$2 refused" ok "$(echo "$out" | tail -1 | cut -c1-200)"
    else
        row "no-p2p pair $1,$2 refused" FAIL "$(echo "$out" | tail -1 | cut -c1-300)"
    fi
else
    row "no-p2p pair refused" skip "every pair of this machine has p2p"
fi

[ -n "${OUT:-}" ] && tar -czf "$OUT/multi-logs.tar.gz" -C "$LOG" .
echo
printf '%s\n' "${rows[@]}"
exit $failed
