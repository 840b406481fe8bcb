#!/usr/bin/env python3
"""Converts tiny Hugging Face fixtures (../shared/fixtures/hf-tiny) to GGUF with llama.cpp's own
converter, for crates/cpu/tests/hf_tiny.rs, which checks that each GGUF gives the logits of
its safetensors (the same random weights) to 1e-4.

The converter is `convert_hf_to_gguf.py` + `conversion/` + `gguf-py` as vendored in the PyPI sdist
`llama-cpp-python==0.3.36` (vendor/llama.cpp). It needs torch, numpy, safetensors, sentencepiece,
transformers and tokenizers, e.g. in a scratch venv outside the repository:
    python3 -m venv /work/.venv-conv && /work/.venv-conv/bin/pip install torch numpy safetensors \
        sentencepiece transformers jinja2 protobuf
    /work/.venv-conv/bin/python scripts/gen-gguf-fixtures.py --llama-cpp DIR/vendor/llama.cpp
(torch 2.15.0, transformers 5.24.0, tokenizers 0.23 were used for the committed files.)
CI does not run this script; it reads the committed files.

The fixtures have no tokenizer (their token ids are given directly), and the converter needs one:
as for the four model.gguf files of hf-tiny, a 512-entry byte-level BPE trained by `tokenizers` on
a fixed text (../shared/fixtures/llamacpp/ppl-text.txt) is placed beside a copy of the weights
for the conversion only, and the converter's
pre-tokenizer check is answered with `gpt-2`. Gemma and Gemma 2, whose converter reads only a
SentencePiece `tokenizer.model`, get one trained by `sentencepiece` on the same text (BPE, one
thread). GPT-2's config as transformers 5 writes it lacks `n_ctx`, which the converter reads as
the context length: the copy gets `n_ctx` = `n_positions`. Only the vocabulary is ours; every tensor and
hyperparameter is written by llama.cpp's converter code. Output is F32 (`--outtype f32`) so the
comparison with the safetensors path is exact up to summation order. `--fuse-gate-up-exps` writes
a second qwen3_next file with llama.cpp's fused expert tensor.
"""

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HF_TINY = ROOT.parent / "shared" / "fixtures" / "hf-tiny"
OUT = ROOT / "crates" / "testkit" / "fixtures" / "gguf-tiny"

# folder -> output files (name, extra converter arguments)
CASES = {
    "gemma": [("gemma.gguf", [])],
    "gemma2": [("gemma2.gguf", [])],
    "gpt2": [("gpt2.gguf", [])],
    "qwen2_moe": [("qwen2_moe.gguf", [])],
    "qwen3_moe": [("qwen3_moe.gguf", [])],
    # The fixtures have no multi-token-prediction block, which the converter otherwise requires.
    "qwen3_next": [
        ("qwen3_next.gguf", ["--no-mtp"]),
        ("qwen3_next-fused.gguf", ["--no-mtp", "--fuse-gate-up-exps"]),
    ],
    "qwen3_5": [("qwen3_5.gguf", ["--no-mtp"])],
    "qwen3_5_moe": [("qwen3_5_moe.gguf", ["--no-mtp"])],
    # This repository's own fixture (scripts/gen-lfm2-fixture.py).
    "lfm2": [("lfm2.gguf", [])],
}
REPO_TINY = ROOT / "crates" / "testkit" / "fixtures" / "hf-tiny"

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]

# BPE training on several threads breaks merge ties differently from run to run.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"


def write_tokenizer(dir_: Path) -> None:
    """A 512-entry byte-level BPE (deterministic: fixed text, one thread)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(), trainer=trainer)
    tok.save(str(dir_ / "tokenizer.json"))
    (dir_ / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
            }
        )
    )


def training_text() -> list[str]:
    """A fixed text, whatever becomes of this script: the Apache-2.0 license of the shared
    llama.cpp fixtures."""
    return (ROOT.parent / "shared" / "fixtures" / "llamacpp" / "ppl-text.txt").read_text().splitlines()


def write_sentencepiece(dir_: Path) -> None:
    """A SentencePiece BPE of at most 512 pieces (the converter pads to the model's vocabulary)."""
    import sentencepiece as spm

    text = dir_ / "text.txt"
    text.write_text("\n".join(training_text()))
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(dir_ / "tokenizer"),
        vocab_size=512,
        hard_vocab_limit=False,
        model_type="bpe",
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        byte_fallback=True,
        num_threads=1,
        minloglevel=2,
    )
    for f in ("text.txt", "tokenizer.vocab"):
        (dir_ / f).unlink()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path, help="vendor/llama.cpp of the sdist")
    ap.add_argument("only", nargs="*", help="fixture folders (default: all)")
    a = ap.parse_args()
    lc = a.llama_cpp.resolve()
    sys.path[:0] = [str(lc), str(lc / "gguf-py")]
    import convert_hf_to_gguf as conv
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    OUT.mkdir(parents=True, exist_ok=True)
    for folder, outs in CASES.items():
        if a.only and folder not in a.only:
            continue
        for name, extra in outs:
            with tempfile.TemporaryDirectory() as tmp:
                d = Path(tmp) / folder
                d.mkdir()
                src = REPO_TINY / folder if (REPO_TINY / folder).is_dir() else HF_TINY / folder
                for f in ("config.json", "model.safetensors"):
                    shutil.copy(src / f, d / f)
                if folder in ("gemma", "gemma2"):
                    write_sentencepiece(d)
                else:
                    write_tokenizer(d)
                if folder == "gpt2":
                    import json

                    cfg = json.loads((d / "config.json").read_text())
                    cfg.setdefault("n_ctx", cfg["n_positions"])
                    (d / "config.json").write_text(json.dumps(cfg, indent=2))
                out = OUT / name
                sys.argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--outfile", str(out)]
                sys.argv += extra + [str(d)]
                conv.main()
                print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
