#!/usr/bin/env bash
# The GPU suites, from one entry: bash scripts/gpu.sh SUITE [ARGS], from anywhere in the
# repository. `build` runs here, where Rust is, and stages the binaries in .dev/bin/, the
# git-ignored folder the device runner carries (`carry: [".dev"]`); every other suite runs on
# the GPU machine (which has no Rust) from that checkout. Suites that compare with llama.cpp
# build it there from .llama/llama.cpp (scripts/fetch-llamacpp.sh makes it here; carry it too:
# `carry: [".dev", ".llama"]`).
#
#   build                     memra-run, memra-compile, memra-synth, cuda_selftest and the
#                             gpu-tests test binary into .dev/bin (cargo's own target folder,
#                             or CARGO_TARGET_DIR when set)
#   smoke [SECONDS]           first on a fresh tree: the self-test and a cross-section of the
#                             gates (prefill dense and MoE/MLA/KDA, tiny and real-width
#                             glm5-next, batch)
#   selftest                  every kernel against the CPU reference with the matvec bandwidth
#                             benchmark, then the self-test under compute-sanitizer memcheck
#   tests [TEST ARGS]         the gpu-tests feature's end-to-end tests (executor/tests/gpu.rs)
#   gates [SECONDS]           llama1b/llama8b gates, soak, CUDA vs CPU, sanitizers, speed
#   bench [SECONDS]           decode speed of smol135m/llama1b/llama8b x q4_1/q8_0/f16
#   speed                     matvec bandwidth of a baseline build against the one under test
#   real                      the real SmolLM2 (carried in three parts, see suite_real)
#   multi                     on 2-4 GPUs: peer matrix, cross-device gates, llama8b TP/PP speed
#   tp [DTYPES]               on 2 GPUs: the all-reduce alone (one-shot and NCCL), TP-2, PP-2
#                             and PP-2 x TP-2 gates over both transports, llama8b speed of one
#                             GPU, TP-2 (both transports), PP-2 and one TP-2 rank's compute
#                             alone for DTYPES (default "q4_1 q8_0 f16"; "" for no speed rows)
#   llamacpp                  Qwen3-30B-A3B q4_1 decode, memra against llama.cpp's llama-bench on
#                             the same file (llama.cpp built there from the pruned source the
#                             caller carries in .llama/llama.cpp, CUDA, sm_90)
#   launch [SECONDS]          on 2 GPUs, one process per GPU (memra-run launch, NCCL): gates of
#                             TP-2, PP-2, PP-2 x TP-2 (llama1b), TP-2 and PP-2 (tiny MoE/MLA),
#                             a one-shot group across processes refused, llama8b q4_1 speed
#   deepseek [SECONDS]        on 2 GPUs: tiny MoE/MLA TP-2 and PP-2 across the GPUs, a
#                             DeepSeek-V2-Lite-shaped 4-layer cut gated (graphs, TP-2, PP-3,
#                             across GPUs, one process per GPU), its speed and a
#                             DeepSeek-V3-shaped 4-layer cut's against llama.cpp
#   profile [KERNEL...]       SM clock during the matvec benchmark, Nsight Compute per kernel
#                             (PROFILE_SKIP: its launches skipped first, default 330)
#   ncu-token SHAPE DTYPE [STEPS] [PLACEMENT]   Nsight Compute time of each kernel of one
#                             decode step (SHAPE-eager by default; SHAPE NAME-lN: a depth cut)
#   ncu-prefill SHAPE DTYPE [PLACEMENT]   Nsight Compute time of each kernel of a 512-row
#                             prefill chunk (SHAPE by default, graphs; as bench runs it)
#   ncu-batch SHAPE DTYPE B [PLACEMENT]   Nsight Compute time of each kernel of one batched
#                             decode step of B sequences (SHAPE-batch64 by default); with
#                             NCU_KERNELS="K ...", a full report on one launch of each K
#                             (launch NCU_SKIP + 1, default 41)
#   final                     sampling self-test, sampled text CPU vs CUDA (real SmolLM2)
#   moe [SECONDS]             qwen3moe and deepseek2 on CUDA: self-test, tiny-qwen3moe gates
#                             (graphs, TP-2, TP-4, EP-4, PP-2 on device 0), tiny-deepseek2 and
#                             tiny-deepseek2-lite gates (graphs, TP-2, PP-2), CUDA vs CPU of
#                             each, the moe-wide gates, Qwen3-30B-A3B-shaped 8-layer q4_1 speed
#   prefill [SECONDS]         the cuda prefill: self-test (products over token rows, attention
#                             rows against decode, tensor-core attention), llama1b gates over a
#                             two-chunk prompt (graphs, PP-2, TP-2, TP-4, PP-2 x TP-2; with two
#                             GPUs also TP-2 and PP-2 one process per GPU), CUDA vs CPU over the
#                             prompt, llama8b pp512 (q4_1, q8_0, f16; q4_1 TP-2 on one device)
#                             and llama1b q4_1, the
#                             time to first token of 4096 tokens, llama8b decode; with
#                             .llama/llama.cpp carried, llama.cpp's pp512 of the same four
#                             files and its pp4096 of llama8b q4_1 (built while the gates run)
#   prefill-arch [SECONDS] [SHAPES]
#                             the cuda prefill of MoE, MLA, KDA and glm5-next models:
#                             self-test (the experts and the DSA indexer over token rows),
#                             prefill gates over 230 tokens (q8_0 tiny-qwen3moe graphs, TP-2,
#                             TP-4, EP-4, PP-2; tiny-deepseek2 and tiny-deepseek2-lite graphs,
#                             TP-2, PP-2; tiny-kimi-linear graphs, TP-2, TP-4, EP-2, PP-2, MLA
#                             eager; tiny-glm5-next and -shared graphs, TP-2, TP-4 or PP-4,
#                             EP-2, PP-2, MLA eager), CUDA vs CPU of each over its prompt
#                             (all but qwen3moe in f32), the
#                             Qwen3-30B-A3B-shaped 8-layer q4_1 cut (graphs, TP-2, EP-4, PP-2)
#                             over a two-chunk prompt
#   moe-batch [SECONDS]       CUDA continuous batching of MoE layers, memra alone: a
#                             Qwen3-30B-A3B-shaped 8-layer q4_1 cut by 1, 4, 16 and 64
#                             sequences, and its batch gates
#   batch [SECONDS]           CUDA continuous batching: self-test (the matvec over rows and
#                             attention over sequence slots bit for bit against the one-row
#                             decode, and the batched matvec throughput table), batch gates of
#                             llama1b q4_1 (8 slots on one device, TP-2, PP-2) and llama8b q4_1
#                             (64 slots) against the one-sequence decode plan and against
#                             themselves, llama8b q4_1 bench --batch 1 4 16 64 (128 tokens
#                             each) beside its one-sequence decode; with .llama/llama.cpp
#                             carried, llama-batched-bench -npl 1,4,16,64 of the same file
#   speculation [SECONDS]     CUDA speculative decoding (dense): the gpu-tests speculation
#                             test (bit for bit the plain plan, one device, PP-2, TP-2), and
#                             llama8b q4_1 plain against replayed drafts cut at 1 to 4
#   moe-wide [SECONDS]        Qwen3-30B-A3B-shaped 8-layer q4_1 cut gated at real width on
#                             device 0: graphs, TP-2, TP-4, EP-4, PP-2
#   kda [SECONDS]             kimi-linear (KDA + MLA + MoE) on CUDA: self-test, tiny-kimi-linear
#                             gates (graphs, TP-2, TP-4, EP-2, PP-2, MLA layers eager on device
#                             0) in f32 and q8_0, CUDA vs CPU of each
#   glm5 [SECONDS]            glm5-next (KDA + sparse MLA + mHC + clamped MoE) on CUDA: the
#                             self-test's glm5-next rows (bounded KDA decay, DSA indexer,
#                             sparse MLA, mHC, clamped SwiGLU), tiny-glm5-next gates (graphs, TP-2, TP-4, EP-2, PP-2,
#                             DSA layers eager on device 0) in f32 and q8_0, CUDA vs CPU of
#                             each; tiny-glm5-next-shared (full and shared indexers) the
#                             same with PP-2 and PP-4 cuts the selection crosses instead of
#                             TP-4; a PP-4 soak of 100 runs, a GLM-5.3-Flash-width 4-layer cut
#                             gated (graphs, PP-2, TP-2, DSA eager) with synthetic weights,
#                             timed from a file against llama.cpp's llama-bench on the same
#                             file (with .llama/llama.cpp carried); with 2 GPUs, all 45
#                             GLM-5.3-Flash layers with synthetic weights: PP-2 and TP-2
#                             speed, each gated against PP-2 eager
#   prefill-depth [SECONDS] [MODEL...]  the depth suite's files, prompts instead of decode:
#                             memra-run bench --prompt 512 and 4096 against llama-bench pp512
#                             and pp4096 of each model's full cut
#   depth [SECONDS] [MODEL...]  memra against llama.cpp on the same files, written by
#                             llama.cpp's own tools (scripts/depth_models.py with gguf-py, then
#                             llama-quantize Q4_1): decode tok/s after 0, 512 and 4096 tokens
#                             of context and the time a layer adds (two layer counts) of
#                             qwen3moe, deepseek2, kimi-linear, llama8b and glm5-next at real
#                             widths (carry .dev with .dev/wheels, and .llama)
#   depth-long [SECONDS] [MODEL...]  the same files' decode after 32768 tokens of context
#                             (llama8b and deepseek2 by default), memra on the cuts'
#                             long-context placements (plans/synthetic/depth/*-long.toml)
#   batch-depth [SECONDS] [MODEL...]  the same files decoded by 1, 4, 16 and 64 sequences
#                             together (qwen3moe, deepseek2 and kimi-linear by default):
#                             memra-run bench --batch B on the cut's -batch64 placement
#                             against llama-batched-bench
#
# Suites with a result table print it last, one row per check (`name status detail`), and
# exit 1 when a row is FAIL; with a SECONDS budget, a row that would start after it is `skip`,
# so a lease short of device time still gets its table. Logs go to $OUT (or /tmp/memra-gpu),
# or, for the suites that write many, to /tmp/memra-SUITE, packed as $OUT/SUITE-logs.tar.gz.
# An experiment of its own (under the git-ignored .dev/) sources this file for the helpers
# (`source scripts/gpu.sh`; then set SUITE and BUDGET, call logs_in, its rows, table).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN="${BIN:-.dev/bin}"
M=/tmp/memra-models
P=/tmp/memra-plans
LOG="${OUT:-/tmp/memra-gpu}"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
# NVLink multicast stays off on the shared GPU machines, in every process started from here
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
t0=$(date +%s)
BUDGET=
rows=()
failed=0

# ---- helpers shared by the suites

logs_in() { # DIR: where this suite's logs go
    LOG=$1
    mkdir -p "$LOG" "$M" "$P" models
    : >"$LOG/compare.log"
}
stamp() { # nvidia-smi FIELDS: the date and the GPUs, also into $LOG/gpu.txt
    { date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu="$1" --format=csv,noheader; } | tee "$LOG/gpu.txt"
}
limit() { timeout --kill-after=5 "$@"; }
capped() { # SECONDS: SECONDS, or less once the suite's SECONDS budget (plus a minute of grace
    # for the table) is nearly spent, so that a row started late cannot outrun the device
    # call and take the table with it
    local left
    [ -n "$BUDGET" ] || { echo "$1"; return; }
    left=$((BUDGET + 60 - ($(date +%s) - t0)))
    [ "$left" -gt 10 ] || left=10
    echo $(($1 < left ? $1 : left))
}
row() { # name status detail; only FAIL fails the suite (ok, skip, same and diff do not). With
    # $OUT set, each row also goes to $OUT/rows.txt as it is made, so a call that runs out of
    # time still brings back the rows it finished
    rows+=("$(printf '%-34s %-4s %s' "$1" "$2" "$3")")
    [ -z "${OUT:-}" ] || printf '%s\n' "${rows[-1]}" >>"$OUT/rows.txt"
    [ "$2" != FAIL ] || failed=1
}
ok_or_fail() { if [ "$1" -eq 0 ]; then echo ok; else echo FAIL; fi; }
result() { # name exit-status output detail-when-ok
    if [ "$2" -eq 0 ]; then
        row "$1" ok "$4"
    else
        row "$1" FAIL "exit $2: $(echo "$3" | tail -1 | cut -c1-300)"
    fi
}
late() { # row name: true, with a skip row, once the suite's SECONDS budget is spent
    [ -n "$BUDGET" ] && [ $(($(date +%s) - t0)) -ge "$BUDGET" ] || return 1
    row "$1" skip "device-time budget of ${BUDGET}s spent"
}
table() { # packs the logs, prints the rows last, exits 1 when a row failed
    if [ -n "${OUT:-}" ] && [ "$LOG" != "$OUT" ]; then
        tar -czf "$OUT/$SUITE-logs.tar.gz" -C "$LOG" .
    fi
    echo
    echo "total $(($(date +%s) - t0)) s"
    printf '%s\n' "${rows[@]}"
    exit $failed
}
synth() { # shape dtype: writes the synthetic model $M/SHAPE-DTYPE.gguf
    "$BIN/memra-synth" --shape "$1" --dtype "$2" -o "$M/$1-$2.gguf" 2>"$LOG/synth-$1-$2.log"
}
synth_cut() { # shape layers dtype: the depth cut $M/SHAPE-lLAYERS-DTYPE.gguf of a real-width shape
    "$BIN/memra-synth" --shape "$1" --layers "$2" --dtype "$3" -o "$M/$1-l$2-$3.gguf" 2>"$LOG/synth-$1-l$2-$3.log"
}
config_plan() { # placement (under plans/synthetic) of a config.json model: compiles it into
    # $P/config/ and prints the plan's path; a failure is logged, and the run of the plan then
    # fails its row
    local out
    out="$P/config/$(basename "$1").plan.toml"
    mkdir -p "$P/config"
    "$BIN/memra-compile" -q -o "$out" "plans/synthetic/$1.toml" >>"$LOG/compile.log" 2>&1 ||
        echo "compile $1 failed" >>"$LOG/compile.log"
    echo "$out"
}
plan() { # shape dtype placement (under plans/synthetic): compiles it for $M/SHAPE-DTYPE.gguf
    # into $P/DTYPE/ and prints the plan's path; a failure is logged, and the run of the plan
    # then fails its row
    local out
    out="$P/$2/$(basename "$3").plan.toml"
    mkdir -p "$P/$2"
    ln -sfn "$M/$1-$2.gguf" "models/$1.gguf"
    "$BIN/memra-compile" -q -o "$out" "plans/synthetic/$3.toml" >>"$LOG/compile.log" 2>&1 ||
        echo "compile $3 $2 failed" >>"$LOG/compile.log"
    echo "$out"
}
gate() { # row seconds model reference candidate [memra-run gate options]: one process
    gate_with "" "$@"
}
launched() { # the same, one process per device of the candidate (memra-run launch)
    gate_with launch "$@"
}
gate_with() { # how ("" or launch) row seconds model reference candidate [gate options]; an
    # empty model: the plan's (or none, with --weights synthetic)
    local how=$1 name=$2 secs=$3 model=$4 ref=$5 cand=$6 t out rc dt
    shift 6
    local args=(gate --backend cuda "$@" --reference "$ref")
    [ -z "$model" ] || args+=(--model "$model")
    if [ "$how" = launch ]; then args=(launch "$cand" -- "${args[@]}"); else args+=("$cand"); fi
    t=$(date +%s%N)
    out=$(limit "$(capped "$secs")" "$BIN/memra-run" "${args[@]}" 2>&1)
    rc=$?
    echo "$out" >>"$LOG/gates.log"
    dt=$((($(date +%s%N) - t) / 100000000))
    result "$name" $rc "$out" "$(echo "$out" | grep -oE '\(serial[^)]*\)|[0-9]+ of [0-9]+ runs differed' | tr '\n' ' ')$((dt / 10)).$((dt % 10))s"
}
bench() { # row seconds model plan [memra-run bench options]: one process; the output stays
    # in $bench_out
    bench_with "" "$@"
}
launched_bench() { # row seconds model plan: bench -n 128 --reps 3, one process per device
    bench_with launch "$@" -n 128 --reps 3
}
bench_with() { # how ("" or launch) row seconds model plan [bench options]; an empty model:
    # the plan's (or none, with --weights synthetic)
    local how=$1 name=$2 secs=$3 model=$4 plan=$5 rc
    shift 5
    local args=(bench --backend cuda "$@")
    [ -z "$model" ] || args+=(--model "$model")
    if [ "$how" = launch ]; then args=(launch "$plan" -- "${args[@]}"); else args+=("$plan"); fi
    bench_out=$(limit "$(capped "$secs")" "$BIN/memra-run" "${args[@]}" 2>&1)
    rc=$?
    echo "$bench_out" >>"$LOG/bench.log"
    result "$name" $rc "$bench_out" "$(echo "$bench_out" | grep 'tok/s' | tail -1 | sed 's/^[^:]*: cuda, //' | cut -c1-220)"
}
memory_check() { # row: each device of the last bench: the memory in use on the device (this
    # process's context included; the device is otherwise idle) within 3% of the plan's bytes
    # for the engine's token rows per step (a prefill chunk, or one where prompts run token by
    # token)
    local lines table bad
    lines=$(echo "$bench_out" | grep "MiB in use on the device")
    if [ -z "$lines" ]; then
        row "$1" FAIL "no memory report"
        return
    fi
    # device, in use, planned for the engine's rows per step
    table=$(echo "$lines" | sed -E 's/^device ([0-9]+) .*: ([0-9.]+) MiB in use on the device, .*, ([0-9.]+) MiB of it for steps of .*/\1 \2 \3/')
    bad=$(echo "$table" | awk '{ d = ($2 - $3) / $3; if (d > 0.03 || d < -0.03) print }')
    if [ -z "$bad" ]; then
        row "$1" ok "$(echo "$table" | awk '{ printf "dev %s %s/%s MiB (%+.1f%%) ", $1, $2, $3, 100 * ($2 - $3) / $3 }')"
    else
        row "$1" FAIL "in use / planned: $(echo "$bad" | head -1)"
    fi
}
# CUDA against the CPU on an f32 model: within 5e-3 over 64 steps, teacher-forced, the steps
# where the CPU moves past it under 1e-3 relative noise set apart. The CPU narrows attention's
# probabilities to f16 before the value product (as llama.cpp's CPU backend does); CUDA's
# chunked softmax keeps f32 weights (docs/numerics.md), about 1e-3 apart on the tiny models
# (2026-12-03, H200: tiny-kimi-linear 2.0e-3, tiny-qwen3moe 1.7e-3), and a MoE router near a
# tie turns that into one step's spike (tiny-deepseek2-lite: 9.9e-2 at one step, 1e-3 around)
F32_AGAINST_CPU=(5e-3 64 --teacher-forced --conditioning 1e-3)
against_cpu() { # row tolerance model plan [steps, default 64] [compare options]: greedy
    # steps of CUDA against the CPU backend
    local out rc
    out=$(limit "$(capped 150)" "$BIN/memra-run" compare --backend cuda -n "${5:-64}" --tolerance "$2" --model "$3" "$4" "${@:6}" 2>&1)
    rc=$?
    # every comparison of the suite stays in the log, each under its row's name
    printf '== %s\n%s\n' "$1" "$out" >>"$LOG/compare.log"
    result "$1" $rc "$out" "$(echo "$out" | tail -1 | sed 's/^compare [^:]*: //' | cut -c1-200)"
}
build_llamacpp() { # [TARGETS]: builds them (default llama-bench) into /tmp/llama-build from the carried .llama/llama.cpp
    [ -d .llama/llama.cpp ] || { echo "no .llama/llama.cpp: make it with scripts/fetch-llamacpp.sh and carry it"; return 1; }
    cmake -S .llama/llama.cpp -B /tmp/llama-build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release &&
        cmake --build /tmp/llama-build --target "${@:-llama-bench}" -j "$(nproc)"
}
llamacpp_built() { # pid of build_llamacpp: waits for the build and writes its row
    wait "$1"
    row "llama.cpp build" "$(ok_or_fail $?)" "$(tail -1 "$LOG/llama-build.log" | cut -c1-120)"
}
llama_bench() { # row model [llama-bench options, default: batch-1 decode of 128 tokens]: on GPU 0
    local row=$1 model=$2 out rc
    shift 2
    [ $# -gt 0 ] || set -- -p 0 -n 128
    # one GPU, as memra: llama.cpp would split the layers over every visible device
    out=$(CUDA_VISIBLE_DEVICES=0 limit "$(capped 300)" /tmp/llama-build/bin/llama-bench -m "$model" "$@" -fa 1 -ngl 99 -r 3 -o md 2>&1)
    rc=$?
    echo "$out" >>"$LOG/llama-bench.txt"
    result "$row" $rc "$out" "$(echo "$out" | grep -E ' (pp|tg)[0-9]+ ' | tr -s ' ' | cut -c1-200)"
}
memcheck() { # self-test binary: it under compute-sanitizer memcheck; the exit status is its
    compute-sanitizer --tool memcheck --error-exitcode 3 "$1" >"$LOG/memcheck.log" 2>&1
}
memcheck_line() { echo "memcheck: $(grep -E "ERROR SUMMARY|passed, " "$LOG/memcheck.log" | tr '\n' ' ')"; }
nccl_on_path() { # puts pip's libnccl (nvidia-nccl-cu13) on the library path as libnccl.so
    local dir
    dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null) || return 1
    mkdir -p /tmp/nccl-lib
    ln -sf "$dir/libnccl.so.2" /tmp/nccl-lib/libnccl.so
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/tmp/nccl-lib:$dir"
}
join_smollm2() { # the real model from its three carried parts (see suite_real)
    local model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    cat /tmp/smol/p1 /tmp/smol/p2 .m3/p >"$model"
    echo "$(sha256sum "$model" | cut -c1-64)  (expected b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53)"
}

# ---- the suites

suite_build() {
    set -e
    local target gpu_tests
    # cargo's own answer: ./target, or CARGO_TARGET_DIR or a config's build.target-dir
    target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    cargo build --release -p memra-executor --example cuda_selftest --bin memra-run
    cargo build --release -p memra-compiler --bin memra-compile
    cargo build --release -p memra-gguf --bin memra-synth
    # the gpu-tests end-to-end tests, as one binary (run it with the tests suite)
    gpu_tests=$(cargo test --release -p memra-executor --features gpu-tests --test gpu --no-run \
        --message-format=json | grep '"kind":\["test"\]' | grep '"name":"gpu"' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')
    mkdir -p .dev/bin
    cp "$gpu_tests" .dev/bin/gpu-tests
    cp "$target/release/examples/cuda_selftest" .dev/bin/
    for bin in memra-run memra-compile memra-synth; do
        cp "$target/release/$bin" .dev/bin/
    done
    strip .dev/bin/*
    # the test binary finds the repository at the path it was built in (see suite_tests)
    pwd >.dev/built-in
    ls -l .dev/bin/
}

# The self-test with the matvec bandwidth benchmark, then a short self-test under memcheck;
# the last lines are a summary. Exits non-zero if either run fails.
suite_selftest() {
    local selftest=${SELFTEST:-$BIN/cuda_selftest} rc memcheck_rc
    logs_in "$LOG"
    stamp name,driver_version,memory.total,clocks.sm,clocks.mem
    "$selftest" --bench >"$LOG/selftest.log" 2>&1
    rc=$?
    memcheck "$selftest"
    memcheck_rc=$?
    grep -E "^(device|kernel|matvec_|rms_|rope|attention|add_|embed_|argmax|tree_sum|graph|  )" "$LOG/selftest.log" | grep -vE " PASS$" | head -80
    grep -E "bandwidth|^(dtype|f16|q8_0|q4_1|f32|bf16|q4_0|q4_k|q6_k) |device-to-device" "$LOG/selftest.log"
    grep -E "FAIL|error" "$LOG/selftest.log" | head -20
    memcheck_line
    tail -1 "$LOG/selftest.log"
    printf '%-22s %s\n' "selftest --bench" "exit $rc" "memcheck selftest" "exit $memcheck_rc"
    [ "$rc" -eq 0 ] && [ "$memcheck_rc" -eq 0 ]
}

# The gpu-tests feature's end-to-end tests, the same as `cargo test --release -p
# memra-executor --features gpu-tests --test gpu` where Rust and a GPU meet. The test binary
# finds the repository at the path it was built in (.dev/built-in, written by the build suite),
# so that path is linked to this checkout first.
suite_tests() {
    set -e
    local built_in=${MEMRA_BUILT_IN:-}
    if [ -z "$built_in" ]; then
        if [ ! -f .dev/built-in ]; then
            echo "scripts/gpu.sh tests: .dev/built-in is missing; stage the binaries with scripts/gpu.sh build" >&2
            exit 1
        fi
        built_in=$(cat .dev/built-in)
    fi
    if [ ! -e "$built_in" ]; then
        mkdir -p "$(dirname "$built_in")"
        ln -s "$PWD" "$built_in"
    fi
    "$BIN/gpu-tests" --test-threads 1 "$@"
}

# Writes synthetic models, compiles the placements of plans/synthetic/ for them, then proves
# the CUDA backend, most important first (what the budget skips comes last):
#   - gates: every plan bit-identical to the 1-rank eager CUDA run (serial and pipelined arms,
#     16 generated tokens), llama1b-shaped q8_0 and q4_1: graphs, PP-2, PP-3 uneven, PP-5,
#     TP-2, TP-4, PP-2 x TP-2, all ranks on device 0; llama8b-shaped q4_1: TP-2, TP-4, PP-2;
#   - soak: the pipelined PP-4 gate 100 times in one process, counting mismatching runs;
#   - CUDA against the CPU backend on a smol135m-shaped model, 64 greedy steps;
#   - compute-sanitizer memcheck (PP-4, 8 tokens) and racecheck (PP-2, 3 tokens), graphs;
#   - decode speed of the llama1b-shaped q4_1 plans.
# SECONDS defaults to 540.
suite_gates() {
    BUDGET=${1:-540}
    logs_in /tmp/memra-gates
    stamp name,driver_version,memory.total
    synth smol135m q8_0 &
    synth llama1b q8_0 &
    synth llama1b q4_1 &
    wait
    # the 8B shape is written while the first gates run
    synth llama8b q4_1 &
    local synth8b=$! cand
    echo "models written in $(($(date +%s) - t0)) s"
    local llama=(llama1b-eager llama1b llama1b-pp2 llama1b-pp3 llama1b-pp5 llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2)
    gates_of llama1b q8_0 "${llama[@]}"
    local smol=$P/q8_0/smol135m
    for name in smol135m smol135m-eager smol135m-pp2 smol135m-pp4; do plan smol135m q8_0 $name >/dev/null; done
    late "soak smol135m-pp4 x100" ||
        gate "soak smol135m-pp4 x100" 200 "$M/smol135m-q8_0.gguf" "$smol-eager.plan.toml" "$smol-pp4.plan.toml" --repeat 100
    # teacher-forced within the oracle's bound, as suite_moe explains: greedy, this random model
    # parts from the CPU at step 50 in every run since the first (bench/cuda-gates.md)
    late "cuda vs cpu smol135m q8_0" ||
        against_cpu "cuda vs cpu smol135m q8_0" 5e-2 "$M/smol135m-q8_0.gguf" "$smol.plan.toml" 64 --teacher-forced --conditioning 1e-6
    gates_of llama1b q4_1 "${llama[@]}"
    wait $synth8b
    gates_of llama8b q4_1 llama8b-eager llama8b-tp2 llama8b-tp4 llama8b-pp2
    for cand in llama1b-eager llama1b llama1b-pp2 llama1b-tp2; do
        late "bench $cand q4_1" ||
            bench "bench $cand q4_1" 100 "$M/llama1b-q4_1.gguf" "$P/q4_1/$cand.plan.toml" -n 128 --reps 3
    done
    # under racecheck a PP-4 decode of 8 tokens had its target killed by signal 9 twice, cause
    # not found, with 0 hazards reported; a PP-2 decode of 3 completes
    late "sanitizer memcheck" || sanitize memcheck smol135m-pp4 8
    late "sanitizer racecheck" || sanitize racecheck smol135m-pp2 3
    table
}
sentences() { # N: a prompt of N copies of one 10-word English sentence (the suites take 13
    # for a prompt of several prefill chunks, 5 for a short one)
    local _
    for _ in $(seq "$1"); do printf 'The quick brown fox jumps over the lazy dog. '; done
}
gates_of() { # shape dtype placement... (the first is the reference)
    local shape=$1 dtype=$2 ref cand
    shift 2
    ref=$(plan "$shape" "$dtype" "$1")
    for cand in "${@:2}"; do
        late "gate $cand $dtype" && continue
        gate "gate $cand $dtype" 150 "$M/$shape-$dtype.gguf" "$ref" "$(plan "$shape" "$dtype" "$cand")"
    done
}
sanitize() { # tool plan tokens
    limit 240 compute-sanitizer --tool "$1" --error-exitcode 3 "$BIN/memra-run" generate --backend cuda \
        --temp 0 -n "$3" -p "hello" --model "$M/smol135m-q8_0.gguf" "$P/q8_0/$2.plan.toml" \
        >"$LOG/$1.log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then
        row "sanitizer $1 $2 -n $3" ok "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$1.log" | head -1)"
    else
        row "sanitizer $1 $2 -n $3" FAIL "exit $rc: $(grep -E 'SUMMARY|rror' "$LOG/$1.log" | head -2 | tr '\n' ' ')"
    fi
}

# The decode-speed record of the performance issue, plus a short re-check that speed work
# kept the numerics:
#   - the CUDA self-test (every kernel against the CPU reference, TP subtrees bit-exact);
#   - gates on llama1b-shaped q4_1 (graphs, PP-3 uneven, TP-4, PP-2 x TP-2 against 1-rank eager);
#   - CUDA against the CPU backend on the smol135m-shaped q4_1 model, 64 greedy steps;
#   - `memra-run bench` (128 tokens after a one-token prompt, 3 reps after a warm-up) for the
#     smol135m, llama1b and llama8b shapes in q4_1, q8_0 and f16 (token embedding q8_0 for the
#     quantized ones): 1 rank with graphs, 1 rank eager, PP-2 on one device;
#   - the per-kernel time of one llama8b q4_1 token (the ncu-token suite, Nsight Compute).
# SECONDS defaults to 480.
suite_bench() {
    BUDGET=${1:-480}
    logs_in /tmp/memra-bench
    stamp name,driver_version,memory.total,clocks.max.sm,clocks.max.mem
    local shape dtype name cand ref rc
    # small models first, so the checks can start while the 8B files are written
    for shape in smol135m llama1b; do
        for dtype in q4_1 q8_0 f16; do synth $shape $dtype & done
    done
    wait
    for dtype in q4_1 q8_0 f16; do synth llama8b $dtype & done
    echo "small models written in $(($(date +%s) - t0)) s"

    limit 120 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
    rc=$?
    row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
    ref=$(plan llama1b q4_1 llama1b-eager)
    for cand in llama1b llama1b-pp3 llama1b-tp4 llama1b-pp2-tp2; do
        late "gate $cand q4_1" && continue
        gate "gate $cand q4_1" 120 "$M/llama1b-q4_1.gguf" "$ref" "$(plan llama1b q4_1 $cand)"
    done
    late "cuda vs cpu smol135m q4_1" ||
        against_cpu "cuda vs cpu smol135m q4_1" 5e-2 "$M/smol135m-q4_1.gguf" "$(plan smol135m q4_1 smol135m)" 64 --teacher-forced --conditioning 1e-6

    for name in smol135m smol135m-eager smol135m-pp2; do bench_shape smol135m q4_1 $name; done
    for name in llama1b llama1b-eager llama1b-pp2; do bench_shape llama1b q4_1 $name; done
    wait
    echo "8B models written by $(($(date +%s) - t0)) s"
    for dtype in q4_1 q8_0 f16; do bench_shape llama8b $dtype llama8b; done
    for name in llama8b-eager llama8b-pp2; do bench_shape llama8b q4_1 $name; done
    for dtype in q8_0 f16; do
        bench_shape llama1b $dtype llama1b
        bench_shape smol135m $dtype smol135m
    done

    if ! late "per-kernel llama8b q4_1"; then
        limit 120 bash scripts/gpu.sh ncu-token llama8b q4_1 64 >"$LOG/ncu-token.txt" 2>&1
        rc=$?
        row "per-kernel llama8b q4_1" "$(ok_or_fail $rc)" "$LOG/ncu-token.txt (its table is printed above this one)"
        tail -12 "$LOG/ncu-token.txt"
    fi
    table
}
bench_shape() { # shape dtype placement
    late "bench $3 $2" && return
    bench "bench $3 $2" 150 "$M/$1-$2.gguf" "$(plan "$1" "$2" "$3")" -n 128 --reps 3
}

# The matvec speed record of bench/cuda-speed.md: times the matvec benchmark of a baseline
# build (BEFORE, if staged), then runs the self-test with the benchmark on the build under
# test (AFTER) and the self-test under memcheck. Stage both with the build suite (copy the
# binary to the names below). Exits non-zero if a run fails.
suite_speed() {
    local before_bin=${BEFORE:-$BIN/speed_before} after_bin=${AFTER:-$BIN/speed_after}
    local before=0 after memcheck_rc
    logs_in "$LOG"
    stamp name,driver_version,clocks.sm,clocks.mem
    tables() { sed -n '/^matvec bandwidth/,/^per-op/p' "$1" | grep -v '^per-op'; }
    if [ -x "$before_bin" ]; then
        "$before_bin" --bench --no-checks >"$LOG/before.log" 2>&1
        before=$?
        echo "== before ($before_bin)"
        tables "$LOG/before.log"
    fi
    "$after_bin" --bench >"$LOG/after.log" 2>&1
    after=$?
    memcheck "$after_bin"
    memcheck_rc=$?
    echo "== after ($after_bin)"
    grep -E "^matvec_" "$LOG/after.log" | head -8
    grep -E "^  matvec_" "$LOG/after.log"
    grep -E "FAIL|rror" "$LOG/after.log" | head -20
    tables "$LOG/after.log"
    memcheck_line
    tail -1 "$LOG/after.log"
    printf '%-18s exit %s\n' "before --bench" "$before" "after --bench" "$after" "memcheck" "$memcheck_rc"
    [ "$before" -eq 0 ] && [ "$after" -eq 0 ] && [ "$memcheck_rc" -eq 0 ]
}

# The real SmolLM2-135M-Instruct Q4_1 on the CUDA backend. The model (98 MB) is larger than
# what one device call carries (64 MiB), so it travels in three parts
# (`split -n 3 -d models/SmolLM2-135M-Instruct.Q4_1.gguf`) in git-ignored folders .m1, .m2,
# .m3, carried by three consecutive calls while the machine stays warm; the first two run
#   mkdir -p /tmp/smol && cp .mN/p /tmp/smol/pN
# and the third carries .dev and .m3 and runs this suite, which joins the parts, checks the
# hash, and records: greedy text on CUDA, CUDA against the CPU backend (64 greedy steps),
# gates of the shipped SmolLM2 plans against the 1-rank eager CUDA run, perplexity and speed.
suite_real() {
    logs_in "$LOG"
    local r=$BIN/memra-run p
    join_smollm2
    stamp name,driver_version
    sed 's/^\[pipeline\]/[capture]\nmode = "eager"\n\n[pipeline]/' plans/smollm2.toml >plans/smollm2-eager.toml
    "$BIN/memra-compile" -q plans/smollm2-eager.toml
    echo "== generate (cuda, greedy)"
    limit 120 "$r" generate --backend cuda --temp 0 -n 32 --prompt "The capital of France is" plans/smollm2.plan.toml
    echo
    echo "== cuda vs cpu, 64 greedy steps"
    # the stated bound (bench/cuda-gates.md): CPU and CUDA reduce in different orders, and the
    # f16 KV cache and 8-bit activations round last-bit differences up to ~6.5e-2 relative
    limit 120 "$r" compare --backend cuda -n 64 --tolerance 1e-1 plans/smollm2.plan.toml 2>&1 | tail -3
    for p in smollm2 smollm2-pp2 smollm2-pp3 smollm2-pp2-eager-island; do
        echo "== gate $p vs 1-rank eager (cuda)"
        limit 120 "$r" gate --backend cuda -n 32 --reference plans/smollm2-eager.plan.toml "plans/$p.plan.toml" 2>&1 | tail -1
    done
    echo "== gate smollm2-tp3 vs 1-rank eager (cuda; TP-3 does not nest: a mismatch is expected)"
    limit 120 "$r" gate --backend cuda -n 8 --reference plans/smollm2-eager.plan.toml plans/smollm2-tp3.plan.toml 2>&1 | tail -1
    echo "== perplexity (cuda)"
    limit 120 "$r" perplexity --backend cuda plans/smollm2.plan.toml testdata/perplexity.txt --ctx 512 2>&1 | tail -2
    echo "== bench (cuda)"
    for p in smollm2 smollm2-eager smollm2-pp2; do
        limit 120 "$r" bench --backend cuda -n 128 --reps 3 "plans/$p.plan.toml" 2>&1 | tail -1
    done
}

# On a machine with 4 (or more) GPUs: the CUDA backend across devices. On 2 or 3 GPUs it runs
# the rows that fit (PP-2 and TP-2 on devices 0,1).
#   - the peer-access matrix (nvidia-smi) and device-to-device copy bandwidth per pair;
#   - gates against the 1-rank eager run on device 0, llama1b-shaped q8_0: PP-2 on devices
#     0,1; PP-4 uneven on 0..3; TP-2 on 0,1; TP-4 on 0..3; PP-2 x TP-2 on 0..3; each plan's
#     memory in use per device within 3% of the plan's bytes;
#   - llama8b-shaped q4_1 and f16: decode latency of TP-2 and TP-4 and tokens/s of PP-2 and
#     PP-4 against one GPU (one sequence; the executor decodes one sequence at a time);
#   - a pair of devices without P2P refused by name, when the machine has one.
suite_multi() {
    P=/tmp/memra-plans-multi
    logs_in /tmp/memra-multi
    stamp index,name,driver_version,memory.total
    local gpus cand dtype pairs out bad pair ref
    gpus=$(nvidia-smi -L | wc -l)
    if [ "$gpus" -lt 2 ]; then
        echo "the multi suite needs 2 GPUs (4 for every row); the machine has $gpus"
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
    synth llama1b q8_0
    ref=$(plan llama1b q8_0 llama1b-eager)
    for cand in llama1b-pp2 llama1b-pp4 llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2; do
        fits "$cand" || continue
        gate "gate $cand q8_0" 200 "$M/llama1b-q8_0.gguf" "$ref" "$(plan llama1b q8_0 "multi/$cand")"
        bench "bench $cand q8_0" 100 "$M/llama1b-q8_0.gguf" "$P/q8_0/$cand.plan.toml" -n 32 --reps 1
        memory_check "memory $cand"
    done

    # 3. llama8b speed: TP latency and PP throughput against one GPU
    for dtype in q4_1 f16; do
        synth llama8b "$dtype"
        for cand in llama8b llama8b-tp2 llama8b-tp4 llama8b-pp2 llama8b-pp4; do
            fits "$cand" || continue
            bench "bench $cand $dtype" 200 "$M/llama8b-$dtype.gguf" "$(plan llama8b "$dtype" "multi/$cand")" -n 128 --reps 3
        done
        rm -f "$M/llama8b-$dtype.gguf"
    done

    # 4. a pair without P2P must be refused by name (only when the machine has one)
    pair=$(awk 'NR > 1 { for (j = 2; j <= NF; j++) if ($j != "OK" && $j != "X") { print NR - 2, j - 2; exit } }' "$LOG/p2p.txt")
    if [ -n "$pair" ]; then
        read -r a b <<<"$pair"
        sed "s/ids = \[0, 1\]/ids = [$a, $b]/; s/devices = \[\[0\], \[1\]\]/devices = [[$a], [$b]]/" \
            plans/synthetic/multi/llama1b-pp2.toml >"$P/no-p2p.toml"
        sed -i 's#\.\./\.\./\.\./models#'"$PWD"'/models#' "$P/no-p2p.toml"
        ln -sf "$M/llama1b-q8_0.gguf" models/llama1b.gguf
        "$BIN/memra-compile" -o "$P/no-p2p.plan.toml" "$P/no-p2p.toml" >/dev/null
        out=$(limit 100 "$BIN/memra-run" bench --backend cuda -n 4 --reps 1 --model "$M/llama1b-q8_0.gguf" \
            "$P/no-p2p.plan.toml" 2>&1)
        if echo "$out" | grep -q "devices $a and $b have no peer-to-peer access"; then
            row "no-p2p pair $a,$b refused" ok "$(echo "$out" | tail -1 | cut -c1-200)"
        else
            row "no-p2p pair $a,$b refused" FAIL "$(echo "$out" | tail -1 | cut -c1-300)"
        fi
    else
        row "no-p2p pair refused" skip "every pair of this machine has p2p"
    fi
    table
}

# Tensor parallelism across two devices: the all-reduce alone over both transports, gates of
# TP-2 (one device; two devices, one-shot and NCCL), PP-2 and PP-2 x TP-2 with two ranks per
# GPU (one-shot and NCCL) against the 1-rank eager run, and
# llama8b decode speed of one GPU, TP-2 (one-shot, NCCL) and PP-2 on devices 0,1.
suite_tp() {
    P=/tmp/memra-plans-tp
    logs_in /tmp/memra-tp
    stamp index,name,driver_version
    local dtypes=${1-q4_1 q8_0 f16} pair out rc ref cand dtype
    nvidia-smi topo -m >"$LOG/topo.txt" 2>&1
    nccl_on_path || row "nccl library" FAIL "python3 has no nvidia.nccl"
    for pair in 0,1 0,0; do
        out=$(limit 120 "$BIN/cuda_selftest" --collective "$pair" 2>&1)
        rc=$?
        echo "$out" | tee -a "$LOG/collective.log"
        result "all-reduce $pair" $rc "$out" "$(echo "$out" | grep -E '^all-reduce|16 KiB' | paste -sd' ' | tr -s ' ' | cut -c1-220)"
    done
    synth llama1b q8_0
    ref=$(plan llama1b q8_0 llama1b-eager)
    for cand in llama1b-tp2 multi/llama1b-tp2 multi/llama1b-tp2-nccl multi/llama1b-pp2 \
        multi/llama1b-pp2-tp2-2dev multi/llama1b-pp2-tp2-2dev-nccl; do
        gate "gate $cand q8_0" 200 "$M/llama1b-q8_0.gguf" "$ref" "$(plan llama1b q8_0 "$cand")"
    done
    for dtype in $dtypes; do
        synth llama8b "$dtype"
        for cand in llama8b llama8b-tp2 llama8b-tp2-nccl llama8b-pp2; do
            bench "bench $cand $dtype" 200 "$M/llama8b-$dtype.gguf" "$(plan llama8b "$dtype" "multi/$cand")" -n 128 --reps 3
        done
        rm -f "$M/llama8b-$dtype.gguf"
        # one TP-2 rank's compute alone, as a model of its own: TP-2 minus this is what the
        # collectives and the second device cost
        synth llama8b-tp2-rank "$dtype"
        bench "bench llama8b-tp2-rank $dtype" 200 "$M/llama8b-tp2-rank-$dtype.gguf" \
            "$(plan llama8b-tp2-rank "$dtype" llama8b-tp2-rank)" -n 128 --reps 3
        rm -f "$M/llama8b-tp2-rank-$dtype.gguf"
    done
    table
}

# Qwen3-30B-A3B q4_1 decode at batch 1, 128 tokens: llama.cpp's llama-bench (-fa 1 -ngl 99)
# and memra-run bench on the same GGUF in one call. llama.cpp is built here from the pruned
# source carried in .llama/llama.cpp (CUDA, sm_90, llama-bench only, about 4 minutes), into
# /tmp/llama-build, while the model is written.
suite_llamacpp() {
    logs_in /tmp/memra-llamacpp
    stamp name,driver_version,memory.total
    local model="$M/qwen3-30b-a3b-q4_1.gguf" rc
    build_llamacpp >"$LOG/llama-build.log" 2>&1 &
    local build=$!
    synth qwen3-30b-a3b q4_1
    llamacpp_built $build
    llama_bench "llama-bench qwen3-30b-a3b q4_1" "$model"
    bench "memra qwen3-30b-a3b q4_1" 300 "$model" "$(plan qwen3-30b-a3b q4_1 cuda/qwen3-30b-a3b)" -n 128 --reps 3
    table
}

# The matvec benchmark alone while sampling the SM clock, then Nsight Compute on one launch of
# each KERNEL (default matvec_q4_1 matvec_f16) at 14336x4096, the third benchmark shape, to
# show what bounds them.
suite_profile() {
    # PROFILE_SKIP: launches of each kernel skipped before the profiled one (default 330: the
    # benchmark launches each kernel 160 times per shape, so launch 330 is in the third shape)
    local selftest=${SELFTEST:-$BIN/cuda_selftest} kernels=("$@") skip=${PROFILE_SKIP:-330} smi bench_rc k
    logs_in "$LOG"
    [ ${#kernels[@]} -eq 0 ] && kernels=(matvec_q4_1 matvec_f16)
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw --format=csv,noheader -lms 100 >"$LOG/clocks.csv" &
    smi=$!
    "$selftest" --bench --no-checks >"$LOG/bench.log" 2>&1
    bench_rc=$?
    kill "$smi"
    for k in "${kernels[@]}"; do
        ncu_detail "$LOG/ncu-$k.txt" "$k" "$skip" "$selftest" --bench --no-checks
    done
    echo "== sm clock (MHz) during the benchmark: $(cut -d, -f2 "$LOG/clocks.csv" | tr -dc '0-9\n' | sort -n | uniq -c | sort -rn | head -4 | tr '\n' ' ')"
    grep -E "^(f16|q8_0|q4_1|q4_k) |device-to-device" "$LOG/bench.log"
    sed -n '/tensor-core launches as the engine makes them/,/^$/p' "$LOG/bench.log"
    echo "bench exit $bench_rc"
}

# Writes a synthetic model, then measures every kernel of one eager decode step, the last of
# STEPS (default 64, so attention reads STEPS positions), under Nsight Compute (duration only,
# caches and clocks left alone; this machine has Nsight Compute, not Nsight Systems) and prints
# that token's kernel time by kernel. Launch gaps are not in these numbers: compare their sum
# with `memra-run bench`.
suite_ncu_token() {
    if [ $# -lt 2 ]; then
        echo "usage: scripts/gpu.sh ncu-token SHAPE DTYPE [STEPS] [PLACEMENT]" >&2
        exit 2
    fi
    local shape=$1 dtype=$2 steps=${3:-64} placement=${4:-$1-eager} model plan_path csv per_step
    logs_in "$LOG"
    model=$(ncu_model "$shape" "$dtype")
    plan_path=$(plan "$shape" "$dtype" "$placement")
    csv="$LOG/ncu-$shape-$dtype.csv"
    per_step=$(ncu_run "$model" "$plan_path" 1 2>/dev/null | grep -c '"gpu__time_duration.sum"')
    ncu_run "$model" "$plan_path" "$steps" --launch-skip $(((steps - 1) * per_step)) --launch-count "$per_step" \
        >"$csv" 2>"$LOG/ncu-$shape-$dtype.err"
    kernel_times "$csv" 1 "$shape $dtype, kernel time of one eager decode step $steps (Nsight Compute)" "us/token"
}
# Nsight Compute time of each kernel of two prefill chunks of 512 rows (bench's warm-up run
# and its timed one, each also decoding 2 tokens), per chunk.
suite_ncu_prefill() {
    if [ $# -lt 2 ]; then
        echo "usage: scripts/gpu.sh ncu-prefill SHAPE DTYPE [PLACEMENT]" >&2
        exit 2
    fi
    local shape=$1 dtype=$2 placement=${3:-$1} model csv
    logs_in "$LOG"
    model=$(ncu_model "$shape" "$dtype")
    csv="$LOG/ncu-prefill-$shape-$dtype.csv"
    ncu_times "$BIN/memra-run" bench --backend cuda --prompt 512 -n 2 --reps 1 --model "$model" \
        "$(plan "$shape" "$dtype" "$placement")" >"$csv" 2>"$LOG/ncu-prefill-$shape-$dtype.err"
    kernel_times "$csv" 2 "$shape $dtype, kernel time of a 512-row prefill chunk and 2 decode steps (Nsight Compute)" "us/chunk"
}
ncu_detail() { # log kernel skip command...: Nsight Compute's report on launch SKIP + 1 of
    # KERNEL in COMMAND (clocks left alone), into LOG, and its main lines: speed of light,
    # occupancy, the pipes and shared-memory wavefronts, the stall reasons
    local log=$1 k=$2 skip=$3
    shift 3
    ncu --clock-control none --kernel-name "$k" --launch-skip "$skip" --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
        --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
        --metrics "regex:^(smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active|l1tex__data_pipe_lsu_wavefronts_mem_shared_op_(ld|st)\.sum|l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld\.sum|smsp__inst_executed\.sum|sm__pipe_tensor_op_imma_cycles_active\.avg\.pct_of_peak_sustained_active|lts__t_bytes\.sum|dram__bytes_read\.sum)$" \
        "$@" >"$log" 2>&1
    echo "== $k (launch $((skip + 1)))"
    grep -E "SM Frequency|DRAM Throughput|Duration|Compute \(SM\) Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Grid Size|Warp Cycles Per Issued|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Executed Ipc A|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Block Limit (Reg|Shared)|Spilling Requests  " "$log" | sed 's/  */ /g'
    grep -E "^ *(smsp__inst_executed.sum|l1tex__data|sm__pipe_tensor|lts__t_bytes|dram__bytes_read) " "$log" | sed 's/  */ /g'
    # the pipes at least a tenth busy, and the stall reasons that cost a warp at least a tenth
    # of a cycle per issued instruction
    grep -E "sm__inst_executed_pipe_.*pct_of_peak" "$log" | awk '$NF + 0 >= 10 { sub("sm__inst_executed_pipe_", "", $1); sub(".avg.pct_of_peak_sustained_active", "", $1); printf "%s %s%%; ", $1, $NF } END { print "" }'
    grep -E "issue_stalled_.*_per_issue_active" "$log" | awk '$NF + 0 >= 0.1 { sub("smsp__average_warps_issue_stalled_", "", $1); sub("_per_issue_active.ratio", "", $1); printf "%s %s; ", $1, $NF } END { print "" }'
}
ncu_model() { # shape dtype: the synthetic model's path, made first if missing
    local model="$M/$1-$2.gguf"
    if [ ! -f "$model" ]; then
        # NAME-lN is the depth cut of the real-width shape NAME to N layers
        if [[ "$1" =~ ^(.*)-l([0-9]+)$ ]]; then
            synth_cut "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "$2"
        else
            synth "$1" "$2"
        fi
    fi
    echo "$model"
}
ncu_times() { # [ncu options] command...: each kernel's duration, as CSV, caches and clocks
    # left alone
    ncu --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv "$@"
}
ncu_run() { # model plan steps [ncu options]: a one-token prompt, so STEPS decode steps of
    # equal launches
    local model=$1 plan_path=$2 n=$3
    shift 3
    ncu_times "$@" "$BIN/memra-run" generate --backend cuda --temp 0 -n "$n" -p "a" --model "$model" "$plan_path"
}
kernel_times() { # csv runs title unit [base_csv]: Nsight Compute's kernel times summed per
    # kernel name (less BASE_CSV's, where given) and divided by RUNS, largest first
    python3 - "$@" <<'PY'
import csv, sys, collections
runs, unit = int(sys.argv[2]), sys.argv[4]
t = collections.defaultdict(float); n = collections.Counter()
for path, sign in [(sys.argv[1], 1)] + [(p, -1) for p in sys.argv[5:6]]:
    lines = [l for l in open(path) if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        v *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
        name = r["Kernel Name"].split("(")[0]
        t[name] += sign * v; n[name] += sign
for k in [k for k in t if n[k] == 0 and abs(t[k]) < 1.0]:
    del t[k]
total = sum(t.values())
print(f"== {sys.argv[3]}")
print(f"{'kernel':<24} {unit:>9} {'launches':>9} {'avg us':>7} {'share':>6}")
for k in sorted(t, key=t.get, reverse=True):
    avg = f"{t[k] / n[k]:7.2f}" if n[k] else f"{'-':>7}"
    print(f"{k:<24} {t[k] / runs:9.1f} {n[k] / runs:9.1f} {avg} {100 * t[k] / total:5.1f}%")
print(f"{'all kernels':<24} {total / runs:9.1f} {sum(n.values()) / runs:9.1f}")
PY
}

# Nsight Compute time of each kernel of one batched decode step of B sequences (SHAPE's
# PLACEMENT, default SHAPE-batch64): bench --batch B with 2 and with 4 tokens each (a warm-up
# run and the timed one, so 4 steps more), the difference per step.
suite_ncu_batch() {
    if [ $# -lt 3 ]; then
        echo "usage: scripts/gpu.sh ncu-batch SHAPE DTYPE B [PLACEMENT]" >&2
        exit 2
    fi
    local shape=$1 dtype=$2 b=$3 placement=${4:-$1-batch64} model plan_path n
    logs_in "$LOG"
    model=$(ncu_model "$shape" "$dtype")
    plan_path=$(plan "$shape" "$dtype" "$placement")
    for n in 2 4; do
        ncu_times "$BIN/memra-run" bench --backend cuda --batch "$b" --prompt 8 -n $n --reps 1 --model "$model" "$plan_path" \
            >"$LOG/ncu-batch$b-$shape-$dtype-n$n.csv" 2>"$LOG/ncu-batch$b-$shape-$dtype-n$n.err"
    done
    kernel_times "$LOG/ncu-batch$b-$shape-$dtype-n4.csv" 4 \
        "$shape $dtype, kernel time of one decode step of $b sequences (Nsight Compute)" "us/step" \
        "$LOG/ncu-batch$b-$shape-$dtype-n2.csv"
    # NCU_KERNELS: kernels to report on in full, each its launch NCU_SKIP + 1 of the run (the
    # prompt's launches count too: with many rows of the mma kernels, that may be a prefill one)
    local k
    for k in ${NCU_KERNELS:-}; do
        ncu_detail "$LOG/ncu-batch$b-$k.txt" "$k" "${NCU_SKIP:-40}" "$BIN/memra-run" bench --backend cuda \
            --batch "$b" --prompt 8 -n 4 --reps 1 --model "$model" "$plan_path"
    done
}

# After the real model's parts arrived (see suite_real): the CUDA self-test (sampling
# included) and sampled text on CUDA against the CPU backend with the same seed on the real
# SmolLM2 (the llama8b gates are in the gates suite).
suite_final() {
    logs_in "$LOG"
    stamp name,driver_version
    join_smollm2
    local rc cpu gpu seed
    limit 120 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
    rc=$?
    row selftest "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log")"
    grep -iE "sampl" "$LOG/selftest.log" | head -8
    for seed in 7 11; do
        cpu=$(limit 120 "$BIN/memra-run" generate --seed $seed -n 48 -p "Once upon a time," plans/smollm2.plan.toml 2>/dev/null)
        gpu=$(limit 120 "$BIN/memra-run" generate --backend cuda --seed $seed -n 48 -p "Once upon a time," plans/smollm2.plan.toml 2>/dev/null)
        echo "seed $seed cpu: $cpu"
        echo "seed $seed cuda: $gpu"
        row "sampled text seed $seed cpu vs cuda" "$([ "$cpu" = "$gpu" ] && echo same || echo diff)" "$(echo "$gpu" | head -c 80 | tr '\n' ' ')"
    done
    table
}

# qwen3moe (GQA + MoE) on the CUDA backend, on one GPU; every plan is under
# plans/synthetic/cuda/ with device ids [0]:
#   - the self-test (every kernel, the MoE router, expert matvecs and MoE graph replay against
#     the CPU kernels);
#   - gates: tiny-qwen3moe f32 and q8_0, graphs, TP-2, TP-4, EP-4 (attention replicated) and
#     PP-2 against the 1-rank eager CUDA run, every logit bit, both arms;
#   - CUDA against the CPU backend on tiny-qwen3moe, 64 greedy steps;
#   - decode speed of a Qwen3-30B-A3B-shaped depth cut (8 layers, q4_1), one rank, graphs.
# SECONDS defaults to 240.
wide_moe_gates() { # the Qwen3-30B-A3B-shaped 8-layer q4_1 cut ($M/qwen3-30b-a3b-l8-q4_1.gguf)
    # at real width against its 1-rank eager run on device 0: graphs, TP-2, TP-4, EP-4, PP-2
    local big=qwen3-30b-a3b-l8 ref cand
    ref=$(plan $big q4_1 cuda/$big-eager)
    for cand in cuda/$big cuda/$big-tp2 cuda/$big-tp4 cuda/$big-ep4 cuda/$big-pp2; do
        late "gate $cand q4_1" ||
            gate "gate $cand q4_1" 200 "$M/$big-q4_1.gguf" "$ref" "$(plan $big q4_1 "$cand")"
    done
}
suite_prefill() {
    BUDGET=${1:-420}
    logs_in /tmp/memra-prefill
    stamp name,driver_version,memory.total
    local build=""
    if [ -d .llama/llama.cpp ]; then
        build_llamacpp >"$LOG/llama-build.log" 2>&1 &
        build=$!
    fi
    synth smol135m q8_0 &
    synth llama1b q8_0 &
    synth llama1b q4_1 &
    synth llama8b q4_1 &
    local synth8b=$! rc dtype ref cand prompt model
    limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
    rc=$?
    grep -E "^(gemm|flash_attention|attention_f16 .*prefill)" "$LOG/selftest.log" | grep -v " PASS$" | head -20
    row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
    wait $synth8b
    synth llama8b q8_0 &
    local synth8b_q8=$!
    synth llama8b f16 &
    local synth8b_f16=$!
    # about 600 tokens of the synthetic tokenizer: a 512-row chunk and a shorter one, tiles
    # cut mid-way
    prompt=$(sentences 13)
    for dtype in q8_0 q4_1; do
        ref=$(plan llama1b $dtype llama1b-eager)
        for cand in llama1b llama1b-pp2 llama1b-tp2 llama1b-tp4 llama1b-pp2-tp2; do
            late "prefill gate $cand $dtype" && continue
            gate "prefill gate $cand $dtype" 150 "$M/llama1b-$dtype.gguf" "$ref" \
                "$(plan llama1b $dtype $cand)" -p "$prompt" -n 8
        done
    done
    # one process per GPU (needs two): the boundary crossings and NCCL groups carry the rows
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
        ref=$(plan llama1b q4_1 llama1b-eager)
        for cand in multi/llama1b-tp2-nccl multi/llama1b-pp2; do
            late "launched prefill gate $cand" && continue
            launched "launched prefill gate $cand" 150 "$M/llama1b-q4_1.gguf" "$ref" \
                "$(plan llama1b q4_1 $cand)" -p "$prompt" -n 8
        done
    fi
    late "cuda vs cpu smol135m q8_0 prefill" ||
        against_cpu "cuda vs cpu smol135m q8_0 prefill" 5e-2 "$M/smol135m-q8_0.gguf" \
            "$(plan smol135m q8_0 smol135m)" 16 --teacher-forced --conditioning 1e-6 -p "$prompt"
    wait $synth8b_q8 $synth8b_f16 # not a bare wait: the llama.cpp build runs on
    for dtype in q4_1 q8_0 f16; do
        late "pp512 llama8b $dtype" ||
            bench "pp512 llama8b $dtype" 150 "$M/llama8b-$dtype.gguf" "$(plan llama8b $dtype llama8b)" \
                --prompt 512 -n 16 --reps 3
    done
    memory_check "memory llama8b f16"
    # the issue's TP target: TP-2 with both ranks on one device within 10% of 1 rank
    late "pp512 llama8b-tp2 q4_1 (one device)" ||
        bench "pp512 llama8b-tp2 q4_1 (one device)" 150 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-tp2)" \
            --prompt 512 -n 16 --reps 3
    late "pp512 llama1b q4_1" ||
        bench "pp512 llama1b q4_1" 100 "$M/llama1b-q4_1.gguf" "$(plan llama1b q4_1 llama1b)" --prompt 512 -n 16 --reps 3
    late "ttft 4096 llama8b q4_1" ||
        bench "ttft 4096 llama8b q4_1" 150 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-ctx8k)" \
            --prompt 4096 -n 2 --reps 2
    late "decode llama8b q4_1" ||
        bench "decode llama8b q4_1" 100 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b)" -n 128 --reps 3
    if [ -n "$build" ]; then
        llamacpp_built $build
        for model in llama8b-q4_1 llama8b-q8_0 llama8b-f16 llama1b-q4_1; do
            late "llama-bench pp512 $model" ||
                llama_bench "llama-bench pp512 $model" "$M/$model.gguf" -p 512 -n 0
        done
        late "llama-bench pp4096 llama8b-q4_1" ||
            llama_bench "llama-bench pp4096 llama8b-q4_1" "$M/llama8b-q4_1.gguf" -p 4096 -n 0
    else
        row "llama.cpp" skip "its source was not carried (.llama/llama.cpp)"
    fi
    table
}
# MoE, MLA and KDA models' prefill on the CUDA backend, on one GPU; every plan is under
# plans/synthetic/cuda/ with device ids [0]:
#   - the self-test (its moe_rows rows: a prefill step's routed experts over token rows
#     against the CPU layer, and an expert-parallel rank's blocks bit for bit); its failing
#     rows are printed before the table;
#   - prefill gates against the 1-rank eager CUDA run, every logit bit, both arms: q8_0
#     tiny-qwen3moe (rows grouped by expert, each expert's GEMMs once per chunk),
#     tiny-deepseek2 and tiny-deepseek2-lite (MLA rows by the decode kernels at their own
#     positions, shared experts), tiny-kimi-linear (KDA rows likewise), tiny-glm5-next and
#     tiny-glm5-next-shared (the DSA indexer a grid row per token row, mHC mixing over the
#     rows, the shared layers reading their full layer's selection, a PP cut carrying it) in
#     every placement under plans/synthetic/cuda/; the tiny plans hold 256 positions, so their
#     prompt is about 230 tokens (one chunk, tiles cut mid-way);
#   - CUDA against the CPU, teacher-forced over the prompt and 16 steps, the 95th percentile
#     of the well-conditioned steps within 2.5e-2 (the prefill bound of docs/prefill.md):
#     tiny-qwen3moe q8_0, the others in f32 (in q8_0 the backends pick another expert at a
#     routing near-tie, README's known limits);
#   - the Qwen3-30B-A3B-shaped 8-layer q4_1 cut at real width (graphs, TP-2, EP-4, PP-2)
#     over about 600 tokens: a 512-row chunk and a shorter one.
# SECONDS defaults to 420. SHAPES, when given, are the tiny shapes checked (the 8-layer cut
# is then left out).
suite_prefill_arch() {
    BUDGET=${1:-420}
    logs_in /tmp/memra-prefill-arch
    stamp name,driver_version,memory.total
    local rc dtype ref cand shape suffix short prompt big=qwen3-30b-a3b-l8 synths=() synth_big=
    local shapes=("${@:2}")
    if [ ${#shapes[@]} -eq 0 ]; then
        shapes=(tiny-qwen3moe tiny-deepseek2 tiny-deepseek2-lite tiny-kimi-linear tiny-glm5-next
            tiny-glm5-next-shared)
        synth_cut qwen3-30b-a3b 8 q4_1 &
        synth_big=$!
    fi
    for shape in "${shapes[@]}"; do
        synth $shape q8_0 &
        synths+=($!)
        [ $shape = tiny-qwen3moe ] && continue
        synth $shape f32 &
        synths+=($!)
    done
    limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
    rc=$?
    grep -E "^ *(moe|dsa|hc|mla attention)" "$LOG/selftest.log" | grep -v " PASS$" | head -20
    row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
    wait "${synths[@]}"
    short=$(sentences 5)
    for shape in "${shapes[@]}"; do
        ref=$(plan $shape q8_0 cuda/$shape-eager)
        for suffix in "" -tp2 -tp4 -ep2 -ep4 -pp2 -pp4 -mla-eager; do
            cand=cuda/$shape$suffix
            [ -f "plans/synthetic/$cand.toml" ] || continue
            late "prefill gate $cand q8_0" && continue
            gate "prefill gate $cand q8_0" 150 "$M/$shape-q8_0.gguf" "$ref" \
                "$(plan $shape q8_0 "$cand")" -p "$short" -n 8
        done
        dtype=q8_0
        [ $shape = tiny-qwen3moe ] || dtype=f32
        # the prefill's products take f16 activations (unit roundoff 4.9e-4): a step where
        # noise of that size (1e-3) moves the CPU's own logits past the tolerance, an MoE
        # top-k near-tie, is reported apart; the bound (docs/prefill.md) is on the 95th
        # percentile of the other steps, since a discrete flip (a top-k or DSA near-tie the
        # one-draw check misses) makes a lone step far above the rest
        late "cuda vs cpu $shape $dtype prefill" ||
            against_cpu "cuda vs cpu $shape $dtype prefill" 2.5e-2 "$M/$shape-$dtype.gguf" \
                "$(plan $shape $dtype cuda/$shape)" 16 --teacher-forced --conditioning 1e-3 \
                --quantile 0.95 --per-step -p "$short"
    done
    if [ -n "$synth_big" ]; then
        wait $synth_big
        prompt=$(sentences 13)
        ref=$(plan $big q4_1 cuda/$big-eager)
        for cand in cuda/$big cuda/$big-tp2 cuda/$big-ep4 cuda/$big-pp2; do
            late "prefill gate $cand q4_1" && continue
            gate "prefill gate $cand q4_1" 200 "$M/$big-q4_1.gguf" "$ref" \
                "$(plan $big q4_1 "$cand")" -p "$prompt" -n 8
        done
        late "pp512 $big q4_1" ||
            bench "pp512 $big q4_1" 150 "$M/$big-q4_1.gguf" "$(plan $big q4_1 cuda/$big)" --prompt 512 -n 16 --reps 3
    fi
    # a gate whose two sides both ran token by token would pass without testing prefill
    if grep -q "prompts run token by token" "$LOG"/*.log 2>/dev/null; then
        row "prefill taken" FAIL "a run printed the token-by-token notice: $(grep -l "prompts run token by token" "$LOG"/*.log | head -3 | tr '\n' ' ')"
    else
        row "prefill taken" ok "no run printed the token-by-token notice"
    fi
    table
}

# CUDA speculative decoding of dense models (a verify step on the batched decode kernels):
#   - the gpu-tests speculation test: speculative plans on one device, PP-2 and TP-2, both
#     arms, with replayed drafts partly rejected and lookup drafts, every generated token's
#     logits bit for bit the plain plan's;
#   - llama8b-shaped q4_1 (plans/synthetic/llama8b-spec.toml, up to 4 drafts a step): plain
#     decode against speculative decoding of the plain run's own greedy continuation cut at 1
#     to 4 drafts a step (acceptance 100%): the verify step's cost against the acceptance
#     length, 128 tokens after a 512-token prompt.
# SECONDS defaults to 300.
suite_speculation() {
    BUDGET=${1:-300}
    logs_in /tmp/memra-speculation
    stamp name,driver_version,memory.total
    local rc cut plan_spec
    synth llama8b q4_1 &
    local synth_pid=$!
    limit 240 bash "$0" tests speculative >"$LOG/tests.log" 2>&1
    rc=$?
    row "gpu-tests speculative" "$(ok_or_fail $rc)" "$(grep -E '^test result' "$LOG/tests.log" | tail -1)"
    wait $synth_pid
    plan_spec=$(plan llama8b q4_1 llama8b-spec)
    for cut in 1 2 3 4; do
        late "bench llama8b-spec q4_1 replay $cut" ||
            bench "bench llama8b-spec q4_1 replay $cut" 90 "$M/llama8b-q4_1.gguf" "$plan_spec" \
                --prompt 512 -n 128 --reps 3 --draft-replay $cut
    done
    table
}

# CUDA continuous batching (executor/src/cuda/batched.rs): the kernels of a batched step bit
# for bit against the one-row decode, the batch gates (sequences together against each alone,
# bit for bit), and llama8b q4_1's aggregate decode over 1, 4, 16 and 64 sequences against
# llama.cpp's llama-batched-bench of the same file.
suite_batch() {
    BUDGET=${1:-540}
    logs_in /tmp/memra-batch
    stamp name,driver_version,memory.total
    local build=""
    if [ -d .llama/llama.cpp ]; then
        build_llamacpp llama-batched-bench >"$LOG/llama-build.log" 2>&1 &
        build=$!
    fi
    synth llama1b q4_1 &
    local synth1b=$!
    synth llama8b q4_1 &
    local synth8b=$! rc ref cand b out
    limit 300 "$BIN/cuda_selftest" --bench >"$LOG/selftest.log" 2>&1
    rc=$?
    grep -E "^(matvec_rows8|attention_f16 .*slots)" "$LOG/selftest.log" | grep -v " PASS$" | head -20
    grep -E "^(kernel|matvec_rows8_q4_1|matvec_q4_1) " "$LOG/selftest.log" | head -4
    sed -n '/decode step of B sequences/,/^$/p' "$LOG/selftest.log"
    sed -n '/tensor-core launches as the engine makes them/,/^$/p' "$LOG/selftest.log"
    row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
    wait $synth1b
    for ref in llama1b-decode self; do
        for cand in llama1b-batch8 llama1b-batch8-tp2 llama1b-batch8-pp2; do
            late "batch gate $cand vs $ref" && continue
            out=$(plan llama1b q4_1 $cand)
            gate "batch gate $cand vs $ref" 200 "$M/llama1b-q4_1.gguf" \
                "$([ $ref = self ] && echo "$out" || plan llama1b q4_1 $ref)" "$out" --batch
        done
    done
    wait $synth8b
    for ref in llama8b-decode self; do
        late "batch gate llama8b-batch64 vs $ref" && continue
        out=$(plan llama8b q4_1 llama8b-batch64)
        gate "batch gate llama8b-batch64 vs $ref" 300 "$M/llama8b-q4_1.gguf" \
            "$([ $ref = self ] && echo "$out" || plan llama8b q4_1 $ref)" "$out" --batch
    done
    # every batched run's decode steps, pad rows and graphs per bucket
    grep -h "arm: cuda graphs" "$LOG/gates.log"
    late "decode llama8b q4_1 one sequence" ||
        bench "decode llama8b q4_1 one sequence" 100 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b)" -n 128 --reps 3
    for b in 1 4 16 64; do
        late "batch $b llama8b q4_1" ||
            bench "batch $b llama8b q4_1" 200 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 llama8b-batch64)" \
                --batch $b --prompt 8 -n 128 --reps 2
    done
    grep -h "^cuda graphs" "$LOG/bench.log"
    memory_check "memory llama8b-batch64 q4_1"
    if [ -n "$build" ]; then
        llamacpp_built $build
        if ! late "llama-batched-bench llama8b-q4_1"; then
            out=$(CUDA_VISIBLE_DEVICES=0 limit 400 /tmp/llama-build/bin/llama-batched-bench \
                -m "$M/llama8b-q4_1.gguf" -c 9216 -b 2048 -ub 512 -npp 8 -ntg 128 -npl 1,4,16,64 \
                -ngl 99 -fa on 2>&1)
            rc=$?
            echo "$out" >>"$LOG/llama-batched-bench.txt"
            result "llama-batched-bench llama8b-q4_1" $rc "$out" \
                "$(echo "$out" | grep -E '^\| +8 \| +128 \|' | awk -F'|' '{ printf "B=%d S_TG %s t/s; ", $4, $9 }' | tr -s ' ')"
        fi
    else
        row "llama.cpp" skip "its source was not carried (.llama/llama.cpp)"
    fi
    table
}
# MoE continuous batching on CUDA, memra alone: the Qwen3-30B-A3B-shaped 8-layer q4_1 cut
# (memra-synth) decoded by 1, 4, 16 and 64 sequences together (bench --batch B, 8-token
# prompts, 64 tokens each), then its 64-slot plan's batch gates against itself and against
# the cut's token-by-token decode plan. Against llama.cpp on a file of its own tools:
# batch-depth.
suite_moe_batch() {
    BUDGET=${1:-300}
    logs_in /tmp/memra-moe-batch
    stamp name,driver_version,memory.total
    local big=qwen3-30b-a3b-l8 b batched ref
    synth_cut qwen3-30b-a3b 8 q4_1
    batched=$(plan $big q4_1 cuda/$big-batch64)
    for b in 1 4 16 64; do
        late "batch $b $big q4_1" ||
            bench "batch $b $big q4_1" 120 "$M/$big-q4_1.gguf" "$batched" --batch $b --prompt 8 -n 64 --reps 2
    done
    grep -h "^cuda graphs" "$LOG/bench.log"
    for ref in decode self; do
        late "batch gate $big vs $ref" && continue
        gate "batch gate $big vs $ref" 150 "$M/$big-q4_1.gguf" \
            "$([ $ref = self ] && echo "$batched" || plan $big q4_1 cuda/$big-decode)" "$batched" --batch
    done
    table
}
suite_moe_wide() {
    BUDGET=${1:-240}
    logs_in /tmp/memra-moe-wide
    stamp name,driver_version,memory.total
    synth_cut qwen3-30b-a3b 8 q4_1
    wide_moe_gates
    table
}
suite_moe() {
    BUDGET=${1:-240}
    logs_in /tmp/memra-moe
    stamp name,driver_version,memory.total
    local dtype rc tol big=qwen3-30b-a3b-l8
    synth tiny-qwen3moe f32 &
    local synth_f32=$!
    synth tiny-qwen3moe q8_0 &
    local synth_q8=$!
    local shape synth_mla=()
    for shape in tiny-deepseek2 tiny-deepseek2-lite; do
        for dtype in f32 q8_0; do
            synth $shape $dtype &
            synth_mla+=($!)
        done
    done
    "$BIN/memra-synth" --shape qwen3-30b-a3b --layers 8 --dtype q4_1 -o "$M/$big-q4_1.gguf" \
        2>"$LOG/synth-$big.log" &
    local synth_big=$!
    limit 150 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
    rc=$?
    grep -E "^(moe|  moe|mla|  mla)" "$LOG/selftest.log" | grep -v " PASS$" | head -20
    row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
    wait $synth_f32 $synth_q8
    # CUDA against the CPU: f32 as F32_AGAINST_CPU says; q8_0 teacher-forced (both
    # fed the CPU's sequence) within 5e-2 over 32 steps, the bound the CPU meets against
    # llama.cpp on these models (executor/tests/oracle.rs): an activation an ulp from an 8-bit
    # rounding boundary lands one step apart in a backend that sums in another order, and
    # these random models, with thin margins between their top logits, turn that into another
    # token (greedy runs then part, and their logits are no longer comparable)
    for dtype in q8_0 f32; do
        gates_of tiny-qwen3moe "$dtype" cuda/tiny-qwen3moe-eager cuda/tiny-qwen3moe cuda/tiny-qwen3moe-tp2 \
            cuda/tiny-qwen3moe-tp4 cuda/tiny-qwen3moe-ep4 cuda/tiny-qwen3moe-pp2
        if [ "$dtype" = f32 ]; then tol=("${F32_AGAINST_CPU[@]}"); else tol=(5e-2 32 --teacher-forced --conditioning 1e-6); fi
        late "cuda vs cpu tiny-qwen3moe $dtype" ||
            against_cpu "cuda vs cpu tiny-qwen3moe $dtype" "${tol[0]}" "$M/tiny-qwen3moe-$dtype.gguf" \
                "$P/$dtype/tiny-qwen3moe.plan.toml" "${tol[@]:1}"
    done
    # deepseek2 (MLA): the same gates and bounds, the V3 layout (q-lora) and the V2-Lite one
    wait "${synth_mla[@]}"
    for shape in tiny-deepseek2 tiny-deepseek2-lite; do
        for dtype in q8_0 f32; do
            gates_of $shape "$dtype" cuda/$shape-eager cuda/$shape cuda/$shape-tp2 cuda/$shape-pp2
            if [ "$dtype" = f32 ]; then tol=("${F32_AGAINST_CPU[@]}"); else tol=(5e-2 32 --teacher-forced --conditioning 1e-6); fi
            late "cuda vs cpu $shape $dtype" ||
                against_cpu "cuda vs cpu $shape $dtype" "${tol[0]}" "$M/$shape-$dtype.gguf" \
                    "$P/$dtype/$shape.plan.toml" "${tol[@]:1}"
        done
    done
    wait $synth_big
    wide_moe_gates
    late "bench $big q4_1" ||
        bench "bench $big q4_1" 150 "$M/$big-q4_1.gguf" "$(plan $big q4_1 cuda/$big)" -n 128 --reps 3
    table
}

# kimi-linear (KDA layers with an MLA layer every other, MoE FFNs) on the CUDA backend, on one
# GPU; every plan is under plans/synthetic/cuda/ with device ids [0]:
#   - the self-test (KDA's convolution and delta rule against the CPU kernels over several
#     tokens and their graph replay, MLA's unrotated rope parts, every other kernel); its
#     failing rows are printed before the table, each naming its case and worst value;
#   - gates: tiny-kimi-linear f32 and q8_0, graphs, TP-2, TP-4 (KDA heads and their state
#     split), EP-2 (every rank holds the whole state), PP-2 (a state per stage) and the MLA
#     layers as eager islands between captured KDA runs, against the 1-rank eager CUDA run,
#     every logit bit, both arms;
#   - CUDA against the CPU backend: f32 within 1e-3 over 64 greedy steps, q8_0 teacher-forced
#     within 5e-2 over 32 steps (the bounds and the reason of suite_moe).
# SECONDS defaults to 240.
suite_kda() {
    BUDGET=${1:-240}
    logs_in /tmp/memra-kda
    stamp name,driver_version,memory.total
    local dtype rc tol shape=tiny-kimi-linear synths=()
    for dtype in f32 q8_0; do
        synth $shape $dtype &
        synths+=($!)
    done
    limit 150 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
    rc=$?
    grep -E "^(kda|  kda|mla rope|  mla rope)" "$LOG/selftest.log" | grep -v " PASS$" | head -20
    row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
    wait "${synths[@]}"
    for dtype in f32 q8_0; do
        gates_of $shape "$dtype" cuda/$shape-eager cuda/$shape cuda/$shape-tp2 cuda/$shape-tp4 \
            cuda/$shape-ep2 cuda/$shape-pp2 cuda/$shape-mla-eager
        # q8_0: every step's error kept in $LOG/compare.log, a lone spike being an MoE top-2
        # near-tie flipped by q8 activation rounding (bench/kda-q8-compare.md)
        if [ "$dtype" = f32 ]; then tol=("${F32_AGAINST_CPU[@]}"); else tol=(5e-2 32 --teacher-forced --conditioning 1e-6 --per-step); fi
        late "cuda vs cpu $shape $dtype" ||
            against_cpu "cuda vs cpu $shape $dtype" "${tol[0]}" "$M/$shape-$dtype.gguf" \
                "$P/$dtype/$shape.plan.toml" "${tol[@]:1}"
    done
    table
}

# One process per GPU (memra-run launch) on 2 GPUs, every process with its NCCL communicators:
#   - gates against the 1-rank eager run (one process, device 0), every logit bit, both arms:
#     llama1b-shaped q8_0 TP-2 (NCCL), PP-2, PP-2 x TP-2 with two ranks per GPU (NCCL);
#     tiny-qwen3moe and tiny-deepseek2-lite q8_0 TP-2 (NCCL) and PP-2;
#   - a one-shot group across processes refused by name;
#   - llama8b-shaped q4_1 decode: one GPU, TP-2 NCCL in one process, TP-2 NCCL and PP-2 with
#     one process per GPU.
# SECONDS defaults to 300.
suite_launch() {
    BUDGET=${1:-300}
    P=/tmp/memra-plans-launch
    logs_in /tmp/memra-launch
    stamp index,name,driver_version
    local ref cand shape out
    nccl_on_path || row "nccl library" FAIL "python3 has no nvidia.nccl"
    synth llama1b q8_0 &
    synth tiny-qwen3moe q8_0 &
    synth tiny-deepseek2-lite q8_0 &
    wait
    synth llama8b q4_1 &
    local synth8b=$!
    ref=$(plan llama1b q8_0 llama1b-eager)
    for cand in multi/llama1b-tp2-nccl multi/llama1b-pp2 multi/llama1b-pp2-tp2-2dev-nccl; do
        late "launch gate $cand" ||
            launched "launch gate $cand" 200 "$M/llama1b-q8_0.gguf" "$ref" "$(plan llama1b q8_0 "$cand")"
    done
    out=$(limit 60 "$BIN/memra-run" launch "$(plan llama1b q8_0 multi/llama1b-tp2)" -- generate --backend cuda \
        -n 4 --temp 0 -p hello --model "$M/llama1b-q8_0.gguf" 2>&1)
    if echo "$out" | grep -q "spans processes"; then
        row "launch one-shot refused" ok "$(echo "$out" | grep -m1 -o 'group [0-9]* spans processes[^;]*')"
    else
        row "launch one-shot refused" FAIL "$(echo "$out" | tail -1 | cut -c1-300)"
    fi
    for shape in tiny-qwen3moe tiny-deepseek2-lite; do
        ref=$(plan $shape q8_0 cuda/$shape-eager)
        for cand in multi/$shape-tp2-nccl multi/$shape-pp2; do
            late "launch gate $cand" ||
                launched "launch gate $cand" 150 "$M/$shape-q8_0.gguf" "$ref" "$(plan $shape q8_0 "$cand")"
        done
    done
    wait $synth8b
    late "bench llama8b q4_1" ||
        bench "bench llama8b q4_1" 200 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 multi/llama8b)" -n 128 --reps 3
    if ! late "bench llama8b-tp2-nccl q4_1"; then
        bench "bench llama8b-tp2-nccl q4_1" 200 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 multi/llama8b-tp2-nccl)" -n 128 --reps 3
        memory_check "memory llama8b-tp2-nccl q4_1"
    fi
    for cand in llama8b-tp2-nccl llama8b-pp2; do
        late "launch bench $cand q4_1" ||
            launched_bench "launch bench $cand q4_1" 200 "$M/llama8b-q4_1.gguf" "$(plan llama8b q4_1 "multi/$cand")"
    done
    table
}

# DeepSeek-style models at real width and across GPUs (2 GPUs):
#   - tiny-qwen3moe and tiny-deepseek2-lite q8_0 TP-2 and PP-2 across devices 0,1 (one process);
#   - a DeepSeek-V2-Lite-shaped depth cut (4 layers, q4_1) gated against its 1-rank eager run:
#     graphs, TP-2 and PP-3 uneven on device 0, TP-2 (NCCL) and PP-2 across devices 0,1 in one
#     process and TP-2 with one process per GPU; its decode speed and memory per device;
#   - decode speed of the V2-Lite cut and of a DeepSeek-V3-shaped depth cut (4 layers: three
#     dense, one MoE; q4_1), memra against llama.cpp's llama-bench on the same files (built
#     there from the carried .llama/llama.cpp).
# SECONDS defaults to 420.
suite_deepseek() {
    BUDGET=${1:-420}
    P=/tmp/memra-plans-deepseek
    logs_in /tmp/memra-deepseek
    stamp index,name,driver_version,memory.total
    local ref cand shape rc lite=deepseek-v2-lite-l4 v3=deepseek-v3-l4
    nccl_on_path || row "nccl library" FAIL "python3 has no nvidia.nccl"
    # llama.cpp only when its source is carried (a speed-work run leaves it behind)
    local build=
    if [ -d .llama/llama.cpp ]; then
        build_llamacpp >"$LOG/llama-build.log" 2>&1 &
        build=$!
    fi
    synth_cut deepseek-v3 4 q4_1 &
    local synth_v3=$!
    synth tiny-qwen3moe q8_0 &
    synth tiny-deepseek2-lite q8_0 &
    synth_cut deepseek-v2-lite 4 q4_1
    for shape in tiny-qwen3moe tiny-deepseek2-lite; do
        ref=$(plan $shape q8_0 cuda/$shape-eager)
        for cand in multi/$shape-tp2 multi/$shape-pp2; do
            late "gate $cand q8_0" ||
                gate "gate $cand q8_0" 150 "$M/$shape-q8_0.gguf" "$ref" "$(plan $shape q8_0 "$cand")"
        done
    done
    ref=$(plan $lite q4_1 cuda/$lite-eager)
    for cand in cuda/$lite cuda/$lite-tp2 cuda/$lite-pp3 multi/$lite-tp2 multi/$lite-pp2; do
        late "gate $cand q4_1" ||
            gate "gate $cand q4_1" 200 "$M/$lite-q4_1.gguf" "$ref" "$(plan $lite q4_1 "$cand")"
    done
    late "launch gate multi/$lite-tp2" ||
        launched "launch gate multi/$lite-tp2 q4_1" 200 "$M/$lite-q4_1.gguf" "$ref" "$P/q4_1/$lite-tp2.plan.toml"
    for cand in cuda/$lite multi/$lite-tp2 multi/$lite-pp2; do
        late "bench $cand q4_1" && continue
        bench "bench $cand q4_1" 200 "$M/$lite-q4_1.gguf" "$(plan $lite q4_1 "$cand")" -n 128 --reps 3
        memory_check "memory $cand q4_1"
    done
    if [ -n "$build" ]; then
        llamacpp_built $build
        late "llama-bench $lite q4_1" || llama_bench "llama-bench $lite q4_1" "$M/$lite-q4_1.gguf"
    fi
    wait $synth_v3
    if ! late "bench $v3 q4_1"; then
        bench "bench $v3 q4_1" 200 "$M/$v3-q4_1.gguf" "$(plan $v3 q4_1 cuda/$v3)" -n 128 --reps 3
        memory_check "memory $v3 q4_1"
    fi
    if [ -n "$build" ]; then
        late "llama-bench $v3 q4_1" || llama_bench "llama-bench $v3 q4_1" "$M/$v3-q4_1.gguf"
    else
        row "llama.cpp" skip "its source was not carried (.llama/llama.cpp)"
    fi
    table
}

# glm5-next (KDA layers and MLA layers over the DSA indexer's selection, in four mHC residual
# streams, a leading dense FFN then MoE with clamped SwiGLU) on the CUDA backend, on one GPU;
# every tiny plan is under plans/synthetic/cuda/ with device ids [0]:
#   - the self-test; its failing kda (bounded decay), hc_* (mHC), dsa (indexer), mla
#     attention (over DSA cells), clamped SwiGLU and moe_layer rows are printed before the
#     table, each naming its case and worst value;
#   - gates: tiny-glm5-next f32 and q8_0, graphs, TP-2, TP-4, EP-2, PP-2 (the boundary
#     carries the four streams) and the DSA layers as eager islands between captured KDA
#     runs, against the 1-rank eager CUDA run, every logit bit, both arms;
#   - CUDA against the CPU backend: f32 within 1e-3 over 64 greedy steps, q8_0 teacher-forced
#     within 5e-2 over 32 steps (the bounds and the reason of suite_moe);
#   - the PP-4 plan gated 100 times against the eager one (q8_0);
#   - tiny-glm5-next-shared (8 layers, the MLA layers alternating full and shared indexers:
#     layers 3 and 7 reuse the selection of layers 1 and 5) f32 and q8_0: graphs, TP-2,
#     EP-2, PP-2 cut at 3 (between the full layer 1 and the shared layer 3: the boundary
#     carries the selection after the four streams), PP-4 cut at 2, 3, 6 (a KDA-only stage
#     passes the selection on) and the shared layers as eager islands, against its 1-rank
#     eager CUDA run, every logit bit, both arms; CUDA against the CPU as above;
#   - GLM-5.3-Flash at real width cut to 4 layers (plans/models/glm-5.3-flash-l4.json: 3 KDA
#     layers, an MLA+DSA layer, a dense FFN then 3 MoE layers of 256 experts; q4_k, 14.3 GB),
#     `--weights synthetic`: graphs, PP-2, TP-2 and the DSA layer eager gated against its
#     eager plan; the same cut written by `memra-synth --shape glm-5.3-flash --layers 4`
#     (plans/synthetic/cuda/glm-5.3-flash-l4-gguf.toml) decoded by memra and, with
#     .llama/llama.cpp carried (built while the gates run), by llama-bench, as is the tiny
#     q8_0 model;
#   - with 2 GPUs: all 45 layers (plans/synthetic/cuda/glm-5.3-flash-{pp2,tp2}.toml, about 88
#     GiB per device) with `--weights synthetic`: decode speed, and each gated against
#     glm-5.3-flash-pp2-eager.toml (a pipeline of whole layers: the model fits no one GPU).
# SECONDS defaults to 300.
suite_glm5() {
    BUDGET=${1:-300}
    logs_in /tmp/memra-glm5
    stamp name,driver_version,memory.total
    local s dtype rc tol ref cand more shape=tiny-glm5-next shared=tiny-glm5-next-shared
    local cut=glm-5.3-flash-l4 synths=() build=
    # llama.cpp only when its source is carried
    if [ -d .llama/llama.cpp ]; then
        build_llamacpp >"$LOG/llama-build.log" 2>&1 &
        build=$!
    fi
    for dtype in f32 q8_0; do
        synth $shape $dtype &
        synths+=($!)
        synth $shared $dtype &
        synths+=($!)
    done
    synth_cut glm-5.3-flash 4 q4_k &
    local synth_cut_pid=$!
    limit 150 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
    rc=$?
    grep -E "^ *(kda|hc|dsa|mla attention|moe_layer)|clamped" "$LOG/selftest.log" | grep -v " PASS$" | head -20
    row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
    wait "${synths[@]}"
    for s in $shape $shared; do
        # the plain model's TP-4; the shared one's PP-4 (every cut carries the selection)
        more=cuda/$shape-tp4
        [ $s = $shape ] || more=cuda/$shared-pp4
        for dtype in f32 q8_0; do
            gates_of $s "$dtype" cuda/$s-eager cuda/$s cuda/$s-tp2 $more cuda/$s-ep2 cuda/$s-pp2 \
                cuda/$s-mla-eager
            if [ "$dtype" = f32 ]; then tol=("${F32_AGAINST_CPU[@]}"); else tol=(5e-2 32 --teacher-forced --conditioning 1e-6); fi
            late "cuda vs cpu $s $dtype" ||
                against_cpu "cuda vs cpu $s $dtype" "${tol[0]}" "$M/$s-$dtype.gguf" \
                    "$(plan $s "$dtype" cuda/$s)" "${tol[@]:1}"
        done
    done
    late "soak $shape-pp4 q8_0 x100" ||
        gate "soak $shape-pp4 q8_0 x100" 240 "$M/$shape-q8_0.gguf" "$P/q8_0/$shape-eager.plan.toml" \
            "$(plan $shape q8_0 cuda/$shape-pp4)" --repeat 100
    ref=$(config_plan cuda/$cut-eager)
    for cand in $cut $cut-pp2 $cut-tp2 $cut-mla-eager; do
        late "gate $cand synthetic" ||
            gate "gate $cand synthetic" 300 "" "$ref" "$(config_plan cuda/$cand)" \
                --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 16
    done
    wait $synth_cut_pid
    # the timings from here on run after the build, not beside it: the build's cores would
    # slow memra's host side
    [ -z "$build" ] || llamacpp_built $build
    if ! late "bench $cut-gguf q4_k"; then
        bench "bench $cut-gguf q4_k" 150 "$M/$cut-q4_k.gguf" "$(plan $cut q4_k cuda/$cut-gguf)" -n 128 --reps 3
        memory_check "memory $cut-gguf q4_k"
    fi
    late "bench $shape q8_0" ||
        bench "bench $shape q8_0" 100 "$M/$shape-q8_0.gguf" "$P/q8_0/$shape.plan.toml" -n 128 --reps 3
    if [ -n "$build" ]; then
        late "llama-bench $cut q4_k" || llama_bench "llama-bench $cut q4_k" "$M/$cut-q4_k.gguf"
        late "llama-bench $shape q8_0" || llama_bench "llama-bench $shape q8_0" "$M/$shape-q8_0.gguf"
    else
        row "llama.cpp" skip "its source was not carried (.llama/llama.cpp)"
    fi
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
        # all 45 layers across the two GPUs (the quantized weights drawn on the devices): the
        # speed of PP-2 and TP-2, then each gated against the PP-2 eager run (a gate loads
        # three times: the reference, then the candidate in both arms)
        ref=$(config_plan cuda/glm-5.3-flash-pp2-eager)
        for cand in glm-5.3-flash-pp2 glm-5.3-flash-tp2; do
            late "bench $cand synthetic" ||
                bench "bench $cand synthetic" 240 "" "$(config_plan cuda/$cand)" \
                    -n 128 --reps 3 --weights synthetic
        done
        for cand in glm-5.3-flash-tp2 glm-5.3-flash-pp2; do
            late "gate $cand synthetic" ||
                gate "gate $cand synthetic" 300 "" "$ref" "$(config_plan cuda/$cand)" \
                    --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 24
        done
    else
        row "bench glm-5.3-flash-pp2 synthetic" skip "one GPU; the plan needs two"
    fi
    table
}

# ---- depth: memra against llama.cpp after a long context, on files of llama.cpp's own tools
# (the method of issue 36: the same GGUF for both, written by gguf-py, quantized by
# llama-quantize, decode timed at context depths 0, 512 and 4096).
#   - files: scripts/depth_models.py writes each model's depth cut at real widths in F16 with
#     the gguf wheel the caller carries in .dev/wheels (scripts/fetch-depth-wheels.sh; the
#     image's numpy, tqdm and pyyaml serve it), into a tmpfs when one can be mounted (the
#     GLM-5.3-Flash cut is 49 GB in F16), else into /tmp/memra-models; a CPU-only
#     llama-quantize, built first, makes Q4_1 with a Q8_0 token embedding of each
#     (`llama-quantize --token-embedding-type q8_0 F16 OUT Q4_1`) while llama-bench's CUDA
#     build runs; `depth_models.py cut` then keeps half of the blocks of the quantized file,
#     the same weights: the first half, or for kimi-linear and glm5-next the second
#     (depth_half_from);
#   - models (the order of the rows; MODEL... picks some): qwen3moe (Qwen3-30B-A3B widths, 4
#     layers), deepseek2 (DeepSeek-V2-Lite, MLA, 4 layers), kimi-linear (Kimi-Linear-48B-A3B,
#     KDA, KDA, KDA, MLA), llama8b (Llama-3-8B, all 32 layers), glm5-next (GLM-5.3-Flash, KDA,
#     KDA, KDA, MLA+DSA in mHC streams; attention.indexer.types written as the converter
#     writes a config's indexer_types, KDA layers false and DSA layers alternating full and
#     shared; DEPTH_INDEXER_TYPES=omit writes the file of a config without them, which
#     decodes the same in a cut of one DSA layer);
#   - timing, after the build, one GPU: `llama-bench -p 0 -n 128 -d 0,512,4096` (-fa 1, -ngl
#     99, -r 3) and `memra-run bench --prompt D -n 128 --reps 2` of plans/synthetic/depth/
#     at D = 0 and 4096, each model's half cut right after (llama-bench -d 0,4096 and memra
#     at D = 0 and 4096); then memra at D = 512 (what the budget skips comes last);
#   - batch-depth: `llama-batched-bench -npp 8 -ntg 128 -npl 1,4,16,64` (-fa on, -ngl 99) and
#     `memra-run bench --batch B --prompt 8 -n 128 --reps 2` of the cut's -batch64 placement,
#     B = 1, 4, 16, 64; its `= ` rows: aggregate tok/s of both and their ratio, 64 sequences
#     against one, and the per-token latency of 16 against one; then `gate --batch` of the
#     -batch64 plan against itself and against the cut's -decode plan (bit for bit);
#   - the last rows, `= MODEL ...`: per model and depth, memra's and llama.cpp's decode tok/s
#     and their ratio (memra / llama.cpp), and the time a layer adds. With t(L) = 1e6 / tok/s
#     the microseconds a token takes in a cut of L blocks, and H = L / 2,
#         us per layer = (t(L) - t(H)) / (L - H),
#     the difference of two layer counts of the same file at the same context depth: the
#     embedding, the output head and the per-token overhead cancel. For the 4-layer cuts it
#     is the mean of blocks 2 and 3 (both MoE), for kimi-linear and glm5-next of blocks 0
#     and 1 (two KDA blocks, the first with a dense FFN), for llama8b of blocks 16 to 31.
# SECONDS defaults to 480 (a row that would start later is skipped); about 4 minutes of it
# are the llama.cpp builds. DEPTH_TINY=1 writes the small widths of depth_models.py --tiny
# instead (a check of the files' pipeline; plans/synthetic/depth/ holds the real cuts only).
depth_layers() { # model: the blocks of its cut
    depth_py size "$1" ${DEPTH_TINY:+--tiny} | sed -n 's/^[^ ]* l\([0-9]*\) .*/\1/p'
}
depth_half_from() { # model: the first block of its half cut. The hybrid models at real widths
    # (kimi-linear, glm5-next: KDA, KDA, KDA, MLA) keep their second half, whose MLA block
    # llama.cpp needs (it cannot load a cut of KDA blocks alone: GGML_ASSERT(buffer)); every
    # other cut, and the tiny ones (whose blocks alternate), keep their first half
    case "$1:${DEPTH_TINY:-}" in
    kimi-linear: | glm5-next:) echo $(($(depth_layers "$1") / 2)) ;;
    *) echo 0 ;;
    esac
}
depth_quantizer() { # a CPU-only llama-quantize at /tmp/llama-quantize/bin, so that the files are
    # quantized while the CUDA build of llama-bench (build_llamacpp) runs
    cmake -S .llama/llama.cpp -B /tmp/llama-quantize -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release &&
        cmake --build /tmp/llama-quantize --target llama-quantize -j "$(nproc)"
}
depth_py() { # scripts/depth_models.py ARGS with the carried gguf
    PYTHONPATH=/tmp/depth-site python3 scripts/depth_models.py "$@"
}
depth_write() { # F16DIR MODEL...: writes each model's F16 cut, then $DEPTH_DONE/MODEL.written (or
    # .fail), waiting for room first while earlier files are still being quantized
    local dir=$1 m need avail waited types=()
    shift
    [ "${DEPTH_INDEXER_TYPES:-}" != omit ] || types=(--no-indexer-types)
    for m; do
        need=$(depth_py size "$m" ${DEPTH_TINY:+--tiny} "${types[@]}" | awk '{ print $(NF - 1) }')
        waited=0
        while avail=$(df --output=avail -B1 "$dir" | tail -1) && [ "$avail" -lt $((need + (1 << 30))) ]; do
            if [ $waited -ge 300 ] || [ -z "$(ls "$dir"/*.gguf 2>/dev/null)" ]; then break; fi
            sleep 2
            waited=$((waited + 2))
        done
        if [ "$avail" -lt $((need + (1 << 30))) ]; then
            echo "no room: $need bytes of F16 and $avail free in $dir" >"$DEPTH_DONE/$m.fail"
        elif depth_py write "$m" --out "$dir" ${DEPTH_TINY:+--tiny} "${types[@]}" >>"$LOG/write.log" 2>&1; then
            touch "$DEPTH_DONE/$m.written"
        else
            echo "depth_models.py write $m: $(tail -1 "$LOG/write.log")" >"$DEPTH_DONE/$m.fail"
        fi
    done
}
depth_quantize() { # F16DIR MODEL...: each written cut quantized into $M, its F16 removed, the
    # half cut made (not for the prefill mode, which times the full cut alone: DEPTH_HALF=0);
    # then $DEPTH_DONE/MODEL.ok (or .fail)
    local dir=$1 m l f16 out
    shift
    for m; do
        l=$(depth_layers "$m")
        f16="$dir/depth-$m-l$l-f16.gguf" out="$M/depth-$m-l$l-q4_1.gguf"
        while [ ! -e "$DEPTH_DONE/$m.written" ] && [ ! -e "$DEPTH_DONE/$m.fail" ]; do sleep 1; done
        [ -e "$DEPTH_DONE/$m.written" ] || continue
        if ! /tmp/llama-quantize/bin/llama-quantize --token-embedding-type q8_0 "$f16" "$out" Q4_1 \
            >>"$LOG/quantize.log" 2>&1; then
            echo "llama-quantize $m: $(tail -1 "$LOG/quantize.log")" >"$DEPTH_DONE/$m.fail"
        elif [ "${DEPTH_HALF:-1}" = 1 ] && ! depth_py cut "$out" "$M/depth-$m-l$((l / 2))-q4_1.gguf" \
            --layers $((l / 2)) --from "$(depth_half_from "$m")" >>"$LOG/write.log" 2>&1; then
            echo "depth_models.py cut $m: $(tail -1 "$LOG/write.log")" >"$DEPTH_DONE/$m.fail"
        else
            touch "$DEPTH_DONE/$m.ok"
        fi
        rm -f "$f16"
    done
}
depth_ready() { # model: true once its files are made; a FAIL row when they could not be, a
    # skip row past the budget
    while [ ! -e "$DEPTH_DONE/$1.ok" ] && [ ! -e "$DEPTH_DONE/$1.fail" ]; do
        late "files $1" && return 1
        sleep 2
    done
    if [ -e "$DEPTH_DONE/$1.fail" ]; then
        row "files $1" FAIL "$(head -1 "$DEPTH_DONE/$1.fail" | cut -c1-200)"
        return 1
    fi
    row "files $1" ok "$(ls -l "$M"/depth-"$1"-l*-q4_1.gguf | awk '{ printf "%s %.2f GB  ", $NF, $5 / 1e9 }' | sed "s|$M/||g")"
}
depth_llama() { # model layers depths: llama-bench of the cut; each depth's tg128 tok/s into
    # lcpp[model-lL-dD]
    local m=$1 l=$2 name="llama-bench $1 l$2" from d tps
    from=$(wc -l <"$LOG/llama-bench.txt")
    late "$name" && return
    llama_bench "$name" "$M/depth-$m-l$l-q4_1.gguf" -p 0 -n 128 -d "$3"
    # | model | size | params | backend | ngl | fa | test | t/s |: "tg128" at depth 0, else "tg128 @ dD"
    while read -r d tps; do
        lcpp[$m-l$l-d$d]=$tps
    done < <(tail -n +$((from + 1)) "$LOG/llama-bench.txt" | awk -F'|' 'NF > 3 && $(NF - 2) ~ /tg128/ {
        d = 0; if (match($(NF - 2), /@ d[0-9]+/)) d = substr($(NF - 2), RSTART + 3, RLENGTH - 3)
        split($(NF - 1), v, "±"); gsub(/ /, "", v[1]); print d, v[1] }')
}
depth_plan() { # model layers name [suffix]: the cut's plan (of its placement NAME-SUFFIX: -long
    # for the long context), compiled afresh, into `plan`; a FAIL row for check NAME (and
    # status 1) where memra-compile refuses it
    local m=$1 l=$2 suffix=${4:-}
    rm -f "$P/q4_1/depth-$m-l$l$suffix.plan.toml"
    plan=$(plan "depth-$m-l$l" q4_1 "depth/depth-$m-l$l$suffix")
    [ -f "$plan" ] && return
    row "$3" FAIL "memra-compile: $(grep -a 'error' "$LOG/compile.log" | tail -1 | cut -c1-300)"
    return 1
}
depth_memra() { # model layers depth [suffix]: memra-run bench of the cut (on its placement with
    # SUFFIX, see depth_plan); tok/s into mem[model-lL-dD]
    local m=$1 l=$2 d=$3 name="memra $1 l$2 d$3" plan
    late "$name" && return
    depth_plan "$m" "$l" "$name" "${4:-}" || return
    bench "$name" 300 "$M/depth-$m-l$l-q4_1.gguf" "$plan" --prompt "$d" -n 128 --reps 2
    mem[$m-l$l-d$d]=$(echo "$bench_out" | sed -n 's/.* reps: \([0-9.]*\) ± .*/\1/p' | tail -1)
}
depth_llama_prompt() { # model layers: llama-bench pp512 and pp4096 of the cut into
    # lcpp[model-lL-pN]
    local m=$1 l=$2 name="llama-bench $1 l$2 pp" from n tps
    from=$(wc -l <"$LOG/llama-bench.txt")
    late "$name" && return
    llama_bench "$name" "$M/depth-$m-l$l-q4_1.gguf" -p 512,4096 -n 0
    while read -r n tps; do
        lcpp[$m-l$l-p$n]=$tps
    done < <(tail -n +$((from + 1)) "$LOG/llama-bench.txt" | awk -F'|' 'NF > 3 && $(NF - 2) ~ /pp[0-9]+/ {
        t = $(NF - 2); gsub(/[ p]/, "", t); split($(NF - 1), v, "±"); gsub(/ /, "", v[1]); print t, v[1] }')
}
depth_memra_prompt() { # model layers tokens: memra-run bench --prompt of the cut; prefill tok/s
    # into mem[model-lL-pN]
    local m=$1 l=$2 n=$3 name="memra $1 l$2 pp$3" plan
    late "$name" && return
    depth_plan "$m" "$l" "$name" || return
    bench "$name" 300 "$M/depth-$m-l$l-q4_1.gguf" "$plan" --prompt "$n" -n 2 --reps 3
    mem[$m-l$l-p$n]=$(echo "$bench_out" | sed -n 's/.*prompt [0-9]* tokens ([^)]*): \([0-9.]*\) ± .*/\1/p' | tail -1)
}
depth_llama_batch() { # model layers: llama-batched-bench of the cut, 1, 4, 16 and 64 sequences
    # of an 8-token prompt and 128 tokens; each count's S_TG tok/s into lcpp[model-lL-bB]
    local m=$1 l=$2 name="llama-batched-bench $1 l$2" out rc b tps
    late "$name" && return
    out=$(CUDA_VISIBLE_DEVICES=0 limit "$(capped 400)" /tmp/llama-build/bin/llama-batched-bench \
        -m "$M/depth-$m-l$l-q4_1.gguf" -c 9216 -b 2048 -ub 512 -npp 8 -ntg 128 -npl 1,4,16,64 \
        -ngl 99 -fa on 2>&1)
    rc=$?
    echo "$out" >>"$LOG/llama-batched-bench.txt"
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    while read -r b tps; do
        lcpp[$m-l$l-b$b]=$tps
    done < <(echo "$out" | awk -F'|' '$2 + 0 == 8 && $3 + 0 == 128 { v = $9; gsub(/ /, "", v); print $4 + 0, v }')
    result "$name" $rc "$out" "$(echo "$out" | awk -F'|' '$2 + 0 == 8 && $3 + 0 == 128 { printf "B=%d S_TG %s t/s; ", $4, $9 }' | tr -s ' ')"
}
depth_memra_batch() { # model layers plan sequences: memra-run bench --batch of the cut's
    # -batch64 plan; aggregate tok/s into mem[model-lL-bB]
    local m=$1 l=$2 b=$4 name="memra $1 l$2 batch$4"
    late "$name" && return
    bench "$name" 300 "$M/depth-$m-l$l-q4_1.gguf" "$3" --batch "$b" --prompt 8 -n 128 --reps 2
    mem[$m-l$l-b$b]=$(echo "$bench_out" | sed -n 's/.*: \([0-9.]*\) ± [0-9.]* tok\/s aggregate.*/\1/p' | tail -1)
}
depth_batch_gates() { # model layers plan: the cut's -batch64 plan against itself and against
    # its -decode plan (one sequence, prompts token by token), gate --batch
    local m=$1 l=$2 batched=$3 ref decode
    depth_plan "$m" "$l" "memra $m l$l batch gates" -decode || return
    decode=$plan
    for ref in decode self; do
        late "batch gate $m l$l vs $ref" && continue
        gate "batch gate $m l$l vs $ref" 200 "$M/depth-$m-l$l-q4_1.gguf" \
            "$([ $ref = self ] && echo "$batched" || echo "$decode")" "$batched" --batch
    done
}
depth_batch_summary() { # model: its `= ` batch rows (see depth_suite)
    local m=$1 l b a c
    l=$(depth_layers "$m")
    for b in 1 4 16 64; do
        a=${mem[$m-l$l-b$b]:-} c=${lcpp[$m-l$l-b$b]:-}
        if [ -n "$a" ] && [ -n "$c" ]; then
            row "= $m l$l batch $b" ok "$(awk -v a="$a" -v b="$c" 'BEGIN { printf "memra %.1f vs llama.cpp %.1f tok/s aggregate: %.2fx", a, b, a / b }')"
        else
            row "= $m l$l batch $b" skip "memra ${a:-none}, llama.cpp ${c:-none} tok/s"
        fi
    done
    a=${mem[$m-l$l-b1]:-} b=${mem[$m-l$l-b16]:-} c=${mem[$m-l$l-b64]:-}
    if [ -n "$a" ] && [ -n "$b" ] && [ -n "$c" ]; then
        row "= $m l$l batch scaling" ok "$(awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN { printf "64 sequences %.1fx one; per-token latency at 16 %.2fx one", c / a, 16 * a / b }')"
    else
        row "= $m l$l batch scaling" skip "needs batch 1, 16 and 64 timed"
    fi
}
depth_prefill_summary() { # model: its `= ` prompt rows (see depth_suite)
    local m=$1 l n a b
    l=$(depth_layers "$m")
    for n in 512 4096; do
        a=${mem[$m-l$l-p$n]:-} b=${lcpp[$m-l$l-p$n]:-}
        if [ -n "$a" ] && [ -n "$b" ]; then
            row "= $m l$l pp$n" ok "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "memra %.1f vs llama.cpp %.1f tok/s: %.3fx", a, b, a / b }')"
        else
            row "= $m l$l pp$n" skip "memra ${a:-none}, llama.cpp ${b:-none} tok/s"
        fi
    done
}
# The long-context depth of depth-long, within its placements' max_context.
LONG_DEPTH=32768
depth_long_summary() { # model: its `= ` row (see depth_suite)
    local m=$1 l a b
    l=$(depth_layers "$m")
    a=${mem[$m-l$l-d$LONG_DEPTH]:-} b=${lcpp[$m-l$l-d$LONG_DEPTH]:-}
    if [ -n "$a" ] && [ -n "$b" ]; then
        row "= $m l$l d$LONG_DEPTH" ok "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "memra %.1f vs llama.cpp %.1f tok/s: %.2fx", a, b, a / b }')"
    else
        row "= $m l$l d$LONG_DEPTH" skip "memra ${a:-none}, llama.cpp ${b:-none} tok/s"
    fi
}
depth_decode_summary() { # model: its `= ` rows (see depth_suite)
    local m=$1 l h d a b
    l=$(depth_layers "$m")
    h=$((l / 2))
    for d in 0 512 4096; do
        a=${mem[$m-l$l-d$d]:-} b=${lcpp[$m-l$l-d$d]:-}
        if [ -n "$a" ] && [ -n "$b" ]; then
            row "= $m l$l d$d" ok "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "memra %.1f vs llama.cpp %.1f tok/s: %.2fx", a, b, a / b }')"
        else
            row "= $m l$l d$d" skip "memra ${a:-none}, llama.cpp ${b:-none} tok/s"
        fi
    done
    for d in 0 4096; do
        if [ -n "${mem[$m-l$l-d$d]:-}" ] && [ -n "${mem[$m-l$h-d$d]:-}" ] &&
            [ -n "${lcpp[$m-l$l-d$d]:-}" ] && [ -n "${lcpp[$m-l$h-d$d]:-}" ]; then
            row "= $m per layer d$d" ok "$(awk -v ml="${mem[$m-l$l-d$d]}" -v mh="${mem[$m-l$h-d$d]}" \
                -v ll="${lcpp[$m-l$l-d$d]}" -v lh="${lcpp[$m-l$h-d$d]}" -v l="$l" -v h="$h" 'BEGIN {
                    a = (1e6 / ml - 1e6 / mh) / (l - h); b = (1e6 / ll - 1e6 / lh) / (l - h)
                    printf "memra %.1f vs llama.cpp %.1f us per layer (l%d - l%d): %.2fx", a, b, l, h, a / b }')"
        else
            row "= $m per layer d$d" skip "needs both cuts timed by both"
        fi
    done
}
suite_depth() { depth_suite decode "$@"; }
suite_prefill_depth() { depth_suite prefill "$@"; }
suite_depth_long() { depth_suite long "$@"; }
suite_batch_depth() { depth_suite batch "$@"; }
depth_suite() { # decode|prefill [BUDGET] [MODEL...]: the files, then the timings of the mode
    local mode=$1
    shift
    BUDGET=480
    if [[ ${1:-} =~ ^[0-9]+$ ]]; then BUDGET=$1 && shift; fi
    local models=("$@") m l f16 mounted= build quantizer writer quantizing plan batched
    if [ ${#models[@]} -eq 0 ]; then
        models=(qwen3moe deepseek2 kimi-linear llama8b glm5-next)
        [ "$mode" = long ] && models=(llama8b deepseek2)
        [ "$mode" = batch ] && models=(qwen3moe deepseek2 kimi-linear)
    fi
    local -A mem=() lcpp=()
    logs_in /tmp/memra-depth
    stamp name,driver_version,memory.total
    DEPTH_DONE=/tmp/memra-depth/done
    rm -rf "$DEPTH_DONE" && mkdir -p "$DEPTH_DONE"
    : >"$LOG/llama-bench.txt"
    [ -d .llama/llama.cpp ] || { row "llama.cpp" FAIL "no .llama/llama.cpp: make it with scripts/fetch-llamacpp.sh and carry it"; table; }
    if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/depth-site .dev/wheels/*.whl >"$LOG/wheels.log" 2>&1 ||
        ! PYTHONPATH=/tmp/depth-site python3 -c 'import gguf, numpy; print("gguf", gguf.__file__, "numpy", numpy.__version__)' >>"$LOG/wheels.log" 2>&1; then
        row "gguf wheel" FAIL "$(tail -1 "$LOG/wheels.log" | cut -c1-200) (scripts/fetch-depth-wheels.sh makes .dev/wheels; carry .dev)"
        table
    fi
    row "gguf wheel" ok "$(tail -1 "$LOG/wheels.log")"
    # llama-bench's build yields (nice 5) to the files' writing and quantizing, which are the
    # longer way to the first timing
    local targets=(llama-bench)
    [ "$mode" = batch ] && targets=(llama-batched-bench)
    (renice -n 5 -p $BASHPID >/dev/null && build_llamacpp "${targets[@]}") >"$LOG/llama-build.log" 2>&1 &
    build=$!
    depth_quantizer >"$LOG/quantizer-build.log" 2>&1 &
    quantizer=$!
    # the F16 files in memory: a tmpfs of its own (the image's /dev/shm is sized from the
    # memory seen at boot, a quarter of the machine's)
    f16=/tmp/memra-depth-f16
    mkdir -p "$f16"
    if mount -t tmpfs -o size=100g tmpfs "$f16" 2>"$LOG/mount.log"; then mounted=1; else f16=$M/depth-f16; mkdir -p "$f16"; fi
    depth_write "$f16" "${models[@]}" &
    writer=$!
    wait $quantizer
    row "llama-quantize build (cpu)" "$(ok_or_fail $?)" "$(tail -1 "$LOG/quantizer-build.log" | cut -c1-120)"
    [ "$mode" = decode ] || DEPTH_HALF=0
    depth_quantize "$f16" "${models[@]}" &
    quantizing=$!
    # the timings run after the build, not beside it: its cores would slow memra's host side;
    # files still being written or quantized then yield to them
    llamacpp_built $build
    renice -n 10 -p $writer $quantizing $(pgrep -P $writer) $(pgrep -P $quantizing) >/dev/null 2>&1
    # a model's half cut right after its full one, so that a budget that stops part way still
    # leaves the models it reached with their time per layer
    for m in "${models[@]}"; do
        depth_ready "$m" || continue
        l=$(depth_layers "$m")
        if [ "$mode" = prefill ]; then
            depth_llama_prompt "$m" "$l"
            depth_memra_prompt "$m" "$l" 512
            depth_memra_prompt "$m" "$l" 4096
            continue
        fi
        if [ "$mode" = batch ]; then
            depth_llama_batch "$m" "$l"
            depth_plan "$m" "$l" "memra $m l$l batch plan" -batch64 || continue
            batched=$plan
            for b in 1 4 16 64; do depth_memra_batch "$m" "$l" "$batched" $b; done
            depth_batch_gates "$m" "$l" "$batched"
            continue
        fi
        if [ "$mode" = long ]; then
            depth_llama "$m" "$l" $LONG_DEPTH
            depth_memra "$m" "$l" $LONG_DEPTH -long
            continue
        fi
        depth_llama "$m" "$l" 0,512,4096
        depth_memra "$m" "$l" 0
        depth_memra "$m" "$l" 4096
        depth_llama "$m" $((l / 2)) 0,4096
        depth_memra "$m" $((l / 2)) 0
        depth_memra "$m" $((l / 2)) 4096
    done
    for m in "${models[@]}"; do
        [ "$mode" = decode ] && [ -e "$DEPTH_DONE/$m.ok" ] && depth_memra "$m" "$(depth_layers "$m")" 512
    done
    kill $writer $quantizing 2>/dev/null
    wait $writer $quantizing 2>/dev/null
    [ -z "$mounted" ] || umount "$f16" 2>/dev/null
    for m in "${models[@]}"; do "depth_${mode}_summary" "$m"; done
    table
}

# ---- smoke: the first call on a fresh tree: is the tree that was never on a GPU sound?
#   the self-test (every kernel against the CPU reference, the device's synthetic blocks
#   against the host's); prefill gates of llama1b (graphs, TP-2, PP-2 x TP-2) over a two-chunk
#   prompt and of the tiny MoE/MLA/KDA models (TP-2, EP-4, PP-2); tiny-glm5-next gates in f32
#   and q8_0 (graphs, TP-2, PP-2, DSA eager) and its CUDA against the CPU; the GLM-5.3-Flash
#   4-layer cut's graphs and TP-2 gated against its eager plan with synthetic weights; the
#   batch gates of llama1b (8 slots, one device and TP-2) against the one-sequence decode.
#   SECONDS defaults to 300; about 90 s on an H200.
suite_smoke() {
    BUDGET=${1:-300}
    logs_in /tmp/memra-smoke
    stamp name,driver_version,memory.total
    local s shape cand dtype ref rc
    synth llama1b q4_1 &
    for s in tiny-qwen3moe tiny-deepseek2 tiny-kimi-linear tiny-glm5-next; do synth $s q8_0 & done
    synth tiny-glm5-next f32 &
    limit 200 "$BIN/cuda_selftest" >"$LOG/selftest.log" 2>&1
    rc=$?
    grep -E "PASS|FAIL" "$LOG/selftest.log" | grep -v " PASS$" | head -20
    row "selftest" "$(ok_or_fail $rc)" "$(tail -1 "$LOG/selftest.log" | cut -c1-120)"
    wait
    local prompt short
    prompt=$(sentences 13)
    short=$(sentences 5)
    ref=$(plan llama1b q4_1 llama1b-eager)
    for cand in llama1b llama1b-tp2 llama1b-pp2-tp2; do
        late "prefill gate $cand q4_1" ||
            gate "prefill gate $cand q4_1" 120 "$M/llama1b-q4_1.gguf" "$ref" \
                "$(plan llama1b q4_1 $cand)" -p "$prompt" -n 8
    done
    for s in tiny-qwen3moe:tp2 tiny-qwen3moe:ep4 tiny-deepseek2:tp2 tiny-kimi-linear:tp2 tiny-kimi-linear:pp2; do
        shape=${s%:*} cand=cuda/${s%:*}-${s#*:}
        late "prefill gate $cand q8_0" ||
            gate "prefill gate $cand q8_0" 120 "$M/$shape-q8_0.gguf" \
                "$(plan $shape q8_0 cuda/$shape-eager)" "$(plan $shape q8_0 $cand)" -p "$short" -n 8
    done
    for dtype in f32 q8_0; do
        gates_of tiny-glm5-next $dtype cuda/tiny-glm5-next-eager cuda/tiny-glm5-next \
            cuda/tiny-glm5-next-tp2 cuda/tiny-glm5-next-pp2 cuda/tiny-glm5-next-mla-eager
    done
    late "cuda vs cpu tiny-glm5-next f32" ||
        against_cpu "cuda vs cpu tiny-glm5-next f32" 1e-3 "$M/tiny-glm5-next-f32.gguf" \
            "$(plan tiny-glm5-next f32 cuda/tiny-glm5-next)" 64
    # real widths (q4_k products of 6144 columns, the 24 x 24576 mHC mixes), weights drawn on
    # the device
    ref=$(config_plan cuda/glm-5.3-flash-l4-eager)
    for cand in glm-5.3-flash-l4 glm-5.3-flash-l4-tp2; do
        late "gate $cand synthetic" ||
            gate "gate $cand synthetic" 120 "" "$ref" "$(config_plan cuda/$cand)" \
                --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 16
    done
    for cand in llama1b-batch8 llama1b-batch8-tp2; do
        late "batch gate $cand vs llama1b-decode" ||
            gate "batch gate $cand vs llama1b-decode" 150 "$M/llama1b-q4_1.gguf" \
                "$(plan llama1b q4_1 llama1b-decode)" "$(plan llama1b q4_1 $cand)" --batch
    done
    table
}

# sourced by an experiment's own script (`source scripts/gpu.sh`, then its rows and `table`):
# the helpers above, no suite
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
SUITE=${1:-}
case "$SUITE" in
build | smoke | selftest | tests | gates | bench | speed | real | multi | tp | moe | moe-wide | prefill | prefill-arch | kda | glm5 | batch | llamacpp | launch | deepseek | depth | depth-long | prefill-depth | batch-depth | moe-batch | speculation | profile | ncu-token | ncu-prefill | ncu-batch | final)
    shift
    "suite_${SUITE//-/_}" "$@"
    ;;
*)
    sed -n '2,/^set /p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
