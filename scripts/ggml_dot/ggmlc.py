"""llama.cpp's quantizers and portable dot products as a small C library (ggml-quants.c,
ggml-cpu/quants.c and stub.c, built with gcc, no cmake), for the fixture scripts here."""

import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np

F32P = ctypes.POINTER(ctypes.c_float)

# ggml type ids (ggml.h), block (elements, bytes), the activation blocks llama.cpp pairs it with.
TYPES = {
    "Q4_0": (2, 32, 18, "q8_0"), "Q4_1": (3, 32, 20, "q8_1"), "Q5_0": (6, 32, 22, "q8_0"),
    "Q5_1": (7, 32, 24, "q8_1"), "Q8_0": (8, 32, 34, "q8_0"), "Q2_K": (10, 256, 84, "q8_K"),
    "Q3_K": (11, 256, 110, "q8_K"), "Q4_K": (12, 256, 144, "q8_K"), "Q5_K": (13, 256, 176, "q8_K"),
    "Q6_K": (14, 256, 210, "q8_K"), "IQ2_XXS": (16, 256, 66, "q8_K"), "IQ2_XS": (17, 256, 74, "q8_K"),
    "IQ3_XXS": (18, 256, 98, "q8_K"), "IQ1_S": (19, 256, 50, "q8_K"), "IQ4_NL": (20, 32, 18, "q8_0"),
    "IQ3_S": (21, 256, 110, "q8_K"), "IQ2_S": (22, 256, 82, "q8_K"), "IQ4_XS": (23, 256, 136, "q8_K"),
    "IQ1_M": (29, 256, 56, "q8_K"), "MXFP4": (39, 32, 17, "q8_0"),
}


def cname(name: str) -> str:
    """ggml's C spelling: lower case, but the K-quants keep their capital K (q4_K)."""
    return name.lower().replace("_k", "_K")


def build(src: Path) -> ctypes.CDLL:
    """Compiles the library from llama.cpp's sources at `src` and loads it. No fused
    multiply-adds (-ffp-contract=off): the generic C's float operations one rounding each, the
    order colibri's portable reference follows."""
    lib = Path(tempfile.mkdtemp()) / "libggmldot.so"
    subprocess.run(
        ["gcc", "-O1", "-shared", "-fPIC", "-fno-fast-math", "-ffp-contract=off",
         "-I", src / "ggml/include", "-I", src / "ggml/src", "-I", src / "ggml/src/ggml-cpu",
         src / "ggml/src/ggml-quants.c", src / "ggml/src/ggml-cpu/quants.c",
         Path(__file__).parent / "stub.c", "-lm", "-o", lib],
        check=True, stderr=subprocess.DEVNULL)
    c = ctypes.CDLL(str(lib))
    # The lattice types' quantizers need their search tables.
    for t in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"):
        c.iq2xs_init_impl(ctypes.c_int(TYPES[t][0]))
    c.iq3xs_init_impl(ctypes.c_int(256))
    c.iq3xs_init_impl(ctypes.c_int(512))
    return c


def quantize(lib: ctypes.CDLL, name: str, w: np.ndarray) -> bytes:
    """The rows of 2-D f32 `w` in type `name`, as llama.cpp's quantizer writes them (an
    all-ones importance matrix for the types that require one)."""
    _, be, bb, _ = TYPES[name]
    w = np.ascontiguousarray(w, dtype=np.float32)
    rows, cols = w.shape
    dst = ctypes.create_string_buffer(rows * cols // be * bb)
    imatrix = np.ones(cols, dtype=np.float32)
    n = getattr(lib, f"quantize_{cname(name)}")(
        w.ctypes.data_as(F32P), dst, ctypes.c_int64(rows), ctypes.c_int64(cols),
        imatrix.ctypes.data_as(F32P))
    assert n == len(dst.raw), (name, n, len(dst.raw))
    return dst.raw
