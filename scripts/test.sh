#!/usr/bin/env bash
# The test command: fetches the models, prepares the Python checkers and the browser for the web
# chat's test, runs lint and every test.
# CI (.ci/run) runs exactly this on a clean clone.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
python3 scripts/fetch-models.py
scripts/setup-python.sh
scripts/setup-browser.sh
export ANELM_PYTHON="${ANELM_PYTHON:-$root/.venv/bin/python}"
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release --no-fail-fast
