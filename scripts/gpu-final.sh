#!/usr/bin/env bash
# Runs on the GPU machine after the real model's parts arrived (see gpu-real.sh): the CUDA
# self-test (sampling included) and sampled text on CUDA against the CPU backend with the same
# seed on the real SmolLM2 (the llama8b gates are in gpu-gates.sh). The last lines printed
# are the table.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
B=.dev/bin
mkdir -p models
rows=()
row() { rows+=("$(printf '%-34s %-4s %s' "$1" "$2" "$3")"); }
t() { timeout --kill-after=5 "$@"; }
date -u +%Y-%m-%dT%H:%MZ
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cat /tmp/smol/p1 /tmp/smol/p2 .m3/p >models/SmolLM2-135M-Instruct.Q4_1.gguf
t 120 "$B/cuda_selftest" >/tmp/selftest.log 2>&1
row selftest "$([ $? -eq 0 ] && echo ok || echo FAIL)" "$(tail -1 /tmp/selftest.log)"
grep -iE "sampl" /tmp/selftest.log | head -8
for seed in 7 11; do
    cpu=$(t 120 "$B/memra-run" generate --seed $seed -n 48 -p "Once upon a time," plans/smollm2.plan.toml 2>/dev/null)
    gpu=$(t 120 "$B/memra-run" generate --backend cuda --seed $seed -n 48 -p "Once upon a time," plans/smollm2.plan.toml 2>/dev/null)
    echo "seed $seed cpu: $cpu"
    echo "seed $seed cuda: $gpu"
    row "sampled text seed $seed cpu vs cuda" "$([ "$cpu" = "$gpu" ] && echo same || echo diff)" "$(echo "$gpu" | head -c 80 | tr '\n' ' ')"
done
printf '%s\n' "${rows[@]}"
