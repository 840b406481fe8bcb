#!/usr/bin/env bash
# Creates .venv with the Python checkers the tests call (coremltools, gguf-py, numpy).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${ANELM_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/scripts/requirements-test.txt"
echo "python checkers ready in $venv"
