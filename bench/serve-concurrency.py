#!/usr/bin/env python3
"""Server decode under N concurrent greedy chat streams: anelm serve beside llama-server.

Starts each server in turn (alternating, the one that goes first swapping every round, ROUNDS
times) on the same GGUF file and thread count, sends N streamed requests of --max-tokens tokens at
once for each N (every N --repeat times a round, the Ns interleaved in an order that rotates, the
round keeping each measure's median: one run lasts well under a second, this machine's memory
bandwidth drifts, and a run right after another can be slower), and reports per server and N the
medians over rounds of: the aggregate tokens/s (completion tokens of all requests / wall time,
prefill included), the per-stream decode tokens/s (a stream's tokens after its first / time from
its first token to its last) and the p50 time to first token; with the ratios to the same
server's single stream and to llama-server at the same N.

llama-server is `--llama-server PATH`, else built once from the llama.cpp vendored in the
llama-cpp-python sdist (bench/llamacpp.py); it runs with `-np N_max -c CTX*N_max` (each slot gets
CTX tokens), continuous batching on (its default), `--no-webui`. anelm runs `serve --parallel N_max`.
Standard library only. Not run in CI. Example:

  bench/serve-concurrency.py -m ~/.cache/anelm/models/SmolLM2-135M-Instruct.Q4_1.gguf -n 1,2,4,8 -r 3
  bench/serve-concurrency.py -m SMOLLM2.gguf -m GEMMA3.gguf -n 1,4,8   (one model after the other)
  bench/serve-concurrency.py -m M --bin target/release/anelm --bin /old/anelm --no-llama
  bench/serve-concurrency.py -m M --no-llama --anelm-args=--lookup --anelm-args= \
      --prompt-file bench/speculative/summarise.txt --prompt-file bench/speculative/river.txt
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import llamacpp  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ask(port, i, max_tokens, prompts):
    """One streamed greedy chat request; returns (tokens, seconds to first token, seconds in all)."""
    content = prompts[i % len(prompts)] if prompts else f"Write a very long story about dragon number {i}."
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    start = time.time()
    first = None
    chunks = 0
    usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices") or []:
                if (c.get("delta") or {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.time()
    end = time.time()
    tokens = usage["completion_tokens"] if usage else chunks
    return tokens, (first or end) - start, end - start


def concurrent(port, n, max_tokens, prompts=None):
    results = [None] * n
    errors = []

    def one(i):
        try:
            results[i] = ask(port, i, max_tokens, prompts)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - start
    if errors or any(r is None or r[0] == 0 for r in results):
        raise SystemExit(f"a request failed: {errors[:1]} (see the server's log)")
    aggregate = sum(r[0] for r in results) / wall
    per_stream = statistics.median((r[0] - 1) / max(r[2] - r[1], 1e-9) for r in results)
    ttft = statistics.median(r[1] for r in results)
    return aggregate, per_stream, ttft


def wait_healthy(port, proc, what):
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not become healthy")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable: one after the other)")
    ap.add_argument("--bin", action="append", help="an anelm binary (repeatable; default target/release/anelm)")
    ap.add_argument("--llama-server", help="llama-server binary (default: built from the llama-cpp-python sdist)")
    ap.add_argument("--no-llama", action="store_true", help="anelm binaries only")
    ap.add_argument("--llama-cpp-python-version", default=llamacpp.DEFAULT_VERSION)
    ap.add_argument("-n", default="1,2,4,8", help="concurrent streams, comma-separated (first is the baseline)")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each width within a round (interleaved; the round keeps their median)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048, help="context per stream")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", help="write the raw rounds here")
    ap.add_argument("--anelm-args", action="append",
                    help="extra arguments of anelm serve, one configuration per use (repeatable: each "
                         "binary runs with each; e.g. --anelm-args=--lookup --anelm-args=)")
    ap.add_argument("--prompt-file", action="append",
                    help="a file whose text is a request's message (repeatable: stream i takes file i mod "
                         "count; default: a long story per stream)")
    a = ap.parse_args()
    exe = None
    if not a.no_llama:
        exe = a.llama_server or str(llamacpp.build("llama-server", a.llama_cpp_python_version))
    for model in a.model:
        run(a, model, exe)


def run(a, model, exe):
    """Every round of every server on `model`, then the table."""
    widths = [int(x) for x in a.n.split(",")]
    slots = max(widths)
    servers = []
    prompts = [Path(f).read_text() for f in a.prompt_file or []]
    for b in a.bin or [str(ROOT / "target" / "release" / "anelm")]:
        for extra in a.anelm_args or [""]:
            name = f"anelm ({b})" if a.bin and len(a.bin) > 1 else "anelm"
            if extra:
                name += f" {extra}"
            servers.append((name, lambda port, b=b, extra=extra: [
                b, "serve", "-m", model, "-t", str(a.threads), "--parallel", str(slots),
                "--ctx", str(a.ctx), "--alias", "bench", "--port", str(port)] + extra.split()))
    if exe:
        servers.append(("llama-server", lambda port: [
            exe, "-m", model, "-t", str(a.threads), "-tb", str(a.threads), "-np", str(slots),
            "-c", str(a.ctx * slots), "--port", str(port), "--no-webui"]))
    results = {}
    for rnd in range(a.rounds):
        order = servers if rnd % 2 == 0 else servers[::-1]
        for name, cmd in order:
            port = free_port()
            proc = subprocess.Popen(cmd(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_healthy(port, proc, name)
                concurrent(port, 1, 8)  # warm-up
                # Each width --repeat times, the widths interleaved, their order rotating from
                # one pass to the next (of two identical runs back to back the second was 2-4 %
                # slower on an EPYC); the round keeps each measure's median over its repeats.
                runs = {}
                for k in range(a.repeat):
                    shift = (rnd * a.repeat + k) % len(widths)
                    for n in widths[shift:] + widths[:shift]:
                        runs.setdefault(n, []).append(concurrent(port, n, a.max_tokens, prompts))
                for n in widths:
                    kept = tuple(statistics.median(r[i] for r in runs[n]) for i in range(3))
                    results.setdefault((name, n), []).append(kept)
                    llamacpp.log(f"round {rnd + 1} {name} N={n}: {kept}")
            finally:
                proc.terminate()
                proc.wait()
    if a.json:
        out = Path(a.json)
        if len(a.model) > 1:
            out = out.with_name(f"{out.stem}.{Path(model).stem}{out.suffix}")
        out.write_text(json.dumps({f"{k[0]}|{k[1]}": v for k, v in results.items()}, indent=1))

    def med(name, n, i):
        return statistics.median(r[i] for r in results[(name, n)])

    print(f"{Path(model).name}, {a.threads} threads, {a.max_tokens} tokens per stream, medians of {a.rounds} rounds "
          f"(each the median of {a.repeat} runs)")
    print("| server | streams | aggregate tok/s | vs own 1 stream | vs llama-server | per-stream tok/s | p50 TTFT ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, _ in servers:
        single = med(name, widths[0], 0)
        for n in widths:
            agg = med(name, n, 0)
            vs = f"{agg / med('llama-server', n, 0):.2f}x" if not a.no_llama else "-"
            print(f"| {name} | {n} | {agg:.1f} | {agg / single:.2f}x | {vs} | {med(name, n, 1):.1f} "
                  f"| {med(name, n, 2) * 1000:.0f} |")
    # Round by round, each width's aggregate over the same round's first width.
    for name, _ in servers:
        for n in widths[1:]:
            each = [r[0] / b[0] for r, b in zip(results[(name, n)], results[(name, widths[0])])]
            print(f"{name}, {n} streams over {widths[0]}, by round: " + ", ".join(f"{x:.2f}" for x in each))


if __name__ == "__main__":
    main()
