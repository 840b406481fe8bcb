#!/usr/bin/env python3
"""Writes the chat-template goldens that anelm's tests compare byte for byte, made by
transformers 5.24.0 (jinja2 3.1.6): `--models` (the default) for crates/engine/tests/chat_templates.rs,
`--real` for crates/tokenize/tests/real_templates.rs.

--models: for each model below, every conversation of crates/engine/tests/fixtures/chat_templates/conversations.json
is rendered by transformers' apply_chat_template (tokenize=False), with and without
add_generation_prompt, and the result (or the template's refusal) is written to
crates/engine/tests/fixtures/chat_templates/<case>.json.

The template of each model is chosen as anelm chooses it: the model's own (GGUF
tokenizer.chat_template), else its family's built-in template from
crates/tokenize/src/chat_template/builtin/. bos_token / eos_token are the model tokenizer's strings,
else the family's (the tiny HF configs have no tokenizer).

--real: every template of crates/tokenize/tests/fixtures/real_templates/templates/ (real models'
templates, as llama.cpp keeps them; see ORIGIN.md there) renders every case of cases.json (messages,
tools, template kwargs), with and without add_generation_prompt, into goldens/<template>.json. The
special tokens are fixed stand-ins (REAL_BOS / REAL_EOS) and strftime_now sees a fixed clock
(FIXED_NOW), which the Rust test injects too. The one-line templates of semantics_cases.json
(expressions, filters, tests and methods whose Python-Jinja meaning minijinja may not share) are
rendered into semantics_goldens.json.

Needs transformers, jinja2 and gguf (no torch), e.g. in a scratch venv outside the repository:
    python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install transformers jinja2 gguf
    /tmp/tvenv/bin/python scripts/gen-template-goldens.py [--models] [--real]
CI does not run this script; it reads the committed fixtures.
"""

import datetime as dt
import json
import os
import sys
from pathlib import Path

import gguf
import jinja2
import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/engine/tests/fixtures/chat_templates"
BUILTIN = ROOT / "crates/tokenize/src/chat_template/builtin"
MODELS = Path(os.environ.get("ANELM_MODELS", Path.home() / ".cache/anelm/models"))
HF_TINY = ROOT.parent / "shared/fixtures/hf-tiny"
REAL = ROOT / "crates/tokenize/tests/fixtures/real_templates"
REAL_BOS, REAL_EOS = "<|bos|>", "<|eos|>"
# The clock strftime_now reads for --real (local time, no zone), as the Rust test sets it.
FIXED_NOW = dt.datetime(2026, 7, 26, 14, 30, 5)
# The conversation the one-line templates of semantics_cases.json (Python-Jinja semantics) see.
SEMANTICS_MESSAGES = [{"role": "user", "content": "Hi"}]

# family -> (built-in template file, bos, eos): the same table as crates/tokenize/src/chat_template/builtin.rs.
FAMILY_BUILTIN = {
    "llama": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral": ("mistral", "<s>", "</s>"),
    "qwen2": ("chatml", None, "<|im_end|>"),
    "qwen3": ("chatml", None, "<|im_end|>"),
    "gemma": ("gemma", "<bos>", "<eos>"),
    "gemma2": ("gemma", "<bos>", "<eos>"),
    "gemma3": ("gemma3", "<bos>", "<eos>"),
    "gpt2": ("gpt2", "<|endoftext|>", "<|endoftext|>"),
}

# case name -> (model path relative to its root, family); GGUF files from the model cache, HF dirs from hf-tiny.
CASES = {
    "smollm2": (MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf", "llama"),
    "gemma3-270m": (MODELS / "gemma-3-270m-q4_k_m.gguf", "gemma3"),
    "hf-tiny-llama": (HF_TINY / "llama", "llama"),
    "hf-tiny-qwen2": (HF_TINY / "qwen2", "qwen2"),
    "hf-tiny-gemma": (HF_TINY / "gemma", "gemma"),
    "hf-tiny-mistral": (HF_TINY / "mistral", "mistral"),
    "hf-tiny-gpt2": (HF_TINY / "gpt2", "gpt2"),
}


def gguf_template_and_tokens(path):
    """The GGUF's own template (or None) and its BOS/EOS token strings."""
    reader = gguf.GGUFReader(str(path))
    fields = reader.fields

    def value(key):
        f = fields.get(key)
        return None if f is None else f.contents()

    tokens = value("tokenizer.ggml.tokens")
    bos_id, eos_id = value("tokenizer.ggml.bos_token_id"), value("tokenizer.ggml.eos_token_id")
    bos = tokens[bos_id] if bos_id is not None else None
    eos = tokens[eos_id] if eos_id is not None else None
    return value("tokenizer.chat_template"), bos, eos


def choose(path, family):
    """(template source, origin label, bos, eos) as anelm chooses them."""
    builtin_name, family_bos, family_eos = FAMILY_BUILTIN[family]
    builtin = (BUILTIN / f"{builtin_name}.jinja").read_text(encoding="utf-8")
    if path.suffix == ".gguf":
        own, bos, eos = gguf_template_and_tokens(path)
        if own is not None:
            return own, "gguf", bos, eos
        return builtin, f"builtin:{builtin_name}", bos, eos
    return builtin, f"builtin:{builtin_name}", family_bos, family_eos


def tokenizer_with(bos, eos):
    """A stand-in tokenizer whose only role is to carry the special-token strings that
    apply_chat_template hands to the template."""
    vocab = {"<unk>": 0}
    for t in (bos, eos):
        if t is not None:
            vocab.setdefault(t, len(vocab))
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), unk_token=None)
    if bos is not None:
        tok.bos_token = bos
    if eos is not None:
        tok.eos_token = eos
    return tok


def render(tok, template, messages, add_generation_prompt, tools=None, kwargs=None):
    try:
        text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                       add_generation_prompt=add_generation_prompt, tools=tools,
                                       **(kwargs or {}))
        return {"expected": text}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises a bare TemplateError; subclasses are Jinja's own failures.
        kind = "raised" if type(e) is jinja2.exceptions.TemplateError else "render"
        return {"error": kind, "message": str(e)}
    except Exception as e:  # any other failure of the template is a refusal too
        return {"error": "render", "message": f"{type(e).__name__}: {e}"}


class FixedClock(dt.datetime):
    """datetime whose now() is FIXED_NOW, put where transformers' strftime_now looks it up."""

    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


def main_real():
    chat_template_utils.datetime = FixedClock
    cases = json.loads((REAL / "cases.json").read_text(encoding="utf-8"))
    tok = tokenizer_with(REAL_BOS, REAL_EOS)
    total = identical_errors = 0
    for path in sorted((REAL / "templates").glob("*.jinja")):
        template = path.read_text(encoding="utf-8")
        renders = []
        for name, case in cases.items():
            for agp in (False, True):
                r = {"case": name, "add_generation_prompt": agp}
                r.update(render(tok, template, case["messages"], agp, case.get("tools"), case.get("kwargs")))
                renders.append(r)
        out = {
            "generator": f"scripts/gen-template-goldens.py --real (transformers {transformers.__version__}, jinja2 {jinja2.__version__})",
            "template": path.name,
            "bos_token": REAL_BOS,
            "eos_token": REAL_EOS,
            "now": FIXED_NOW.isoformat(),
            "renders": renders,
        }
        dest = REAL / "goldens" / f"{path.stem}.json"
        dest.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        n_err = sum("error" in r for r in renders)
        total += len(renders)
        identical_errors += n_err
        print(f"{dest.relative_to(ROOT)}: {len(renders)} renders ({n_err} refused or failed)")
    print(f"{total} renders, {identical_errors} refused or failed")
    semantics = json.loads((REAL / "semantics_cases.json").read_text(encoding="utf-8"))
    renders = []
    for source in semantics:
        r = {"template": source}
        r.update(render(tok, source, SEMANTICS_MESSAGES, False))
        renders.append(r)
    out = {
        "generator": f"scripts/gen-template-goldens.py --real (transformers {transformers.__version__}, jinja2 {jinja2.__version__})",
        "bos_token": REAL_BOS,
        "eos_token": REAL_EOS,
        "now": FIXED_NOW.isoformat(),
        "messages": SEMANTICS_MESSAGES,
        "renders": renders,
    }
    dest = REAL / "semantics_goldens.json"
    dest.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{dest.relative_to(ROOT)}: {len(renders)} one-line templates")


def main():
    args = set(sys.argv[1:])
    if args - {"--models", "--real"}:
        sys.exit("usage: gen-template-goldens.py [--models] [--real]")
    if "--real" in args:
        main_real()
    if "--models" in args or not args:
        main_models()


def main_models():
    conversations = json.loads((FIXTURES / "conversations.json").read_text(encoding="utf-8"))
    for case, (path, family) in CASES.items():
        if not path.exists():
            sys.exit(f"{path}: missing (fetch the models with scripts/fetch-models.py; hf-tiny is in ../shared)")
        template, origin, bos, eos = choose(path, family)
        tok = tokenizer_with(bos, eos)
        renders = []
        for name, messages in conversations.items():
            for agp in (False, True):
                r = {"conversation": name, "add_generation_prompt": agp}
                r.update(render(tok, template, messages, agp))
                renders.append(r)
        out = {
            "generator": f"scripts/gen-template-goldens.py (transformers {transformers.__version__}, jinja2 {jinja2.__version__})",
            "model": path.name if path.suffix == ".gguf" else f"hf-tiny/{path.name}",
            "family": family,
            "template": origin,
            "bos_token": bos,
            "eos_token": eos,
            "renders": renders,
        }
        dest = FIXTURES / f"{case}.json"
        dest.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        n_err = sum("error" in r for r in renders)
        print(f"{dest.relative_to(ROOT)}: {len(renders)} renders ({n_err} refused or failed) with {origin}")


if __name__ == "__main__":
    main()
