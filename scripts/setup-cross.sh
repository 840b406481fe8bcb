#!/usr/bin/env bash
# Installs the C cross compiler that the aarch64 Linux type-check needs: `cargo check` still runs
# build scripts, and ring (rustls's cryptography) compiles C for its target. Apple targets need
# none (the Hub client uses Apple's Security framework there; see crates/hub/Cargo.toml).
set -euo pipefail
if ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "aarch64-linux-gnu-gcc is missing: apt-get install gcc-aarch64-linux-gnu" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null
fi
echo "cross compiler ready: $(aarch64-linux-gnu-gcc --version | head -1)"
