cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
B=.dev/bin; M=/tmp/fm; P=/tmp/fp; mkdir -p $M $P models
date -u +%Y-%m-%dT%H:%MZ
for dt in q8_0 f16; do $B/memra-synth --shape llama8b --dtype $dt -o $M/llama8b-$dt.gguf 2>/dev/null & done; wait
for dt in q8_0 f16; do
ln -sfn $M/llama8b-$dt.gguf models/llama8b.gguf; $B/memra-compile -q -o $P/$dt.plan.toml plans/synthetic/llama8b.toml
timeout 100 $B/memra-run bench --backend cuda --prompt 512 -n 16 --reps 3 --model $M/llama8b-$dt.gguf $P/$dt.plan.toml 2>&1 | grep -E 'tok/s|MiB in use' | cut -c1-250
done
