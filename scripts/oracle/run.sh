#!/usr/bin/env bash
# Regenerates testdata/oracle/<shape>-<dtype>.json: memra-synth writes each tiny MoE/MLA/KDA model,
# llama.cpp (CPU build, commit 0c1e570) decodes it through scripts/oracle/logits.cpp, and the
# JSON records the prompt, greedy tokens, every step's logits and the experts llama.cpp chose.
#   LLAMA_SRC, LLAMA_BUILD: as for scripts/oracle/build.sh
#   WORK: scratch directory for the GGUF files (default: a temporary directory)
# usage: run.sh [SHAPE:SEED ...]   (default: every recorded shape with its seed)
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${LLAMA_SRC:?set LLAMA_SRC to the llama.cpp source tree}"
: "${LLAMA_BUILD:?set LLAMA_BUILD to the llama.cpp build directory}"
WORK=${WORK:-$(mktemp -d)}
PROMPT=254,72,101,108,108,111   # <|begin_of_text|> "Hello"
GENERATE=48

cargo build --release -q -p memra-gguf --bin memra-synth
SYNTH=${CARGO_TARGET_DIR:-target}/release/memra-synth
ORACLE=$(OUT="$WORK/memra-oracle-logits" scripts/oracle/build.sh)
mkdir -p testdata/oracle
# seeds picked (from 1..12) for the widest top-1/top-2 logit margin over the greedy steps in
# all three dtypes (at least 0.0117 logits), so a reference that stays that close to
# llama.cpp keeps its tokens. tiny-kimi-linear: its recurrent state keeps every 8-bit
# activation flip of q8_0 (see executor/tests/oracle.rs), so 25 of 40 seeds part from
# llama.cpp's q8_0 greedy path at a near tie within 48 steps; seed 16 is one of those that
# keep it (margins 0.0085 / 0.0036 / 0.0066 logits in f32 / f16 / q8_0); in f32 all 40 seeds
# agree on every token, within 3.7e-6. tiny-glm5-next: seed 8 (margins 0.0361 / 0.0334 /
# 0.0035); seed 2 had the widest margin, but in f16 and q8_0 its DSA indexer meets near ties
# between the second- and third-best pool at three steps, where the 16-bit or 8-bit
# activations pick the other pool (that step's logits move by up to 0.46; the next step
# selects alike again and every token stays equal); seed 8 meets none in 48 steps.
# tiny-glm5-next-shared (gguf-py's writer, scripts/oracle/tiny_glm5_shared.py; MLA layers
# alternating full and shared indexers): f32 and q8_0 only; seed 5 of 1..6, the one with the
# widest margins (0.0125 / 0.037 logits over the first 32 generated steps) whose q8_0 run
# keeps llama.cpp's tokens there: seeds 1, 2, 3 and 6 part at a near tie within 32 steps in
# q8_0 (step 11 to 35; an 8-bit flip stays in the KDA states), and seed 8 too (step 29)
ENTRIES=("$@")
if [ ${#ENTRIES[@]} -eq 0 ]; then
    ENTRIES=(tiny-qwen3moe:9 tiny-deepseek2:9 tiny-deepseek2-lite:8 tiny-kimi-linear:16 tiny-glm5-next:8
        tiny-glm5-next-shared:5)
fi
record() { # GGUF SHAPE DTYPE SEED GENERATOR
    "$ORACLE" --model "$1" --prompt "$PROMPT" --generate "$GENERATE" \
        --shape "$2" --dtype "$3" --seed "$4" --generator "$5" \
        --sha256 "$(sha256sum "$1" | cut -d' ' -f1)" \
        --out "testdata/oracle/$2-$3.json"
    echo "testdata/oracle/$2-$3.json"
}
for entry in "${ENTRIES[@]}"; do
    shape=${entry%:*}
    SEED=${entry#*:}
    if [ "$shape" = tiny-glm5-next-shared ]; then
        # written by gguf-py, as llama.cpp's converter writes files (f32 and q8_0)
        scripts/oracle/gguf-py-models.sh "$WORK" "$SEED" >/dev/null
        for dtype in f32 q8_0; do
            record "$WORK/$shape-$dtype.gguf" "$shape" "$dtype" "$SEED" gguf-py
        done
        continue
    fi
    for dtype in f32 f16 q8_0; do
        gguf="$WORK/$shape-$dtype.gguf"
        "$SYNTH" --shape "$shape" --dtype "$dtype" --seed "$SEED" -o "$gguf" 2>/dev/null
        record "$gguf" "$shape" "$dtype" "$SEED" memra-synth
    done
done
