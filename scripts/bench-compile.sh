#!/usr/bin/env bash
# Times memra-compile (release) on every shipped placement: wall time per compile, best and
# mean of N runs, the plan's size. Usage: scripts/bench-compile.sh [N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs="${1:-20}"
cargo build --quiet --release -p memra-compiler
bin=target/release/memra-compile
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-32s %10s %10s %8s\n' placement best_ms mean_ms lines
for placement in plans/*.toml; do
    case "$placement" in *.plan.toml) continue ;; esac
    name=$(basename "$placement" .toml)
    best=999999; total=0
    for _ in $(seq "$runs"); do
        start=$(date +%s%N)
        "$bin" -q "$placement" -o "$out/$name.plan.toml"
        ms=$(( ($(date +%s%N) - start) / 1000 ))
        total=$((total + ms)); (( ms < best )) && best=$ms
    done
    printf '%-32s %10.1f %10.1f %8d\n' "$name" "$(echo "$best/1000" | bc -l)" "$(echo "$total/$runs/1000" | bc -l)" "$(wc -l < "$out/$name.plan.toml")"
done
