#!/usr/bin/env python3
"""Reference values for colibri's GGUF dot products (daemon/src/quant/ggml), made by
llama.cpp's own C: its quantizers (ggml-quants.c) make realistic weight rows of every type
colibri computes as stored, its reference quantizers turn activations into Q8_0 / Q8_1 / Q8_K
blocks, and its portable CPU dot products (ggml-cpu/quants.c, the `_generic` functions)
give the results colibri's portable reference must reproduce bit for bit.

The two C files and stub.c (the four ggml symbols they need) are compiled into a small
library with gcc, no cmake; the llama.cpp sources are the ones make_gguf_fixtures.sh
unpacks from the llama-cpp-python sdist. CI never runs this; the output is committed:

  tests/fixtures/gguf/dot/reference.json

  scripts/ggml_dot/make_reference.py LLAMA_CPP_DIR [PYTHON-with-numpy runs this file]
"""

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ggmlc import F32P, TYPES, build, cname, quantize  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(sys.argv[1])
OUT = ROOT / "tests/fixtures/gguf/dot/reference.json"

COLS = 512
ROWS = 3
POSITIONS = 2

ACT_BLOCK = {"q8_0": (32, 34), "q8_1": (32, 36), "q8_K": (256, 292)}


def main() -> None:
    lib = build(SRC)

    rng = np.random.default_rng(49)
    x = rng.standard_normal((POSITIONS, COLS)).astype(np.float32)
    # One outlier a position: the activation scales are set by a few large values, as in models.
    x[:, 7] *= 6.0
    acts = {}
    for kind, (be, bb) in ACT_BLOCK.items():
        blocks = []
        for p in range(POSITIONS):
            buf = ctypes.create_string_buffer(COLS // be * bb)
            getattr(lib, f"quantize_row_{kind}_ref")(x[p].ctypes.data_as(F32P), buf, ctypes.c_int64(COLS))
            blocks.append(buf.raw)
        acts[kind] = blocks

    out = {
        "cols": COLS,
        "x": [[int(v) for v in row.view(np.uint32)] for row in x],
        "act": {k: [b.hex() for b in v] for k, v in acts.items()},
        "types": {},
    }
    for name, (tid, be, bb, kind) in TYPES.items():
        w = (rng.standard_normal((ROWS, COLS)) * 0.05).astype(np.float32)
        raw = quantize(lib, name, w)
        dot = getattr(lib, f"ggml_vec_dot_{cname(name)}_{kind}_generic")
        dots = []
        for r in range(ROWS):
            row = raw[r * COLS // be * bb:(r + 1) * COLS // be * bb]
            per = []
            for p in range(POSITIONS):
                s = ctypes.c_float(0)
                dot(ctypes.c_int(COLS), ctypes.byref(s), ctypes.c_size_t(0), row, ctypes.c_size_t(0),
                    acts[kind][p], ctypes.c_size_t(0), ctypes.c_int(1))
                per.append(int(np.array([s.value], dtype=np.float32).view(np.uint32)[0]))
            dots.append(per)
        out["types"][name] = {"act": kind, "rows": raw.hex(), "dots": dots}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
