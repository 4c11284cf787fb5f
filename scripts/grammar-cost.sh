#!/usr/bin/env bash
# What llguidance's constraint costs per token: chat turns of 200 sampled tokens on a running
# `memra-run serve`, free and under a JSON schema (whose story string is long enough that
# every turn runs to max_tokens), in interleaved blocks of 4 turns; per block the decode rate
# (wall clock, tokens over the block's time) and the server's CPU time per token (utime +
# stime of /proc/PID/stat, so less sensitive to other processes on the machine).
#
# Usage: scripts/grammar-cost.sh http://127.0.0.1:PORT SERVER_PID [BLOCKS]  (default 3 blocks)
set -euo pipefail
die() { echo "grammar-cost.sh: error: $*" >&2; exit 1; }
[[ $# -ge 2 && $# -le 3 ]] || die "usage: scripts/grammar-cost.sh http://HOST:PORT SERVER_PID [BLOCKS]"
URL="${1%/}/v1/chat/completions"
PID="$2"
BLOCKS="${3:-3}"
[[ -r /proc/$PID/stat ]] || die "no process $PID to read the CPU time of (this machine's /proc)"
command -v curl >/dev/null 2>&1 || die "curl is required"
MSG='[{"role": "user", "content": "Tell me a long story about a dragon, as JSON."}]'
SCHEMA='{"type": "json_schema", "json_schema": {"name": "story", "schema": {"type": "object", "properties": {"title": {"type": "string"}, "story": {"type": "string", "minLength": 2000}}, "required": ["title", "story"]}}}'
TICK_MS=$(awk "BEGIN {print 1000 / $(getconf CLK_TCK)}")
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
for block in $(seq 1 "$BLOCKS"); do
    for kind in free schema; do
        format=""
        [[ $kind == schema ]] && format=", \"response_format\": $SCHEMA"
        t0=$(ticks) s0=$(date +%s.%N) n=0
        for turn in 1 2 3 4; do
            body="{\"messages\": $MSG, \"max_tokens\": 200, \"temperature\": 0.8, \"seed\": $block$turn$format}"
            got=$(curl -sS "$URL" -d "$body" | python3 -c 'import json, sys; print(json.load(sys.stdin)["usage"]["completion_tokens"])') \
                || die "a $kind turn failed"
            n=$((n + got))
        done
        t1=$(ticks) s1=$(date +%s.%N)
        awk -v k="$kind" -v n="$n" -v c="$((t1 - t0))" -v ms="$TICK_MS" -v s="$(awk "BEGIN {print $s1 - $s0}")" \
            'BEGIN {printf "%-6s %4d tokens  %5.1f tok/s  %5.2f ms CPU/token\n", k, n, n / s, c * ms / n}'
    done
done
