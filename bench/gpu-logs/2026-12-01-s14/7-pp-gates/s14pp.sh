#!/usr/bin/env bash
# Session 14, last call: one-sequence decode gates of deep pipelines with graphs, after the
# graphs' phases became the period of the boundary slots each run addresses.
source scripts/gpu.sh
SUITE=s14pp
BUDGET=150
logs_in /tmp/memra-s14pp
stamp name,driver_version,memory.total
synth smol135m q8_0 &
synth llama1b q8_0
wait
ref=$(plan llama1b q8_0 llama1b-eager)
for cand in llama1b-pp5 llama1b-pp3 llama1b-tp4 llama1b-pp2-tp2; do
    gate "decode gate $cand q8_0" 40 "$M/llama1b-q8_0.gguf" "$ref" "$(plan llama1b q8_0 $cand)"
done
smol=$P/q8_0/smol135m
for name in smol135m-eager smol135m-pp4; do plan smol135m q8_0 $name >/dev/null; done
gate "soak smol135m-pp4 x30" 60 "$M/smol135m-q8_0.gguf" "$smol-eager.plan.toml" "$smol-pp4.plan.toml" --repeat 30
table
