#!/usr/bin/env bash
# Drive a running `memra-run serve` (SmolLM2) with real clients: the `openai` Python package
# and curl (scripts/client_tests.py says what is checked).
#
# Installs `openai` into a virtualenv under <repo>/.venv-clients (git-ignored; reused while it
# imports; MEMRA_CLIENTS_VENV puts it elsewhere). Needs python3 with its venv module, pip's
# index reachable on the first run, and curl. Fails, never skips, when one is missing.
#
# Usage: scripts/client-tests.sh http://127.0.0.1:PORT [API_KEY [SERVER_PID]]
# The server runs with --timeout 4 --max-connections 24 --allowed-origins http://app.example
# (the constants of client_tests.py) and its --api-key; with its process id, the last check
# sends it SIGTERM during a stream. `cargo test --release -p memra-executor --test clients`
# starts the server so, runs this and checks that the server exits 0.
set -euo pipefail

die() { echo "client-tests.sh: error: $*" >&2; exit 1; }
log() { echo "client-tests.sh: $*" >&2; }

[[ $# -ge 1 && $# -le 3 ]] || die "usage: scripts/client-tests.sh http://HOST:PORT [API_KEY [SERVER_PID]] (a running memra-run serve, its --api-key, its process id)"
URL="${1%/}"
KEY="${2:-}"
PID="${3:-}"
[[ -z "$PID" || -n "$KEY" ]] || die "SERVER_PID needs API_KEY before it"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
VENV="${MEMRA_CLIENTS_VENV:-$REPO_ROOT/.venv-clients}"
OPENAI_SPEC="openai>=1,<4" # tested with 3.57.0

command -v curl >/dev/null 2>&1 || die "curl is required (apt-get install curl)"
command -v python3 >/dev/null 2>&1 || die "python3 is required (apt-get install python3 python3-venv)"

if ! "$VENV/bin/python" -c "import openai" >/dev/null 2>&1; then
    log "installing $OPENAI_SPEC into $VENV"
    if [[ -e "$VENV" ]]; then
        [[ -f "$VENV/pyvenv.cfg" ]] || die "$VENV exists and is not a virtualenv; not touching it"
        rm -rf "$VENV"
    fi
    python3 -m venv "$VENV" >&2 \
        || die "python3 -m venv $VENV failed (python3 needs its venv module with ensurepip: apt-get install python3-venv)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$OPENAI_SPEC" >&2 \
        || die "pip install $OPENAI_SPEC failed (is the package index reachable?)"
fi
# The server is local: no proxy for it (pip above may have needed one).
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
log "openai $("$VENV/bin/python" -c 'import openai; print(openai.__version__)') against $URL"

exec "$VENV/bin/python" "$SCRIPT_DIR/client_tests.py" "$URL" ${KEY:+"$KEY"} ${PID:+"$PID"}
