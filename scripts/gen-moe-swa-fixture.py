#!/usr/bin/env python3
"""Writes the tiny random-weight Qwen2-MoE fixture with sliding-window layers
(crates/testkit/fixtures/hf-tiny/qwen2_moe_swa: config.json, model.safetensors, reference.json):
../shared/fixtures/hf-tiny/qwen2_moe's shapes and weight recipe (its README) with
`use_sliding_window` on, a window of 16 and `max_window_layers` 4, so transformers' rule makes
layers 0 and 2 sliding and 1 and 3 global; every prompt (24, 40, 80 tokens) crosses the window.

A mixture of experts whose attention mixes windowed and global layers: the expert choice of a
token depends on what its window let it see. llama.cpp's qwen2moe keeps no window, so there is
no GGUF of it.

Needs torch, transformers and safetensors (no GPU), e.g. /work/.venv-conv of
scripts/gen-gguf-fixtures.py; torch 2.15.0, transformers 5.24.0 made the committed files.
Deterministic: a rerun reproduces the weights and the prompt logits byte for byte; the cached
greedy steps' top logits can differ in the last bits on another CPU. CI reads the committed files.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2MoeConfig

from tiny_fixture import write_reference

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "testkit" / "fixtures" / "hf-tiny" / "qwen2_moe_swa"
WINDOW = 16


def config() -> Qwen2MoeConfig:
    return Qwen2MoeConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        norm_topk_prob=False,
        qkv_bias=True,
        rms_norm_eps=1e-6,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )


def fill(model) -> None:
    """hf-tiny's recipe: N(0, 1/fan_in) linears, lm_head std 2.5/8, router std 2/8, norms
    1 + N(0, 0.15^2), biases N(0, 0.2^2), embeddings N(0, 1)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                v = torch.randn(p.shape, generator=g)
            elif "norm" in name:
                v = 1.0 + torch.randn(p.shape, generator=g) * 0.15
            elif name.endswith("bias"):
                v = torch.randn(p.shape, generator=g) * 0.2
            elif name == "lm_head.weight":
                v = torch.randn(p.shape, generator=g) * 2.5 / 8
            elif name.endswith("mlp.gate.weight"):
                v = torch.randn(p.shape, generator=g) * 2 / 8
            else:
                v = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
            p.copy_(v)


def main() -> int:
    torch.manual_seed(0)
    cfg = config()
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 2, cfg.layer_types
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    fill(model)
    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT)
    (OUT / "generation_config.json").unlink(missing_ok=True)
    model = AutoModelForCausalLM.from_pretrained(OUT, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    # The window must matter: the same weights with every layer global give other logits.
    ids = torch.arange(4, 4 + 40)[None]
    with torch.no_grad():
        windowed = model(ids, use_cache=False).logits
        full_cfg = config()
        full_cfg.layer_types = ["full_attention"] * 4
        full = AutoModelForCausalLM.from_pretrained(
            OUT, config=full_cfg, attn_implementation="eager", dtype=torch.float32
        )(ids, use_cache=False).logits
    assert (windowed[0, :WINDOW] - full[0, :WINDOW]).abs().max() < 1e-5
    assert (windowed[0, WINDOW:] - full[0, WINDOW:]).abs().max() > 1e-2
    write_reference(model, OUT, "qwen2_moe", "qwen2_moe", "Qwen2MoeForCausalLM", 512)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
