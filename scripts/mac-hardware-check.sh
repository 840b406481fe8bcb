#!/usr/bin/env bash
# Runs anelm's ANE checks on a Mac with Apple silicon and packs everything into ONE archive to
# send back to the developers. No Rust knowledge needed:
#
#   scripts/mac-hardware-check.sh            # writes anelm-hardware-report-<date>.tar.gz here
#   scripts/mac-hardware-check.sh OUT_DIR    # or into OUT_DIR
#
# What it does, each step with a time limit and shown on the screen as it goes:
#   1. preflight: Xcode command-line tools, a native arm64 shell and Rust toolchain (not under
#      Rosetta), disk space — and says what to install when something is missing;
#   2. builds anelm (release) and fetches the two small test models (PyPI, ~350 MB);
#   3. `anelm info`, `anelm probe` (every case the build offers, both drivers, both MIL dialects);
#   4. a cold compile: a fresh program cache and a unique program salt, so that neither anelm's
#      cache nor the OS's own compiler cache hides how long a first compile takes;
#   5. `anelm verify --device ane` and `anelm bench` for both models, both strategies, both
#      drivers; a second verify to show the program cache working;
#   6. the ANE-related system log of the run window (aned, ANECompilerService), every
#      attributes/MIL file anelm saved, with the host name, user name and home path scrubbed.
# A failing or timed-out step is recorded and the run goes on. Nothing is uploaded.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1
stamp="$(date +%Y%m%d-%H%M%S)"
out_parent="${1:-$root}"
name="anelm-hardware-report-$stamp"
out="$out_parent/$name"
mkdir -p "$out/logs" "$out/saved" || { echo "cannot create $out" >&2; exit 1; }
report="$out/report.txt"
models_dir="${ANELM_MODELS:-$HOME/.cache/anelm/models}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
bin="$target_dir/release/anelm"
# Programs compiled by this run live here (and are packed): a fresh cache.
export ANELM_PROGRAMS="$out/programs"
failures=0
timeouts=0
step=0
started_at="$(date '+%Y-%m-%d %H:%M:%S')"

: >"$report" || { echo "cannot write $report" >&2; exit 1; }

log() {
    printf '%s\n' "$*" | tee -a "$report"
}

# with_limit SECONDS CMD...: runs CMD, killing it after SECONDS (macOS has no `timeout`); prints
# a dot every 10 s on the screen meanwhile. Exit status: CMD's, or 124 when it was stopped.
with_limit() {
    local limit="$1"
    shift
    "$@" &
    local pid=$!
    local waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge "$limit" ]; then
            kill -TERM "$pid" 2>/dev/null
            sleep 5
            kill -KILL "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 1
        waited=$((waited + 1))
        if [ $((waited % 10)) -eq 0 ]; then
            printf '.' >&2
        fi
    done
    wait "$pid"
}

# run LIMIT TITLE CMD...: one step: its output and exit status go into its own log and the report.
run() {
    local limit="$1" title="$2"
    shift 2
    step=$((step + 1))
    local file
    file="$out/logs/$(printf '%02d' "$step")-$(printf '%s' "$title" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-60).txt"
    local start end status
    printf '[%02d] %s ' "$step" "$title" >&2
    {
        echo "### $title"
        echo "\$ $*"
    } >>"$report"
    start=$(date +%s)
    with_limit "$limit" "$@" >"$file" 2>&1
    status=$?
    end=$(date +%s)
    cat "$file" >>"$report"
    if [ "$status" -eq 124 ]; then
        timeouts=$((timeouts + 1))
        failures=$((failures + 1))
        echo "-> stopped after the ${limit} s limit" >>"$report"
        printf ' TIMED OUT after %s s\n' "$limit" >&2
    else
        echo "-> exit $status in $((end - start)) s" >>"$report"
        [ "$status" -ne 0 ] && failures=$((failures + 1))
        printf ' exit %s (%s s)\n' "$status" "$((end - start))" >&2
    fi
    echo "" >>"$report"
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
log "kernel: $(uname -sr) $(uname -m)"

# --- 1. preflight -------------------------------------------------------------------------
missing=0
need() {
    log "preflight: $1"
    missing=$((missing + 1))
}
if [ "$(uname -s)" != "Darwin" ]; then
    log "preflight: this is $(uname -s), not macOS: every ANE check will report that there is no ANE"
fi
if [ "$(uname -s)" = "Darwin" ]; then
    xcode-select -p >/dev/null 2>&1 ||
        need "Xcode command-line tools are missing: run  xcode-select --install  and start this script again"
    if [ "$(sysctl -n sysctl.proc_translated 2>/dev/null || echo 0)" = "1" ]; then
        need "this shell runs under Rosetta (x86-64 emulation): open a native arm64 Terminal (not 'Open using Rosetta') and start again"
    fi
    [ "$(uname -m)" = "arm64" ] || need "this is $(uname -m), not an Apple silicon (arm64) Mac: there is no ANE to test"
fi
if ! command -v cargo >/dev/null 2>&1; then
    need "Rust is missing: install it with rustup (see rustup.rs: one command), open a new Terminal, start again"
else
    host="$(rustc -vV 2>/dev/null | sed -n 's/^host: //p')"
    log "rust: $(rustc --version 2>/dev/null) (host $host)"
    if [ "$(uname -s)" = "Darwin" ] && [ "$host" != "aarch64-apple-darwin" ]; then
        need "the Rust toolchain is $host, not aarch64-apple-darwin: run  rustup default stable-aarch64-apple-darwin"
    fi
fi
command -v python3 >/dev/null 2>&1 || need "python3 is missing (it fetches the test models): install the Xcode command-line tools"
free_gb=$(( $(df -k "$root" | awk 'NR==2 {print $4}') / 1048576 ))
log "free disk: $free_gb GB"
[ "$free_gb" -ge 6 ] || need "only $free_gb GB free here; the build, models and programs need about 6 GB"
if [ "$missing" -ne 0 ]; then
    log ""
    log "## stopped: $missing thing(s) to install or change first (above)"
    exit 1
fi

# --- 2. build and models --------------------------------------------------------------------
run 3600 "build" cargo build --release -p anelm
if [ ! -x "$bin" ]; then
    log "the build produced no $bin; stopping (see $report)"
    exit 1
fi
run 1800 "models" python3 scripts/fetch-models.py

# --- 3. info and probes ----------------------------------------------------------------------
run 120 "info" "$bin" info
run 120 "info (json)" "$bin" info --json

models=("SmolLM2-135M-Instruct.Q4_1.gguf" "gemma-3-270m-q4_k_m.gguf")
for driver in private coreml; do
    # The suite: the open questions and one program per op form each model's lowering emits,
    # in each MIL dialect; its answers are remembered for this machine (probe.json), so the
    # verify runs below use the dialect and op alternatives the hardware accepted.
    if has_flag probe --all; then
        # One process per dialect: the private driver allows ~119 compiles per process.
        for model in "${models[@]}"; do
            for dialect in a b; do
                run 3600 "probe --all, $driver driver, dialect $dialect, census of $model" \
                    "$bin" probe --all --driver "$driver" --mil-dialect "$dialect" \
                    --model "$models_dir/$model" \
                    --out "$out/probe-all-$driver-$dialect-${model%%.*}.json"
            done
        done
    fi
    run 600 "probe, $driver driver, with modelAttributes" \
        "$bin" probe --driver "$driver" --attributes
done
run 600 "probe, private driver, odd width 17 (row padding, FACTS 4)" "$bin" probe --driver private --channels 64 --width 17 --attributes
run 600 "probe, private driver, width 1 (decode column)" "$bin" probe --driver private --channels 768 --width 1
run 600 "probe, private driver, 768 channels x 64" "$bin" probe --driver private --channels 768 --width 64 --runs 50
run 600 "probe, Core ML driver, 768 channels x 64" "$bin" probe --driver coreml --channels 768 --width 64 --runs 50
run 1800 "driver tests (anelm-macos: open, IOSurface round trip, layout logic)" cargo test --release -p anelm-macos

drivers=("private" "coreml")
strategies=("projection" "fused")

# --- 4. a cold compile -----------------------------------------------------------------------
# A unique salt in every program's buildInfo: nothing compiled before can serve it.
ANELM_PROGRAM_SALT="cold-$stamp-$$" ANELM_PROGRAMS="$out/programs-cold" \
    run 3600 "cold compile + verify, SmolLM2, fused, private driver (fresh cache, salted programs)" \
    "$bin" verify --model "$models_dir/${models[0]}" --device ane --driver private --strategy fused --json

# --- 5. verify and bench -----------------------------------------------------------------------
for model in "${models[@]}"; do
    for strategy in "${strategies[@]}"; do
        for driver in "${drivers[@]}"; do
            run 3600 "verify $model $strategy $driver" \
                "$bin" verify --model "$models_dir/$model" --device ane --driver "$driver" --strategy "$strategy" --json
        done
    done
done
# Again, from the program cache: the report says how many programs were loaded, not compiled.
run 1800 "verify ${models[0]} fused private, second start (program cache)" \
    "$bin" verify --model "$models_dir/${models[0]}" --device ane --driver private --strategy fused --json
if has_flag verify --mil-dialect; then
    run 3600 "verify ${models[0]} fused private, MIL dialect B" \
        "$bin" verify --model "$models_dir/${models[0]}" --device ane --driver private --strategy fused --mil-dialect b --json
fi
if has_flag verify --weights; then
    run 3600 "verify ${models[0]} projection private, fp16 weights" \
        "$bin" verify --model "$models_dir/${models[0]}" --device ane --driver private --weights fp16 --json
fi
for model in "${models[@]}"; do
    run 1800 "bench $model on the CPU" "$bin" bench --model "$models_dir/$model" -p 64 -n 32 -r 3
    for strategy in "${strategies[@]}"; do
        run 3600 "bench $model on the ANE, $strategy" "$bin" bench --model "$models_dir/$model" --device ane --strategy "$strategy" -p 64 -n 32 -r 3
    done
done

# --- 6. system log, saved files, scrub, pack --------------------------------------------------
if command -v log >/dev/null 2>&1 && [ "$(uname -s)" = "Darwin" ]; then
    with_limit 600 log show --style compact --start "$started_at" \
        --predicate 'process == "aned" OR process == "ANECompilerService" OR process == "anelm" OR subsystem CONTAINS "com.apple.ane" OR subsystem CONTAINS "com.apple.espresso"' \
        >"$out/logs/system-ane.log" 2>&1 || log "log show: could not read the system log ($?)"
fi
# Every attributes JSON and MIL text anelm saved (program cache, staging directories).
for dir in "$ANELM_PROGRAMS" "$out/programs-cold" "${TMPDIR:-/tmp}"; do
    [ -d "$dir" ] || continue
    find "$dir" -maxdepth 6 \( -name '*.attributes.json' -o -name 'attributes*.json' -o -name '*.mil' -o -name 'manifest.json' \) \
        -newer "$report" -size -20M 2>/dev/null | while read -r f; do
        rel="$(printf '%s' "$f" | sed "s|^$dir/||" | tr '/' '_')"
        cp "$f" "$out/saved/$rel" 2>/dev/null
    done
done
rm -rf "$out/programs" "$out/programs-cold" # compiled programs are large and machine-specific

host_name="$(hostname 2>/dev/null || echo none)"
short_host="$(hostname -s 2>/dev/null || echo none)"
user_name="$(id -un 2>/dev/null || echo none)"
scrub() {
    # Home path, host names and user name out of every text file.
    find "$out" -type f \( -name '*.txt' -o -name '*.log' -o -name '*.json' -o -name '*.mil' \) | while read -r f; do
        sed -i.bak -e "s|$HOME|~|g" -e "s|$host_name|<host>|g" -e "s|$short_host|<host>|g" \
            -e "s|/Users/$user_name|/Users/<user>|g" -e "s|/home/$user_name|/home/<user>|g" "$f" && rm -f "$f.bak"
    done
}

log ""
log "## summary: $step steps, $failures failed ($timeouts timed out)"
scrub
archive="$out_parent/$name.tar.gz"
tar -czf "$archive" -C "$out_parent" "$name" && rm -rf "$out"
echo ""
echo "Done: $failures of $step steps failed. Please send $archive to the anelm developers."
