#!/usr/bin/env bash
# Coverage-guided fuzzing on the stable toolchain: libFuzzer (libfuzzer-sys) with LLVM's
# SanitizerCoverage passes enabled by -C flags (what cargo-fuzz does with `-s none`, no nightly).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]   (default: all targets)
# Each target starts from its committed corpus (crates/fuzz/corpus/<name>) and seeds, runs for the
# given time with a 1 s hang limit and a 2 GiB RSS limit, then its corpus is minimised back
# (libFuzzer -merge=1). Crashes land in fuzz/artifacts/<name>/; once fixed, copy them into
# crates/fuzz/regressions/<name>/ (never minimised, replayed by CI). Requires a C++ compiler (cc crate).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(gguf dequant gguf_model safetensors safetensors_index hf_config tokenizer_json
    gguf_tokenizer chat_template mil_text http_body)
fi
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Ccodegen-units=16"
# An explicit --target keeps the instrumentation off build scripts and proc macros.
host=$(rustc -vV | sed -n 's/^host: //p')
cargo build --release --manifest-path fuzz/Cargo.toml --target "$host"
bin=fuzz/target/$host/release/anelm-fuzz
for t in "${targets[@]}"; do
  corpus=crates/fuzz/corpus/$t
  work=fuzz/work/$t
  mkdir -p "$work" "fuzz/artifacts/$t" "$corpus"
  echo "== $t: ${secs}s"
  regress=crates/fuzz/regressions/$t
  seeds=("$corpus")
  [ -d "$regress" ] && seeds+=("$regress")
  ANELM_FUZZ_TARGET=$t "$bin" "$work" "${seeds[@]}" -max_total_time="$secs" -timeout=1 \
    -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" >"fuzz/work/$t.log" 2>&1 ||
    echo "!! $t: crash or hang, input in fuzz/artifacts/$t/ (log fuzz/work/$t.log)"
  grep -E "^(stat::number_of_executed_units|Done)" "fuzz/work/$t.log" || true
  # Minimise: keep only inputs that add coverage, back into the committed corpus.
  tmp=$(mktemp -d)
  ANELM_FUZZ_TARGET=$t "$bin" -merge=1 -timeout=1 -max_len=4096 "$tmp" "$corpus" "$work" >/dev/null 2>&1
  rm -rf "$corpus" && mv "$tmp" "$corpus"
done
