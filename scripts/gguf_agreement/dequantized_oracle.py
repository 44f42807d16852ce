#!/usr/bin/env python3
"""The transformers oracle run on a GGUF's dequantized weights: what "computed exactly as
stored" gives, for scripts/gguf_agreement.sh's third figure beside llama.cpp's and colibri's.

Every tensor of each GGUF is dequantized by the `gguf` package, put in place of the fixture's
weights (tests/fixtures/kq-qwen3-moe/model.safetensors, which make_family_fixtures.py
remakes), and the model runs in float32 with eager attention over each case's full_ids.
Prints "FILE short_matched/n long_matched/n" per file (teacher-forced argmax vs tf_pred).

    dequantized_oracle.py FIXTURE_DIR FILE.gguf...
"""
import json
import sys
import tempfile
from pathlib import Path

import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

# llama.cpp's qwen3moe tensor names (convert_hf_to_gguf.py) to transformers'.
LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
         "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "ffn_gate_inp": "mlp.gate"}
EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
       "output_norm.weight": "model.norm.weight"}


def hf_names(name, n_experts):
    if name in TOP:
        return [TOP[name]]
    _, i, t, _ = name.split(".")
    if t in LAYER:
        return [f"model.layers.{i}.{LAYER[t]}.weight"]
    return [f"model.layers.{i}.mlp.experts.{e}.{EXPERTS[t]}.weight" for e in range(n_experts)]


def main():
    fix = Path(sys.argv[1])
    ref = json.loads((fix / "ref.json").read_text())
    config = json.loads((fix / "config.json").read_text())
    n_experts = config.get("num_local_experts", config.get("num_experts"))
    base = load_file(str(fix / "model.safetensors"))
    for f in sys.argv[2:]:
        sd = dict(base)
        for t in GGUFReader(f).tensors:
            v = torch.from_numpy(dequantize(t.data, t.tensor_type).astype("float32").copy())
            keys = hf_names(t.name, n_experts)
            v = v.reshape(len(keys), *sd[keys[0]].shape)
            for e, k in enumerate(keys):
                sd[k] = v[e].clone()
        with tempfile.TemporaryDirectory() as tmp:
            for n in ("config.json", "tokenizer.json"):
                (Path(tmp) / n).write_bytes((fix / n).read_bytes())
            save_file(sd, str(Path(tmp) / "model.safetensors"))
            model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
        out = []
        for case in ("short", "long"):
            with torch.no_grad():
                logits = model(torch.tensor([ref[case]["full_ids"]]), use_cache=False).logits[0]
            got = logits.argmax(-1).tolist()
            out.append(f"{sum(a == b for a, b in zip(got, ref[case]['tf_pred']))}/{len(got)}")
        print(Path(f).name, *out, flush=True)


if __name__ == "__main__":
    main()
