#!/usr/bin/env python3
"""Write a training checkpoint (scripts/demo/train.py) as the bundled demo model, daemon/demo/.

    ../venv/bin/python scripts/demo/export.py --ckpt ../demo-train/ckpt.pt [--out daemon/demo]

The main model is saved by transformers' own `save_pretrained`, so names and layouts are
transformers'. The MTP block becomes layer `num_hidden_layers`: its names are taken from a
`save_pretrained` of a model one layer deeper whose last layer is the MTP's decoder layer, plus
the nextn tensors (enorm, hnorm, eh_proj, shared_head.norm), as GLM-5 checkpoints store them.
Matrices are stored BF16 (the size limit of the binary); the router's weight and correction
bias stay F32 like GLM-5's, since the bias decides expert selection at a resolution BF16 lacks.
"""
import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import GlmMoeDsaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as T  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEEP_F32 = ("e_score_correction_bias", "mlp.gate.weight")


def store_dtype(name, t):
    return t.float() if any(k in name for k in KEEP_F32) else t.to(torch.bfloat16)


def load(ckpt_path, tok):
    cfg, model, mtp = T.build(tok)
    ck = torch.load(ckpt_path, weights_only=False)
    model.load_state_dict(ck["model"])
    mtp.load_state_dict(ck["mtp"])
    return cfg, model, mtp, ck["step"]


def saved_tensors(model):
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        tensors = {}
        for f in sorted(Path(d).glob("*.safetensors")):
            tensors.update(load_file(f))
        return tensors


def mtp_tensors(cfg, model, mtp):
    """Layer n's tensors as transformers would name them, plus the nextn extras."""
    n = cfg.num_hidden_layers
    deep = GlmMoeDsaForCausalLM(T.mtp_config(cfg)).float()
    state = {k: v for k, v in model.state_dict().items()}
    state.update({f"model.layers.{n}.{k}": v for k, v in mtp.layer.state_dict().items()})
    missing, unexpected = deep.load_state_dict(state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    out = {k: v for k, v in saved_tensors(deep).items() if k.startswith(f"model.layers.{n}.")}
    for k, v in mtp.checkpoint_tensors(n).items():
        if not k.startswith(f"model.layers.{n}.self_attn") and not k.startswith(
                f"model.layers.{n}.mlp") and "layernorm" not in k:
            out[k] = v
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "daemon" / "demo")
    args = ap.parse_args()
    tok_path = args.ckpt.parent / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_path))
    cfg, model, mtp, step = load(args.ckpt, tok)
    tensors = saved_tensors(model)
    tensors.update(mtp_tensors(cfg, model, mtp))
    tensors = {k: store_dtype(k, v).contiguous() for k, v in sorted(tensors.items())}

    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.out.glob("*.safetensors"):
        f.unlink()
    save_file(tensors, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    conf = cfg.to_dict()
    conf["num_nextn_predict_layers"] = 1
    conf["dtype"] = "bfloat16"
    conf["architectures"] = ["GlmMoeDsaForCausalLM"]
    (args.out / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    shutil.copy(tok_path, args.out / "tokenizer.json")
    size = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    print(f"step {step}: {len(tensors)} tensors, {args.out} holds {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
