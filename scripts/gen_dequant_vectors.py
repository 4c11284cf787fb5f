#!/usr/bin/env python3
"""Reference vectors for memra-gguf's dequantization and quantization.

Uses the PyPI `gguf` package (pip install gguf numpy), whose numpy code is bit-exact with
ggml's reference C, to write:

  gguf/testdata/dequant/<dtype>.bin   raw blocks and their dequantized f32 values
  gguf/testdata/quant/<dtype>.bin     f32 inputs and their quantized blocks

Format of both (all little-endian):
  4 bytes   magic: b"MDQV" (dequant) or b"MQTV" (quant)
  u32       ggml type id
  u32       number of values n (a whole number of blocks)
  u32       number of bytes m of the quantized data
  dequant:  m bytes of blocks, then n f32 values
  quant:    n f32 inputs, then m bytes of blocks

Run from the repository root: python3 scripts/gen_dequant_vectors.py
"""

import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, quants

OUT = Path(__file__).resolve().parent.parent / "gguf" / "testdata"
SEED = 20240611


def finite_f16(rng, n, hi=8.0):
    """f16 bit patterns of finite values spread over many exponents, as uint8 pairs."""
    mag = np.exp2(rng.uniform(np.log2(1e-6), np.log2(hi), n)) * rng.choice([-1, 1], n)
    v = mag.astype(np.float16)
    return v.view(np.uint8).reshape(n, 2)


def positive_f16(rng, n, lo, hi):
    v = np.exp2(rng.uniform(np.log2(lo), np.log2(hi), n)).astype(np.float16)
    return v.view(np.uint8).reshape(n, 2)


def random_blocks(rng, qtype, n_blocks):
    """Random raw blocks whose f16 scales are finite (no NaN/Inf)."""
    _, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    if qtype == T.F16:
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        # keep every class except NaN: normals, subnormals, zeros and infinities
        bits = bits[((bits & 0x7C00) != 0x7C00) | ((bits & 0x3FF) == 0)]
        edge = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7C00, 0xFC00, 0x7BFF], np.uint16)
        return np.concatenate([bits, edge]).view(np.uint8).reshape(-1, 2)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        bits = bits[(bits & 0x7F80) != 0x7F80]  # no NaN or Inf
        return bits.view(np.uint8).reshape(-1, 2)
    if qtype == T.F32:
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8).reshape(-1, 4)
    if qtype in (T.Q8_0, T.Q4_0):
        raw[:, 0:2] = finite_f16(rng, n_blocks)
    elif qtype == T.Q4_1:
        raw[:, 0:2] = finite_f16(rng, n_blocks)
        raw[:, 2:4] = finite_f16(rng, n_blocks)
    elif qtype == T.Q4_K:
        raw[:, 0:2] = positive_f16(rng, n_blocks, 1e-5, 1e-1)
        raw[:, 2:4] = positive_f16(rng, n_blocks, 1e-5, 1e-1)
    elif qtype == T.Q6_K:
        raw[:, 208:210] = positive_f16(rng, n_blocks, 1e-5, 1e-1)
    return raw


def write(path, magic, qtype, n_values, first, second):
    first, second = first.tobytes(), second.tobytes()
    m = len(first) if magic == b"MDQV" else len(second)
    path.write_bytes(magic + struct.pack("<III", int(qtype), n_values, m) + first + second)
    print(f"{path.relative_to(OUT.parent.parent)}: {n_values} values, {m} bytes")


def dequant_vectors(rng):
    counts = {T.F32: 256, T.F16: 1024, T.BF16: 1024, T.Q8_0: 64, T.Q4_0: 64, T.Q4_1: 64, T.Q4_K: 16, T.Q6_K: 16}
    for qtype, n_blocks in counts.items():
        blocks = random_blocks(rng, qtype, n_blocks)
        values = quants.dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(-1)
        write(OUT / "dequant" / f"{qtype.name.lower()}.bin", b"MDQV", qtype, values.size, blocks, values)


def quant_inputs(rng, n):
    """Gaussian values plus the awkward cases: a zero block, ties, a negative extreme."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(0.05)
    x[0:32] = 0.0
    x[32:64] = np.arange(-16, 16, dtype=np.float32) * np.float32(0.5)
    x[64:96] = np.linspace(-3.0, 1.0, 32, dtype=np.float32)
    x[96:128] = rng.integers(-4, 5, 32).astype(np.float32)
    return x


def quant_vectors(rng):
    for qtype in (T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1):
        x = quant_inputs(rng, 32 * 64)
        q = quants.quantize(x.reshape(-1, 32), qtype).view(np.uint8)
        write(OUT / "quant" / f"{qtype.name.lower()}.bin", b"MQTV", qtype, x.size, x, q)


def main():
    rng = np.random.default_rng(SEED)
    (OUT / "dequant").mkdir(parents=True, exist_ok=True)
    (OUT / "quant").mkdir(parents=True, exist_ok=True)
    dequant_vectors(rng)
    quant_vectors(rng)


if __name__ == "__main__":
    main()
