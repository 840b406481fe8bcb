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
# The product's main target (Apple silicon) and aarch64 Linux: the whole workspace, the NEON
# kernels and their tests included, type-checks for them (no machine here runs aarch64 code).
# The targets' std comes from rustup's server; a machine that cannot reach it says so loudly and
# goes on to the tests (the check then did not run, and the log says why).
if rustup target add aarch64-apple-darwin aarch64-unknown-linux-gnu; then
  scripts/setup-cross.sh
  cargo check --workspace --all-targets --release --target aarch64-apple-darwin
  cargo check --workspace --all-targets --release --target aarch64-unknown-linux-gnu
else
  echo "::warning:: aarch64 type-check NOT RUN: rustup could not install the aarch64 std" >&2
fi
cargo test --workspace --release --no-fail-fast
