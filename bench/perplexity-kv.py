#!/usr/bin/env python3
"""Perplexity at long context with each KV cache type, anelm beside llama.cpp's llama-perplexity
on the same file, text, context and threads.

The text is ../shared/fixtures/llamacpp/ppl-text.txt (the Apache-2.0 licence text, ~2.5 K tokens)
repeated until it fills at least two windows of --ctx tokens (default 4096), written to a
temporary file that both tools read. For each model and cache type (keys and values alike:
f16, q8_0, q4_0; llama.cpp needs flash attention for a quantised V cache, so -fa on for those)
it prints both perplexities, their ratio, and each cache type's change against f16 on the same
side. Alternating: for each model and cache type llama.cpp runs, then anelm.

    bench/perplexity-kv.py [--ctx 4096] [--threads 2] [--types f16,q8_0,q4_0] [--json out.json]

llama-perplexity is built once from the llama-cpp-python sdist (bench/llamacpp.py); anelm is
target/release/anelm (cargo build --release first). The models come from scripts/fetch-models.py.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT.parent / "shared" / "fixtures" / "llamacpp" / "ppl-text.txt"
MODELS_DIR = Path(os.environ.get("ANELM_MODELS", Path.home() / ".cache" / "anelm" / "models"))
MODELS = {
    "SmolLM2-135M Q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m Q4_K_M": "gemma-3-270m-q4_k_m.gguf",
}


def llama_ppl(exe, model, text, ctx, threads, cache):
    cmd = [exe, "-m", model, "-f", text, "-c", str(ctx), "-b", str(min(ctx, 2048)), "-t", str(threads),
           "-ctk", cache, "-ctv", cache]
    if cache != "f16":
        cmd += ["-fa", "on"]
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"llama-perplexity failed ({cache}):\n{out.stderr[-2000:]}")
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out.stdout + out.stderr)
    if not m:
        sys.exit(f"no final estimate from llama-perplexity:\n{out.stderr[-2000:]}")
    return float(m.group(1))


def anelm_ppl(exe, model, text, ctx, threads, cache):
    cmd = [exe, "perplexity", "--model", model, "--file", text, "--ctx", str(ctx), "-t", str(threads),
           "--cache-type-k", cache, "--cache-type-v", cache, "--json"]
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"anelm perplexity failed ({cache}):\n{out.stderr[-2000:]}")
    return float(json.loads(out.stdout)["ppl"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    anelm = ROOT / "target" / "release" / "anelm"
    if not anelm.exists():
        sys.exit("build anelm first: cargo build --release")
    llama = llamacpp.build("llama-perplexity")
    base = TEXT.read_text()
    # ~4.5 characters per token: enough copies for two windows, with room.
    copies = max(1, -(-(2 * a.ctx * 5) // len(base)))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "ppl-long.txt"
        text.write_text(base * copies)
        for name, file in MODELS.items():
            model = MODELS_DIR / file
            if not model.exists():
                sys.exit(f"{model} is missing: run scripts/fetch-models.py")
            for cache in a.types.split(","):
                ref = llama_ppl(llama, model, text, a.ctx, a.threads, cache)
                got = anelm_ppl(anelm, model, text, a.ctx, a.threads, cache)
                rows.append({"model": name, "cache": cache, "llama_cpp": ref, "anelm": got,
                             "ratio": got / ref})
                print(f"{name} {cache}: anelm {got:.4f}, llama.cpp {ref:.4f} ({(got / ref - 1) * 100:+.2f} %)",
                      file=sys.stderr, flush=True)
    f16 = {(r["model"]): r for r in rows if r["cache"] == "f16"}
    print(f"\nctx {a.ctx}, {a.threads} threads, text: ppl-text.txt x{copies}\n")
    print("| model | KV cache | anelm ppl | llama.cpp ppl | anelm / llama.cpp | anelm vs its f16 | llama.cpp vs its f16 |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        base_row = f16.get(r["model"])
        vs = (lambda k: f"{(r[k] / base_row[k] - 1) * 100:+.2f} %") if base_row else (lambda k: "")
        print(f"| {r['model']} | {r['cache']} | {r['anelm']:.4f} | {r['llama_cpp']:.4f} | "
              f"{r['ratio']:.4f} | {vs('anelm')} | {vs('llama_cpp')} |")
    if a.json:
        a.json.write_text(json.dumps({"ctx": a.ctx, "threads": a.threads, "copies": copies, "rows": rows},
                                     indent=1) + "\n")


if __name__ == "__main__":
    main()
