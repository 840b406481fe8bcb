"""Shared by the tiny-fixture generators (scripts/gen-*-fixture.py): the reference cases written
the way ../shared/fixtures/hf-tiny's reference.json is — random prompts redrawn until every
position's and every greedy step's top-2 gap is at least MARGIN, the last positions' logits, the
greedy continuation checked against uncached full passes — and the file that holds them.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import transformers

CASES = {"short": (24, 1000), "long": (40, 2000), "xlong": (80, 3000)}
N_LAST, N_NEW, MARGIN = 4, 16, 1e-3


def f32(x) -> float:
    return float(np.float32(x))


def case(model, n: int, seed: int, vocab: int) -> dict:
    rs = np.random.RandomState(seed)
    draws = 0
    while True:
        draws += 1
        ids = rs.randint(4, vocab, size=n).tolist()
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


def write_reference(model, out: Path, arch: str, model_type: str, hf_class: str, vocab: int) -> None:
    """reference.json of `model` (saved in `out`) over CASES; every greedy run must agree with
    uncached full passes."""
    ref = {
        "format": "hf-tiny-reference/1",
        "arch": arch,
        "model_type": model_type,
        "hf_class": hf_class,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "weight_seed": 0,
        "dtype": "float32",
        "attn_implementation": "eager",
        "vocab_size": vocab,
        "n_last": N_LAST,
        "n_new": N_NEW,
        "margin_min": MARGIN,
        "safetensors_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
        "cases": {name: case(model, n, seed, vocab) for name, (n, seed) in CASES.items()},
    }
    for name, c in ref["cases"].items():
        assert c["greedy"]["agrees_with_uncached_greedy"], name
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
