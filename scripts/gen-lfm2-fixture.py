#!/usr/bin/env python3
"""Writes the tiny random-weight LFM2 fixture (crates/testkit/fixtures/hf-tiny/lfm2: config.json,
model.safetensors, reference.json) the way ../shared/fixtures/hf-tiny was made (its README), and
its GGUF made by llama.cpp's converter with scripts/gen-gguf-fixtures.py.

LFM2 (transformers `lfm2`, Lfm2ForCausalLM): short causal depthwise convolutions gated by the
input (`in_proj` -> B, C, x; `C * conv(B * x)`; `out_proj`) on most layers, GQA attention with
q/k RMSNorms on the others, SwiGLU FFNs whose width transformers derives from intermediate_size
(`block_auto_adjust_ff_dim`: 2/3, times the multiplier, rounded up to `block_multiple_of`), the
final norm named `embedding_norm`, tied head.

Needs torch, transformers and safetensors (no GPU), e.g. /work/.venv-conv of
scripts/gen-gguf-fixtures.py; torch 2.15.0, transformers 5.24.0 made the committed files.
Deterministic: a rerun reproduces every file byte for byte. CI reads the committed files.
"""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, Lfm2Config

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "testkit" / "fixtures" / "hf-tiny" / "lfm2"
CASES = {"short": (24, 1000), "long": (40, 2000), "xlong": (80, 3000)}
N_LAST, N_NEW, MARGIN = 4, 16, 1e-3


def config() -> Lfm2Config:
    return Lfm2Config(
        vocab_size=512,
        hidden_size=64,
        # 2/3 of 128 is 85, rounded up to a multiple of 32: a 96-wide FFN.
        intermediate_size=128,
        block_auto_adjust_ff_dim=True,
        block_ffn_dim_multiplier=1.0,
        block_multiple_of=32,
        num_hidden_layers=6,
        layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        conv_L_cache=3,
        conv_bias=False,
        norm_eps=1e-5,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def fill(model) -> None:
    """Every parameter redrawn (hf-tiny's recipe), so outputs are peaked and nothing trivial."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                v = torch.randn(p.shape, generator=g) * 0.3
            elif "norm" in name:
                v = 1.0 + torch.randn(p.shape, generator=g) * 0.15
            elif name.endswith("conv.weight"):
                v = torch.randn(p.shape, generator=g) * 0.5
            elif name.endswith("bias"):
                v = torch.randn(p.shape, generator=g) * 0.2
            else:
                fan_in = p.shape[-1]
                v = torch.randn(p.shape, generator=g) / fan_in**0.5
                # A tied head: a gain of 3 on the block outputs keeps the argmax off the input.
                if name.endswith(("out_proj.weight", "w2.weight")):
                    v = v * 3.0
            p.copy_(v)


def f32(x) -> float:
    return float(np.float32(x))


def case(model, n: int, seed: int) -> dict:
    rs = np.random.RandomState(seed)
    draws = 0
    while True:
        draws += 1
        ids = rs.randint(4, 512, size=n).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0]
        top2 = torch.topk(logits, 2, dim=-1).values
        gaps = (top2[:, 0] - top2[:, 1]).tolist()
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids]), do_sample=False, num_beams=1, max_new_tokens=N_NEW,
                min_new_tokens=N_NEW, eos_token_id=None, use_cache=True,
                output_scores=True, return_dict_in_generate=True,
            )
        scores = torch.stack(gen.scores)[:, 0]
        s2 = torch.topk(scores, 2, dim=-1).values
        step_gaps = (s2[:, 0] - s2[:, 1]).tolist()
        if min(gaps) >= MARGIN and min(step_gaps) >= MARGIN:
            break
    tokens = gen.sequences[0, n:].tolist()
    # The same tokens from full forward passes without a cache.
    seq = list(ids)
    for _ in range(N_NEW):
        with torch.no_grad():
            seq.append(int(model(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    argmax = logits.argmax(-1).tolist()
    last = list(range(n - N_LAST, n))
    return {
        "input_ids": ids,
        "input_seed": seed,
        "draws": draws,
        "argmax": argmax,
        "top_logit": [f32(v) for v in top2[:, 0].tolist()],
        "top2_gap": [f32(v) for v in gaps],
        "last_positions": last,
        "last_logits": [[f32(v) for v in logits[p].tolist()] for p in last],
        "greedy": {
            "tokens": tokens,
            "step_top_logit": [f32(v) for v in s2[:, 0].tolist()],
            "step_top2_gap": [f32(v) for v in step_gaps],
            "agrees_with_uncached_greedy": seq[n:] == tokens,
        },
        "stats": {
            "logit_std": f32(logits.std()),
            "min_top2_gap": f32(min(gaps)),
            "frac_argmax_equals_input": f32(np.mean([a == b for a, b in zip(argmax, ids)])),
        },
    }


def main() -> int:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(), attn_implementation="eager", dtype=torch.float32)
    fill(model)
    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT)
    (OUT / "generation_config.json").unlink(missing_ok=True)
    model = AutoModelForCausalLM.from_pretrained(OUT, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    ref = {
        "format": "hf-tiny-reference/1",
        "arch": "lfm2",
        "model_type": "lfm2",
        "hf_class": "Lfm2ForCausalLM",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "weight_seed": 0,
        "dtype": "float32",
        "attn_implementation": "eager",
        "vocab_size": 512,
        "n_last": N_LAST,
        "n_new": N_NEW,
        "margin_min": MARGIN,
        "safetensors_sha256": hashlib.sha256((OUT / "model.safetensors").read_bytes()).hexdigest(),
        "cases": {name: case(model, n, seed) for name, (n, seed) in CASES.items()},
    }
    for name, c in ref["cases"].items():
        assert c["greedy"]["agrees_with_uncached_greedy"], name
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
