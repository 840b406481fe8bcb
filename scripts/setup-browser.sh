#!/usr/bin/env bash
# Installs what the web chat's browser test needs: Debian's Chromium (/usr/bin/chromium) and
# playwright-core from npm, the latter into target/browser-test (ignored by git).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "chromium is missing: install Debian's chromium package (apt-get install chromium)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
dir="${ANELM_BROWSER_DEPS:-$root/target/browser-test}"
if [ ! -f "$dir/node_modules/playwright-core/package.json" ]; then
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --silent playwright-core@1.65.1
fi
echo "browser test ready: $(chromium --version 2>/dev/null | head -1), playwright-core in $dir"
