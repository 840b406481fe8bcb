#!/usr/bin/env bash
# The full soak (CI runs a light one): 100 clients for 60 s against `anelm serve` on SmolLM2,
# then kill -9 and a restart. Figures on stdout and in target/ci-artifacts/soak.json.
# Usage: scripts/soak.sh [CLIENTS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ANELM_SOAK_CLIENTS="${1:-100}" ANELM_SOAK_SECONDS="${2:-60}" \
  cargo test --release -p anelm --test soak -- --nocapture
