#!/usr/bin/env python3
"""Writes tiny random-weight mixture-of-experts fixtures beside ../shared/fixtures/hf-tiny's, in
layouts those do not cover (crates/testkit/fixtures/hf-tiny/<name>: config.json,
model.safetensors, reference.json), with hf-tiny's shapes and weight recipe (its README):

- qwen2_moe_swa: Qwen2-MoE with `use_sliding_window` on, a window of 16 and `max_window_layers`
  4, so transformers' rule makes layers 0 and 2 sliding and 1 and 3 global; every prompt (24,
  40, 80 tokens) crosses the window. The expert choice of a token depends on what its window let
  it see. llama.cpp's qwen2moe keeps no window, so there is no GGUF of it.
- qwen3_moe_mixed: Qwen3-MoE with dense and mixture layers interleaved (`mlp_only_layers` [0],
  `decoder_sparse_step` 2: layers 0 and 2 dense, 1 and 3 mixtures), 6 experts, top-3, the top-k
  weights not renormalised (`norm_topk_prob` false).

Needs torch, transformers and safetensors (no GPU), e.g. /work/.venv-conv of
scripts/gen-gguf-fixtures.py; torch 2.15.0, transformers 5.24.0 made the committed files.
Deterministic: a rerun reproduces the weights and the prompt logits byte for byte; the cached
greedy steps' top logits can differ in the last bits on another CPU. CI reads the committed files.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2MoeConfig, Qwen3MoeConfig

from tiny_fixture import write_reference

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates" / "testkit" / "fixtures" / "hf-tiny"
WINDOW = 16


def swa_config() -> Qwen2MoeConfig:
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


def mixed_config() -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=24,
        norm_topk_prob=False,
        decoder_sparse_step=2,
        mlp_only_layers=[0],
        rms_norm_eps=1e-6,
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


def build(cfg, out: Path):
    """The model of `cfg` with hf-tiny's weights, saved in `out` and loaded back from it."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    fill(model)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def swa() -> None:
    cfg = swa_config()
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 2, cfg.layer_types
    out = FIXTURES / "qwen2_moe_swa"
    model = build(cfg, out)
    # The window must matter: the same weights with every layer global give other logits.
    ids = torch.arange(4, 4 + 40)[None]
    with torch.no_grad():
        windowed = model(ids, use_cache=False).logits
        full_cfg = swa_config()
        full_cfg.layer_types = ["full_attention"] * 4
        full = AutoModelForCausalLM.from_pretrained(
            out, config=full_cfg, attn_implementation="eager", dtype=torch.float32
        )(ids, use_cache=False).logits
    assert (windowed[0, :WINDOW] - full[0, :WINDOW]).abs().max() < 1e-5
    assert (windowed[0, WINDOW:] - full[0, WINDOW:]).abs().max() > 1e-2
    write_reference(model, out, "qwen2_moe", "qwen2_moe", "Qwen2MoeForCausalLM", 512)
    print(f"wrote {out}")


def mixed() -> None:
    out = FIXTURES / "qwen3_moe_mixed"
    model = build(mixed_config(), out)
    kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
    assert kinds == ["Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"] * 2, kinds
    write_reference(model, out, "qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", 512)
    print(f"wrote {out}")


def main() -> int:
    swa()
    mixed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
