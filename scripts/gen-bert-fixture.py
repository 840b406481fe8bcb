#!/usr/bin/env python3
"""Writes a tiny BERT embedding model (transformers `bert`, WordPiece) as sentence-transformers
saves one — crates/testkit/fixtures/hf-tiny/bert (mean pooling, then unit length) — with
reference outputs, and its GGUF by llama.cpp's own converter (crates/testkit/fixtures/gguf-tiny/
bert.gguf), for crates/cpu/tests/encoder.rs and the embeddings tests.

Run with torch 2.15.0, transformers 5.24.0, sentence-transformers 6.3.0 (the versions that made
the committed files), e.g.
    /work/.venv-conv/bin/pip install sentence-transformers
    /work/.venv-conv/bin/python scripts/gen-bert-fixture.py --llama-cpp DIR/vendor/llama.cpp
where DIR is the unpacked `llama-cpp-python==0.3.36` sdist. CI reads the committed files.

The vocabulary: [PAD] [UNK] [CLS] [SEP] [MASK], every character of a fixed text (the Apache-2.0
license of the shared llama.cpp fixtures) alone and as a `##` continuation, and its 300 most
frequent lowercase words; the model: 2 layers, hidden 64, 4 heads, FFN 128, 64 positions,
weights redrawn N(0, 0.2) (LayerNorm gains around 1) so that nothing is trivial. reference.json
holds, per sentence, the ids the tokenizer gives (with [CLS] and [SEP]), the last hidden state of
every token (transformers), and sentence-transformers' own embedding of the text.
"""

import argparse
import collections
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from sentence_transformers import SentenceTransformer, models
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "testkit" / "fixtures" / "hf-tiny" / "bert"
GGUF = ROOT / "crates" / "testkit" / "fixtures" / "gguf-tiny" / "bert.gguf"
TEXT = ROOT.parent / "shared" / "fixtures" / "llamacpp" / "ppl-text.txt"

SENTENCES = [
    "The license grants a copyright license.",
    "Contributions are provided on an AS IS basis, without warranties!",
    "hello world",
    "Redistribution of the Work (or Derivative Works) in any medium — with or without modifications.",
    "a",
    "Zebra-crossing quixotic jukebox; 12345 and ünïcödé text.",
]


def vocabulary() -> list[str]:
    text = TEXT.read_text().lower()
    chars = sorted({c for c in text if not c.isspace()})
    words = collections.Counter(re.findall(r"[a-z]+", text))
    top = [w for w, _ in words.most_common(300) if len(w) > 1]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for piece in chars + ["##" + c for c in chars] + top:
        if piece not in vocab:
            vocab.append(piece)
    return vocab


def tokenizer(vocab: list[str]) -> PreTrainedTokenizerFast:
    """BERT's uncased WordPiece pipeline over `vocab`, [CLS] … [SEP] around each text."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    ids = {t: i for i, t in enumerate(vocab)}
    t = Tokenizer(WordPiece(ids, unk_token="[UNK]", max_input_chars_per_word=100))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    t.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(
        tokenizer_object=t, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"],
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", type=Path, help="vendor/llama.cpp of the sdist (for the GGUF)")
    a = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok = tokenizer(vocabulary())
        cfg = BertConfig(
            vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
            hidden_act="gelu", layer_norm_eps=1e-12,
        )
        model = BertModel(cfg, add_pooling_layer=False)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "LayerNorm.weight" in name:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                else:
                    p.copy_(0.2 * torch.randn_like(p))
        base = tmp / "base"
        model.save_pretrained(base)
        tok.save_pretrained(base)
        word = models.Transformer(str(base), max_seq_length=64)
        pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
        st = SentenceTransformer(modules=[word, pool, models.Normalize()], device="cpu")
        OUT.mkdir(parents=True, exist_ok=True)
        st.save(str(OUT))
    (OUT / "README.md").unlink(missing_ok=True)
    st = SentenceTransformer(str(OUT), device="cpu")
    hf = BertModel.from_pretrained(OUT, add_pooling_layer=False).eval()
    tok = AutoTokenizer.from_pretrained(OUT)
    cases = []
    for s in SENTENCES:
        ids = tok(s)["input_ids"]
        with torch.no_grad():
            hidden = hf(torch.tensor([ids])).last_hidden_state[0]
        emb = st.encode([s], convert_to_numpy=True)[0]
        cases.append({
            "text": s,
            "input_ids": ids,
            "hidden": [[float(np.float32(v)) for v in row] for row in hidden.tolist()],
            "embedding": [float(v) for v in emb.tolist()],
        })
    ref = {
        "generator": "scripts/gen-bert-fixture.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "sentence_transformers": __import__("sentence_transformers").__version__,
        "pooling": "mean",
        "normalize": True,
        "cases": cases,
    }
    (OUT / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"wrote {OUT}")
    if a.llama_cpp:
        lc = a.llama_cpp.resolve()
        sys.path[:0] = [str(lc), str(lc / "gguf-py")]
        import convert_hf_to_gguf as conv
        from conversion import base as conv_base

        # The vocabulary is ours, so the converter's table of known tokenizers cannot name it.
        conv_base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "bert-bge"
        sys.argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--outfile", str(GGUF), str(OUT)]
        conv.main()
        print(f"wrote {GGUF} ({GGUF.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
