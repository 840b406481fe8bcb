#!/usr/bin/env python3
"""The gguf-py side of the quant tests (quant_gguf_py.rs, quant_models.rs). Results go to stdout.

    gguf_py_quant.py blocks TYPE FILE [TYPE FILE ...]
        Dequantise the raw blocks in FILE (TYPE is ggml's name: q4_K, iq2_xxs, bf16, ...) with
        gguf-py's gguf.quants.dequantize.
    gguf_py_quant.py tensors GGUF NAME [NAME ...]
        Dequantise the named tensors of a GGUF file, read with gguf-py's GGUFReader.
    gguf_py_quant.py quantize TYPE FILE
        Quantise the little-endian f32 values in FILE. q8_0 uses gguf-py's quantiser (written to
        be bit-exact with ggml's quantize_row_q8_0_ref); gguf-py has none for q8_1 and q8_K, so
        those use the numpy transcriptions of ggml's reference below.

Each dequantised result is written as a little-endian u32 ggml type id, a u64 element count, then
the values as little-endian f32. A quantisation result is the raw block bytes.
"""

import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, np_roundf, quantize

# Rows per dequantisation call when streaming a tensor, to keep memory flat.
CHUNK_ROWS = 4096


def qtype(name):
    try:
        return GGMLQuantizationType[name.upper()]
    except KeyError:
        sys.exit(f"gguf_py_quant.py: gguf-py has no type named {name!r}")


def write_result(out, type_id, values_chunks, n):
    out.write(struct.pack("<IQ", type_id, n))
    written = 0
    for values in values_chunks:
        values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        out.write(values.tobytes())
        written += values.size
    assert written == n, (written, n)


def cmd_blocks(args, out):
    if len(args) % 2 != 0:
        sys.exit("usage: gguf_py_quant.py blocks TYPE FILE [TYPE FILE ...]")
    for name, path in zip(args[0::2], args[1::2]):
        t = qtype(name)
        values = dequantize(np.fromfile(path, dtype=np.uint8), t)
        write_result(out, int(t), [values], values.size)


def cmd_tensors(args, out):
    if len(args) < 2:
        sys.exit("usage: gguf_py_quant.py tensors GGUF NAME [NAME ...]")
    reader = GGUFReader(args[0])
    by_name = {t.name: t for t in reader.tensors}
    for name in args[1:]:
        if name not in by_name:
            sys.exit(f"gguf_py_quant.py: {args[0]} has no tensor {name!r}")
        t = by_name[name]
        rows = t.data.reshape(-1, t.data.shape[-1])
        chunks = (dequantize(rows[i : i + CHUNK_ROWS], t.tensor_type) for i in range(0, rows.shape[0], CHUNK_ROWS))
        write_result(out, int(t.tensor_type), chunks, int(t.n_elements))


def quantize_q8_1(x):
    """ggml's quantize_row_q8_1_ref: Q8_0's d and quants, plus s = f16(sum(q) * d)."""
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    q = np_roundf(blocks * inv).astype(np.int8)  # C roundf: half away from zero
    s = q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32) * d
    return np.concatenate(
        [d.astype("<f2").view(np.uint8), s.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=1
    )


def nearest_int(x):
    """ggml's nearest_int: adding 1.5 * 2^23 in float32 rounds to nearest, ties to even."""
    bits = (x.astype(np.float32) + np.float32(12582912.0)).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def quantize_q8_k(x):
    """ggml's quantize_row_q8_K_ref: max = first value of largest |x|, iscale = -127 / max,
    q = min(127, nearest_int(iscale * x)), d = 1 / iscale, bsums = sums of 16 quants; an all-zero
    block gives d = 0 and zero quants (and, here and in ours, zero sums)."""
    blocks = x.reshape(-1, 256)
    n = blocks.shape[0]
    first_max = np.abs(blocks).argmax(axis=1)
    mx = blocks[np.arange(n), first_max].reshape(n, 1)
    zero = mx == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127) / mx)
        d = np.where(zero, np.float32(0), np.float32(1) / iscale)
    q = np.minimum(127, nearest_int(iscale * blocks)).astype(np.int8)
    q[zero[:, 0]] = 0
    bsums = q.astype(np.int16).reshape(n, 16, 16).sum(axis=2, dtype=np.int16)
    return np.concatenate(
        [d.astype("<f4").view(np.uint8), q.view(np.uint8), bsums.astype("<i2").view(np.uint8)], axis=1
    )


def cmd_quantize(args, out):
    if len(args) != 2:
        sys.exit("usage: gguf_py_quant.py quantize TYPE FILE")
    x = np.fromfile(args[1], dtype="<f4")
    name = args[0].lower()
    if name == "q8_0":
        result = quantize(x, GGMLQuantizationType.Q8_0)
    elif name == "q8_1":
        result = quantize_q8_1(x)
    elif name == "q8_k":
        result = quantize_q8_k(x)
    else:
        sys.exit(f"gguf_py_quant.py: no quantiser for {args[0]!r}")
    out.write(np.ascontiguousarray(result).tobytes())


def main():
    commands = {"blocks": cmd_blocks, "tensors": cmd_tensors, "quantize": cmd_quantize}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    out = sys.stdout.buffer
    commands[sys.argv[1]](sys.argv[2:], out)
    out.flush()


if __name__ == "__main__":
    main()
