"""llama.cpp's programs, built once from the source vendored in the `llama-cpp-python` sdist.

Shared by bench/compare-llamacpp (llama-bench) and bench/serve-concurrency.py (llama-server): one
source tree and one build directory under ~/.cache/anelm/llama.cpp, configured without
GGML_NATIVE (its -march=native build fails on some x86-64 machines, e.g. a Xeon whose AMX is not
enabled): ggml's default x86-64 build, AVX2/FMA/F16C. Needs pip, cmake (pip installs it if
missing) and a C++ compiler; the first build takes several minutes on two cores.
"""

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

CACHE = Path.home() / ".cache" / "anelm" / "llama.cpp"
DEFAULT_VERSION = "0.3.36"  # the version the fixtures in shared/fixtures/llamacpp were made with


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def build(target, version=DEFAULT_VERSION):
    """Builds one of llama.cpp's programs (`llama-bench`, `llama-server`); returns its path."""
    src_root = CACHE / f"llama_cpp_python-{version}"
    out = CACHE / f"build-{version}"
    exe = out / "bin" / target
    if exe.exists():
        return exe
    CACHE.mkdir(parents=True, exist_ok=True)
    if not src_root.exists():
        tarball = CACHE / f"llama_cpp_python-{version}.tar.gz"
        if not tarball.exists():
            # Only this package as source; its build requirements may come as wheels.
            run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                 f"llama-cpp-python=={version}", "-d", CACHE])
        with tarfile.open(tarball) as tf:
            tf.extractall(CACHE, filter="data")
    cmake = shutil.which("cmake")
    if cmake is None:
        run([sys.executable, "-m", "pip", "install", "cmake"])
        cmake = shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")
    llama = src_root / "vendor" / "llama.cpp"
    run([cmake, "-S", llama, "-B", out, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
         "-DBUILD_SHARED_LIBS=OFF"])
    run([cmake, "--build", out, "--target", target, "-j", str(os.cpu_count() or 2)])
    return exe
