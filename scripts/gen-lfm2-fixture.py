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
Deterministic: a rerun reproduces the weights and the prompt logits byte for byte; the cached greedy
steps' top logits can differ in the last bits on another CPU (seen: AMD vs Intel Xeon). CI reads the
committed files.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Lfm2Config

from tiny_fixture import write_reference

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "testkit" / "fixtures" / "hf-tiny" / "lfm2"


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


def main() -> int:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(), attn_implementation="eager", dtype=torch.float32)
    fill(model)
    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT)
    (OUT / "generation_config.json").unlink(missing_ok=True)
    model = AutoModelForCausalLM.from_pretrained(OUT, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    write_reference(model, OUT, "lfm2", "lfm2", "Lfm2ForCausalLM", 512)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
