#!/usr/bin/env python3
"""Reference data for colibri's GGUF reader and dequantizers, made with the `gguf` Python
package (gguf-py, llama.cpp's own reader/writer), so the Rust side is checked against the
implementation GGUF files are defined by rather than against itself.

Run with /work/venv-fixtures/bin/python (gguf and numpy installed); CI never runs it, the
outputs are committed:

  daemon/src/gguf/grids.rs                  the IQ grids and sign table, copied from quants.py
  tests/fixtures/gguf/dequant/<TYPE>.bin    raw blocks + the f32 bits gguf-py dequantizes them to
  tests/fixtures/gguf/small.gguf (+ .json)  a real file written by GGUFWriter, and what it holds
  tests/fixtures/gguf/split-0000N-of-00002.gguf  the same kind of file split in two parts

Fixture .bin layout (little-endian): b"CGDQ", u32 ggml type id, u32 n_blocks,
u32 block_bytes, u32 block_elems, then n_blocks*block_bytes raw bytes, then
n_blocks*block_elems u32 (the expected f32 bit patterns).
"""

import json
import subprocess
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "gguf"
rng = np.random.default_rng(49)

# Where each type keeps its f16 scale(s) inside a block (byte offsets), from the hsplit order
# in quants.py. Random bytes there could be NaN/Inf; they are overwritten with finite values.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ1_S: [0], T.IQ4_NL: [0], T.IQ4_XS: [0], T.TQ1_0: [52], T.TQ2_0: [64],
    T.MXFP4: [], T.IQ1_M: [],
}
# Types gguf-py can also quantize: half their blocks come from real data that way.
QUANTIZABLE = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.TQ1_0, T.TQ2_0, T.MXFP4}
N_BLOCKS = 8


def finite_f16(n):
    """n finite f16 values over many magnitudes, subnormals and both signs included."""
    mag = 2.0 ** rng.uniform(-20, 8, n)
    v = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    v[np.abs(v.astype(np.float32)) == np.inf] = np.float16(1.0)
    return v


def quant_blocks(ty):
    elems, nbytes = GGML_QUANT_SIZES[ty]
    out = []
    if ty in QUANTIZABLE:
        data = (rng.standard_normal((N_BLOCKS // 2, elems)) * 0.1).astype(np.float32)
        q = quants.quantize(data, ty).reshape(N_BLOCKS // 2, nbytes)
        out.extend(q)
    while len(out) < N_BLOCKS:
        b = rng.integers(0, 256, nbytes, dtype=np.uint8)
        for off in F16_FIELDS[ty]:
            b[off:off + 2] = np.frombuffer(finite_f16(1).tobytes(), dtype=np.uint8)
        if ty == T.IQ1_M:
            # The f16 scale is spread over the top nibbles of the last 8 bytes; redraw until
            # the values are finite.
            v = quants.dequantize(b.reshape(1, nbytes), ty)
            if not np.all(np.isfinite(v)):
                continue
        out.append(b)
    return np.stack(out).astype(np.uint8)


def plain_blocks(ty):
    n = 64
    if ty == T.F32:
        raw = (rng.standard_normal(n) * 2.0 ** rng.uniform(-30, 30, n)).astype(np.float32)
    elif ty == T.F16:
        raw = finite_f16(n)
    else:  # BF16: random bits whose exponent is not all ones (no NaN/Inf)
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32)
        bits = np.where((bits & 0x7F80) == 0x7F80, bits & ~np.uint32(0x4000), bits).astype(np.uint16)
        raw = bits
    return raw.view(np.uint8).reshape(n, -1)


def write_dequant_fixture(ty):
    elems, nbytes = GGML_QUANT_SIZES[ty]
    blocks = plain_blocks(ty) if elems == 1 else quant_blocks(ty)
    want = quants.dequantize(blocks.reshape(-1), ty).astype(np.float32, copy=False).reshape(-1)
    assert np.all(np.isfinite(want)), ty.name
    assert want.size == blocks.shape[0] * elems
    path = FIX / "dequant" / f"{ty.name}.bin"
    with open(path, "wb") as f:
        f.write(b"CGDQ")
        f.write(struct.pack("<IIII", int(ty), blocks.shape[0], nbytes, elems))
        f.write(blocks.tobytes())
        f.write(want.view(np.uint32).astype("<u4").tobytes())
    return path


def write_grids():
    """grids.rs: the IQ grid hex strings, their value maps and the sign table, verbatim."""
    lines = [
        "//! The IQ lattice grids and sign table, copied verbatim from gguf-py's quants.py by",
        "//! scripts/gguf_reference.py (do not edit: rerun the script). Each grid is a hex string",
        "//! of packed indices into its value map, decoded at compile time in `iq`.",
        "",
    ]
    for cls, name in [(quants.IQ2_XXS, "IQ2XXS"), (quants.IQ2_XS, "IQ2XS"), (quants.IQ2_S, "IQ2S"),
                      (quants.IQ3_XXS, "IQ3XXS"), (quants.IQ3_S, "IQ3S"), (quants.IQ1_S, "IQ1S")]:
        rows, width = cls.grid_shape
        hexs = cls.grid_hex.decode()
        lines.append(f"/// `{cls.__name__}.grid_hex`: {rows} rows of {width}.")
        lines.append(f"pub(super) const {name}_HEX: &[u8] = b\"\\")
        for i in range(0, len(hexs), 96):
            lines.append(f"    {hexs[i:i + 96]}\\")
        lines.append("\";")
        lines.append(f"pub(super) const {name}_ROWS: usize = {rows};")
        lines.append(f"pub(super) const {name}_WIDTH: usize = {width};")
        vals = ", ".join(f"{float(v):.1f}" for v in cls.grid_map)
        lines.append(f"/// `{cls.__name__}.grid_map`.")
        lines.append(f"pub(super) const {name}_MAP: [f32; {len(cls.grid_map)}] = [{vals}];")
        lines.append("")
    ks = quants.IQ2_XXS.ksigns
    lines.append("/// `IQ2_XXS.ksigns`: 7 sign bits to 8 (the eighth makes the parity even).")
    lines.append("pub(super) const KSIGNS: [u8; 128] = [")
    for i in range(0, 128, 16):
        lines.append("    " + ", ".join(f"0x{b:02x}" for b in ks[i:i + 16]) + ",")
    lines.append("];")
    lines.append("")
    lines.append(f"/// `IQ4_NL.kvalues`.")
    lines.append("pub(super) const IQ4NL_KVALUES: [i8; 16] = [" + ", ".join(str(v) for v in quants.IQ4_NL.kvalues) + "];")
    lines.append(f"/// `MXFP4.kvalues` (e2m1 values, doubled).")
    lines.append("pub(super) const MXFP4_KVALUES: [i8; 16] = [" + ", ".join(str(v) for v in quants.MXFP4.kvalues) + "];")
    out = ROOT / "daemon" / "src" / "gguf" / "grids.rs"
    out.write_text("\n".join(lines) + "\n")
    # Committed formatted, so rerunning the script leaves no diff.
    subprocess.run(["rustfmt", "--edition", "2021", str(out)], check=False)


def jsonable(v):
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8")
    if isinstance(v, (np.floating, float)):
        return float(v)
    if isinstance(v, (np.integer, int, bool, np.bool_)):
        return v.item() if hasattr(v, "item") else v
    return v


def small_tensors():
    """(name, numpy data, raw ggml type or None) for the small file."""
    t = []
    t.append(("token_embd.weight", rng.standard_normal((4, 32)).astype(np.float32), None))
    t.append(("blk.0.attn_norm.weight", rng.standard_normal(32).astype(np.float16), None))
    q8 = quants.quantize(rng.standard_normal((3, 64)).astype(np.float32), T.Q8_0)
    t.append(("blk.0.attn_q.weight", q8, T.Q8_0))
    # A 3-D stacked experts tensor: numpy (n_expert, rows, cols) = ggml ne [cols, rows, n_expert].
    exps = quants.quantize(rng.standard_normal((3, 4, 64)).astype(np.float32), T.Q4_0)
    t.append(("blk.0.ffn_gate_exps.weight", exps, T.Q4_0))
    q4k = quant_blocks(T.Q4_K)[:2].reshape(1, -1)  # one row of 512
    t.append(("blk.0.ffn_down.weight", q4k, T.Q4_K))
    return t


def add_metadata(w):
    w.add_string("general.name", "colibri-gguf-fixture")
    w.add_uint32("llama.expert_count", 3)
    w.add_uint32("llama.embedding_length", 32)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -7)
    w.add_float32("test.f32", 0.15625)
    w.add_bool("test.bool", True)
    w.add_uint64("test.u64", 1 << 40)
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.strings", ["a", "ß", ""])
    w.add_token_list(["<unk>", "hello", " wörld", "\n"])


def describe(path, extra=None):
    r = gguf.GGUFReader(path)
    meta = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        types = [int(x) for x in f.types]
        val = f.contents()
        meta[f.name] = {"types": types, "value": jsonable(val)}
    tensors = []
    for ti in r.tensors:
        data = np.asarray(ti.data)
        deq = quants.dequantize(data, ti.tensor_type).astype(np.float32).reshape(-1)
        tensors.append({
            "name": ti.name,
            "type": int(ti.tensor_type),
            "ne": [int(x) for x in ti.shape],
            "offset": int(ti.data_offset),
            "n_bytes": int(ti.n_bytes),
            "f32_bits": [int(x) for x in deq.view(np.uint32)],
        })
    out = {"metadata": meta, "tensors": tensors}
    if extra:
        out.update(extra)
    return out


def write_small():
    path = FIX / "small.gguf"
    w = gguf.GGUFWriter(path, "llama")
    add_metadata(w)
    for name, data, raw in small_tensors():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (FIX / "small.json").write_text(json.dumps(describe(path), ensure_ascii=False) + "\n")


def write_split():
    base = FIX / "split.gguf"
    w = gguf.GGUFWriter(base, "llama", split_max_tensors=3)
    add_metadata(w)
    for name, data, raw in small_tensors():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = sorted(FIX.glob("split-*-of-*.gguf"))
    assert len(parts) == 2, parts
    desc = {"parts": [describe(p) for p in parts]}
    (FIX / "split.json").write_text(json.dumps(desc, ensure_ascii=False) + "\n")


def main():
    (FIX / "dequant").mkdir(parents=True, exist_ok=True)
    write_grids()
    types = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K,
             T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S,
             T.IQ1_S, T.IQ1_M, T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.MXFP4]
    for ty in types:
        write_dequant_fixture(ty)
    write_small()
    write_split()
    total = sum(p.stat().st_size for p in FIX.rglob("*") if p.is_file())
    print(f"{len(types)} dequant fixtures; fixtures total {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
