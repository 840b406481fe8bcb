#!/usr/bin/env python3
"""An independent float64 forward pass of a Gemma 3 GGUF (weights dequantised by gguf-py), for
the llama.cpp cross-check: prints the top-10 logits after each prompt of a llama.cpp fixture
beside llama.cpp's default and precise runs, so a disagreement between llama.cpp and anelm can
be judged against arithmetic neither of them does.

    python3 scripts/gemma3-f64-forward.py [--model M.gguf] [--fixture F.prompts.json]
        [--prompt code] [--json]

Needs numpy and gguf (gguf-py); the venv scripts/test.sh builds has both. The math follows
../shared/models/ARCHITECTURES.md: the embedding times sqrt(hidden), (1+w) RMSNorms (stored
already as 1+w in GGUF), q/k norms before NEOX RoPE, theta 1e6 on every 6th layer and 1e4 on
the others, a 512-position window on the sliding layers, scale key_length^-0.5, GELU-tanh GeGLU,
sandwich norms, the head tied to the embedding.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path(os.environ.get("ANELM_MODELS", Path.home() / ".cache/anelm/models")) / (
    "gemma-3-270m-q4_k_m.gguf"
)
DEFAULT_FIXTURE = ROOT.parent / "shared/fixtures/llamacpp/gemma-3-270m-q4_k_m.prompts.json"


class Weights:
    def __init__(self, path):
        self.reader = GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.fields = self.reader.fields

    def meta(self, key, default=None):
        f = self.fields.get(f"gemma3.{key}")
        if f is None:
            if default is None:
                sys.exit(f"the GGUF has no gemma3.{key}")
            return default
        return f.contents()

    def get(self, name):
        t = self.tensors[name]
        w = dequantize(t.data, t.tensor_type)
        # ggml's shape is [cols, rows]; gguf-py's arrays are row-major [rows, cols].
        rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        return np.asarray(w, dtype=np.float64).reshape(rows, int(t.shape[0]))


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, theta):
    # x: [n, heads, hd]; NEOX pairs (i, i + hd/2).
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd // 2, dtype=np.float64) * 2.0 / hd)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def forward(w, ids):
    """Logits [n, vocab] after every position of `ids`."""
    hidden = int(w.meta("embedding_length"))
    n_layers = int(w.meta("block_count"))
    nh = int(w.meta("attention.head_count"))
    nkv = int(w.meta("attention.head_count_kv"))
    hd = int(w.meta("attention.key_length"))
    eps = float(w.meta("attention.layer_norm_rms_epsilon"))
    theta_global = float(w.meta("rope.freq_base"))
    theta_local = float(w.meta("rope.freq_base_swa", 10000.0))
    window = int(w.meta("attention.sliding_window"))
    emb = w.get("token_embd.weight")
    n = len(ids)
    x = emb[ids] * np.sqrt(hidden)
    pos = np.arange(n, dtype=np.float64)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    causal = j <= i
    for li in range(n_layers):
        g = lambda s: w.get(f"blk.{li}.{s}.weight")  # noqa: E731
        is_global = (li + 1) % 6 == 0
        xn = rms_norm(x, g("attn_norm")[0], eps)
        q = (xn @ g("attn_q").T).reshape(n, nh, hd)
        k = (xn @ g("attn_k").T).reshape(n, nkv, hd)
        v = (xn @ g("attn_v").T).reshape(n, nkv, hd)
        q = rms_norm(q, g("attn_q_norm")[0], eps)
        k = rms_norm(k, g("attn_k_norm")[0], eps)
        theta = theta_global if is_global else theta_local
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        mask = causal if is_global else causal & (j > i - window)
        out = np.empty((n, nh, hd))
        for h in range(nh):
            kh = h // (nh // nkv)
            s = q[:, h, :] @ k[:, kh, :].T * hd**-0.5
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[:, h, :] = s @ v[:, kh, :]
        y = out.reshape(n, nh * hd) @ g("attn_output").T
        x = x + rms_norm(y, g("post_attention_norm")[0], eps)
        xn = rms_norm(x, g("ffn_norm")[0], eps)
        y = (gelu_tanh(xn @ g("ffn_gate").T) * (xn @ g("ffn_up").T)) @ g("ffn_down").T
        x = x + rms_norm(y, g("post_ffw_norm")[0], eps)
    x = rms_norm(x, w.get("output_norm.weight")[0], eps)
    return x @ emb.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    ap.add_argument("--prompt", action="append", help="prompt names (default: all)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    fx = json.loads(a.fixture.read_text())
    w = Weights(a.model)
    results = []
    for p in fx["prompts"]:
        if a.prompt and p["name"] not in a.prompt:
            continue
        last = forward(w, np.array(p["ids"]))[-1]
        top = np.argsort(-last)[:10]
        rows = []
        for e_default, e_precise in zip(p["top10_after_prompt"], p["precise"]["top10_after_prompt"]):
            rows.append(
                {
                    "id": int(e_precise["id"]),
                    "f64": float(last[e_precise["id"]]),
                    "llamacpp_precise": e_precise["logit"],
                    "llamacpp_default_id": int(e_default["id"]),
                    "llamacpp_default": e_default["logit"],
                }
            )
        results.append(
            {
                "name": p["name"],
                "f64_top10": [{"id": int(t), "logit": float(last[t])} for t in top],
                "at_llamacpp_ids": rows,
            }
        )
        if not a.json:
            print(f"{p['name']}: f64 top logit {last[top[0]]:.3f} (id {top[0]})")
            print(f"  {'id':>7} {'f64':>9} {'precise':>9}   {'id':>7} {'default':>9}")
            for r in rows:
                print(
                    f"  {r['id']:>7} {r['f64']:>9.3f} {r['llamacpp_precise']:>9.3f}   "
                    f"{r['llamacpp_default_id']:>7} {r['llamacpp_default']:>9.3f}"
                )
    if a.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
