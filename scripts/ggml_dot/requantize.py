#!/usr/bin/env python3
"""A quantized GGUF from an F32 one, as llama.cpp's llama-quantize would make it for a pure
type (`--pure`): the matrices become TYPE with llama.cpp's own quantizers (ggmlc.py), the
router (`ffn_gate_inp`), the norms, biases and every 1-D tensor stay F32, and a matrix
whose rows are not whole blocks of TYPE falls back to Q8_0 (then F32), as llama-quantize falls
back. The metadata is copied unchanged but for `general.file_type`.

  scripts/ggml_dot/requantize.py LLAMA_CPP_DIR IN.gguf OUT.gguf TYPE
  (run with a Python that has numpy and llama.cpp's gguf-py)
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ggmlc import TYPES, build, quantize  # noqa: E402


def main() -> None:
    src, inp, out, qtype = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    sys.path.insert(0, str(src / "gguf-py"))
    import gguf

    lib = build(src)
    reader = gguf.GGUFReader(inp)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        if field.name == "general.file_type":
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vt, sub_type=sub)
    counts: dict[str, int] = {}
    for t in reader.tensors:
        data = np.asarray(t.data)
        ne = [int(n) for n in t.shape]  # ggml order: ne[0] is the row length
        keep = (
            t.tensor_type != gguf.GGMLQuantizationType.F32
            or len(ne) < 2
            or "ffn_gate_inp" in t.name
            or t.name.endswith(".bias")
            or "norm" in t.name
        )
        if keep:
            writer.add_tensor(t.name, data, raw_shape=list(reversed(ne)), raw_dtype=t.tensor_type)
            counts["F32"] = counts.get("F32", 0) + 1
            continue
        ty = next(c for c in (qtype, "Q8_0") if ne[0] % TYPES[c][1] == 0) if ne[0] % 32 == 0 else None
        if ty is None:
            writer.add_tensor(t.name, data, raw_shape=list(reversed(ne)), raw_dtype=t.tensor_type)
            counts["F32"] = counts.get("F32", 0) + 1
            continue
        rows = data.reshape(-1, ne[0]).astype(np.float32)
        raw = np.frombuffer(quantize(lib, ty, rows), dtype=np.uint8)
        qt = gguf.GGMLQuantizationType[ty]
        # raw_shape is the byte shape for quantized types (gguf-py converts it back).
        shape = list(reversed(ne))
        shape[-1] = ne[0] // TYPES[ty][1] * TYPES[ty][2]
        writer.add_tensor(t.name, raw.reshape(shape), raw_shape=shape, raw_dtype=qt)
        counts[ty] = counts.get(ty, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{out}: {counts}")


if __name__ == "__main__":
    main()
