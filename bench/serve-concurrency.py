#!/usr/bin/env python3
"""Aggregate decode speed of `anelm serve` under N concurrent greedy chat requests.

Starts each given anelm binary in turn (alternating, ROUNDS times), sends N requests of
--max-tokens tokens at once for each N, and reports per binary and N the median aggregate
tokens/s (completion tokens of all requests / wall time, prefill included) and its ratio to
the same binary's single stream. Standard library only.

  bench/serve-concurrency.py -m ~/.cache/anelm/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --bin target/release/anelm [--bin /path/to/older/anelm] -n 1,4,8 -r 3
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ask(port, model_id, i, max_tokens):
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": f"Write a very long story about dragon number {i}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["usage"]["completion_tokens"]


def concurrent(port, model_id, n, max_tokens):
    done = [0] * n

    def one(i):
        done[i] = ask(port, model_id, i, max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if 0 in done:
        raise SystemExit("a request failed (see the server's log)")
    return sum(done) / (time.time() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--bin", action="append", required=True, help="an anelm binary (repeatable)")
    ap.add_argument("-n", default="1,4", help="concurrent requests, comma-separated")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    widths = [int(x) for x in a.n.split(",")]
    model_id = os.path.basename(a.model).removesuffix(".gguf")
    results = {}
    for _ in range(a.rounds):
        for b in a.bin:
            port = free_port()
            server = subprocess.Popen(
                [b, "serve", "-m", a.model, "-t", str(a.threads), "--parallel", str(max(widths)),
                 "--port", str(port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(600):
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                        break
                    except (urllib.error.URLError, ConnectionError):
                        time.sleep(0.1)
                concurrent(port, model_id, 1, 8)  # warm-up
                for n in widths:
                    results.setdefault((b, n), []).append(concurrent(port, model_id, n, a.max_tokens))
            finally:
                server.terminate()
                server.wait()
    print(f"| binary | streams | aggregate tok/s (median of {a.rounds}) | vs its single stream |")
    print("| --- | --- | --- | --- |")
    for b in a.bin:
        single = statistics.median(results[(b, widths[0])])
        for n in widths:
            med = statistics.median(results[(b, n)])
            print(f"| {b} | {n} | {med:.1f} | {med / single:.2f}x |")


if __name__ == "__main__":
    main()
