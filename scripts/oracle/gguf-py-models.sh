#!/usr/bin/env bash
# Writes the oracle's gguf-py models (scripts/oracle/tiny_glm5_shared.py: tiny-glm5-next-shared,
# f32 and q8_0, the seed testdata/oracle/tiny-glm5-next-shared-*.json records) into DIR, with
# the PyPI package `gguf` (the writer llama.cpp's converter uses) installed into the
# git-ignored .venv-gguf at pinned versions: the bytes depend on gguf-py's writer and
# quantizer and on numpy's PCG64 stream, and the recordings name the sha256 they give. The
# packages are installed once (pip and PyPI needed then: a venv, or `pip install --target`
# where python3 has no venv module); later calls run offline. Needs python3 >= 3.11 (numpy
# 2.4). Prints DIR.
# usage: gguf-py-models.sh DIR [SEED]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:?usage: gguf-py-models.sh DIR [SEED]}
seed=${2:-5}
venv="$root/.venv-gguf"
pins=(gguf==0.19.0 numpy==2.4.6)
py() {
    if [ -x "$venv/bin/python" ]; then
        "$venv/bin/python" "$@"
    else
        PYTHONPATH="$venv/site" python3 "$@"
    fi
}
if ! py -c 'import gguf, numpy' 2>/dev/null; then
    rm -rf "$venv"
    if python3 -m venv "$venv" >/dev/null 2>&1; then
        "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" >&2
    else
        rm -rf "$venv"
        python3 -m pip install --quiet --disable-pip-version-check --target "$venv/site" "${pins[@]}" >&2
    fi
fi
mkdir -p "$dir"
for dtype in f32 q8_0; do
    out="$dir/tiny-glm5-next-shared-$dtype.gguf"
    py "$root/scripts/oracle/tiny_glm5_shared.py" --dtype "$dtype" --seed "$seed" -o "$out.part" 2>/dev/null
    mv -f "$out.part" "$out"
done
echo "$dir"
