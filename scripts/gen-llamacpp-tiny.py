#!/usr/bin/env python3
"""llama.cpp's outputs on the tiny GGUF fixtures (crates/testkit/fixtures/gguf-tiny, written by
scripts/gen-gguf-fixtures.py from the tiny HF fixtures), for crates/cpu/tests/hf_tiny.rs: for each
prompt of the fixture's reference.json, llama.cpp's logits at the last 4 prompt positions, its
argmax at every position and 16 greedy tokens decoded through its own cache, written beside the
GGUF as <name>.llamacpp.json.

llama.cpp is the one vendored in the PyPI sdist llama-cpp-python==0.3.36 (commit 0c1e57098), run
through that package's bindings: `pip install llama-cpp-python==0.3.36` builds it from the sdist
(CPU; CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
shortens the build), e.g. into /work/.venv-conv of scripts/gen-gguf-fixtures.py. Settings: f32
KV cache, flash attention off, 1 thread, one sequence — llama.cpp's most precise configuration;
with F32 weights its products take f32 activations.
CI does not run this script; it reads the committed files.
"""

import json
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama, llama_cpp

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / "crates" / "testkit" / "fixtures" / "gguf-tiny"
HF_TINY = ROOT.parent / "shared" / "fixtures" / "hf-tiny"
REPO_TINY = ROOT / "crates" / "testkit" / "fixtures" / "hf-tiny"
# file stem -> fixture folder. Not here: the DeltaNet hybrids (qwen3_next, qwen3_5, qwen3_5_moe),
# which this llama.cpp refuses to load ("blk.0.attn_qkv.weight has wrong shape; expected 64, 128,
# got 64, 160"): it takes the value head width to be the key head width (ssm.state_size), and the
# fixtures' are 24 and 16 (transformers allows them to differ).
FILES = {
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "lfm2": "lfm2",
}
N_LAST, N_NEW = 4, 16


def f32(x) -> float:
    return float(np.float32(x))


def main() -> int:
    for stem, folder in FILES.items():
        src = REPO_TINY / folder if (REPO_TINY / folder).is_dir() else HF_TINY / folder
        ref = json.loads((src / "reference.json").read_text())
        llm = Llama(
            model_path=str(GGUF / f"{stem}.gguf"), n_ctx=256, n_batch=256, n_threads=1,
            logits_all=True, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
            flash_attn=False, verbose=False, seed=0,
        )
        cases = {}
        for name, c in ref["cases"].items():
            ids = c["input_ids"]
            llm.reset()
            llm.eval(ids)
            scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
            greedy = []
            tok = int(scores[-1].argmax())
            for _ in range(N_NEW):
                greedy.append(tok)
                llm.eval([tok])
                tok = int(np.array(llm.scores[llm.n_tokens - 1]).argmax())
            last = list(range(len(ids) - N_LAST, len(ids)))
            cases[name] = {
                "input_ids": ids,
                "argmax": scores.argmax(-1).tolist(),
                "last_positions": last,
                "last_logits": [[f32(v) for v in scores[p]] for p in last],
                "greedy": greedy,
            }
        out = GGUF / f"{stem}.llamacpp.json"
        out.write_text(json.dumps({
            "format": "llamacpp-tiny/1",
            "llama_cpp_python": "0.3.36",
            "settings": {"type_k": "f32", "type_v": "f32", "flash_attn": False, "n_threads": 1},
            "cases": cases,
        }, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
