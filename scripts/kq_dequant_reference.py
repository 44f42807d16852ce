#!/usr/bin/env python3
"""What the `gguf` package (gguf-py, llama.cpp's own reader) dequantizes every quantized tensor
of the K-quant / IQ GGUFs to (tests/fixtures/gguf/kq-qwen3-moe-*.gguf, made by
llama-quantize in scripts/make_gguf_fixtures.sh): the blocks llama.cpp's quantizers really
write, at the model's shapes, where tests/fixtures/gguf/dequant holds random blocks.

Per tensor: its type, its element count, the FNV-1a 64 hash of its f32 bit patterns in file
order (little-endian bytes) and its first 8 values' bits, in
tests/fixtures/gguf/kq-qwen3-moe-dequant.json (daemon/tests/gguf_kq_dequant.rs compares).

    /work/venv-fixtures/bin/python scripts/kq_dequant_reference.py
"""
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "gguf"
PLAIN = {T.F32, T.F16, T.BF16}


def fnv1a64(data: bytes) -> int:
    # Byte by byte over the little-endian f32s, as daemon/tests/gguf_kq_dequant.rs hashes.
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    out = {}
    for f in sorted(FIX.glob("kq-qwen3-moe-*.gguf")):
        if f.name.endswith("-f32.gguf"):
            continue
        tensors = {}
        for t in GGUFReader(f).tensors:
            if t.tensor_type in PLAIN:
                continue
            v = dequantize(t.data, t.tensor_type).astype("<f4").reshape(-1)
            assert v.size == int(np.prod(t.shape)), t.name
            bits = v.view("<u4")
            tensors[t.name] = {"type": t.tensor_type.name, "n": int(v.size),
                               "fnv1a64": f"{fnv1a64(v.tobytes()):016x}",
                               "first": [int(x) for x in bits[:8]]}
        out[f.name] = tensors
        print(f.name, len(tensors), file=sys.stderr)
    (FIX / "kq-qwen3-moe-dequant.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
