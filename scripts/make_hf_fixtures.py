#!/usr/bin/env python3
"""Hugging Face-format checkpoints for `colibri convert` and FP8 loading, from the tiny fixtures.

    ../venv/bin/python scripts/make_hf_fixtures.py     # writes the directories below

Reads the float32 oracle fixtures that scripts/make_fixtures.py wrote and re-stores their
weights the way Hugging Face releases ship them:

* tests/fixtures/hf-bf16-moe/   tiny-moe-bias in BF16 (e_score_correction_bias stays F32), two
                                shards plus model.safetensors.index.json.
* tests/fixtures/hf-fp8-moe/    tiny-moe-bias in FP8 e4m3 as DeepSeek-V3 / GLM-5-FP8 do: every
                                linear weight `<name>` F8_E4M3 with `<name>_scale_inv` F32, one
                                scale per 128x128 block (amax / 448); embedding, lm_head, router,
                                indexer weights_proj, norms and biases BF16; plus an MTP head
                                (layer `num_hidden_layers`: a copy of layer 0 with eh_proj, enorm,
                                hnorm and shared_head.norm) that the engine ignores and the
                                converter writes to out-mtp-*.
* tests/fixtures/hf-fp8-dense/  tiny-dense-shared in FP8 the same way (dense MLPs and shared
                                experts), one shard.
* tests/fixtures/hf-fp8-deepseek-v3/, hf-fp8-deepseek-v32/
                                tiny-deepseek-v3 / -v32 in FP8 the same way (DeepSeek's own FP8
                                layout), with an MTP layer copied from the last decoder layer.
* tests/fixtures/fp8/           torch's float8_e4m3fn -> float32 for all 256 codes
                                (e4m3_table.json, as f32 bit patterns), and a [136, 140] FP8 tensor
                                with 2x2 block scales, whose last block row and column are partial,
                                with torch's dequantization (blocks.safetensors: w, w_scale_inv,
                                expected).

The references (ref.json, logits) stay in the source fixture directories: validate reads them
with --ref there. Every output is deterministic (fixed seeds, no clocks).
"""
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
BLOCK = 128
E4M3_MAX = 448.0


def load_dir(d):
    tensors = {}
    for f in sorted(d.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def is_fp8_target(name, t):
    """Linear weights that GLM-5-FP8 stores in FP8: 2-D `.weight`s but the ones kept in BF16."""
    if t.dim() != 2 or not name.endswith(".weight"):
        return False
    keep = ("embed_tokens", "lm_head", "mlp.gate.weight", "weights_proj", "norm")
    return not any(k in name for k in keep)


def fp8_blocks(w):
    """(codes as float8_e4m3fn, scale_inv f32 [ceil(O/128), ceil(I/128)]) with w ~ codes * scale."""
    O, I = w.shape
    bo, bi = -(-O // BLOCK), -(-I // BLOCK)
    scale = torch.zeros(bo, bi, dtype=torch.float32)
    for r in range(bo):
        for c in range(bi):
            blk = w[r * BLOCK:(r + 1) * BLOCK, c * BLOCK:(c + 1) * BLOCK]
            scale[r, c] = max(float(blk.abs().max()) / E4M3_MAX, 1e-12)
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:O, :I]
    codes = (w.float() / full).to(torch.float8_e4m3fn)
    return codes.contiguous(), scale.contiguous()


def to_hf(tensors, fp8):
    out = {}
    for name, t in tensors.items():
        if name.endswith("e_score_correction_bias"):
            out[name] = t.float().contiguous()
        elif fp8 and is_fp8_target(name, t):
            codes, scale = fp8_blocks(t)
            out[name] = codes
            out[name + "_scale_inv"] = scale
        else:
            out[name] = t.to(torch.bfloat16).contiguous()
    return out


def add_mtp(tensors, n_layers, hidden, source_layer):
    """An MTP head at layer n_layers in GLM-5's (and DeepSeek-V3's) naming: a copy of
    `source_layer`'s weights (a mixture-of-experts layer) plus the MTP extras."""
    g = torch.Generator().manual_seed(1234)
    src = f"model.layers.{source_layer}."
    for name, t in list(tensors.items()):
        if name.startswith(src):
            tensors[name.replace(src, f"model.layers.{n_layers}.", 1)] = t.clone()
    p = f"model.layers.{n_layers}"
    tensors[f"{p}.eh_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=g) * 0.05
    for n in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{p}.{n}.weight"] = 1.0 + torch.randn(hidden, generator=g) * 0.1


def write_checkpoint(src, dst, fp8, shards, mtp, mtp_source=0):
    cfg = json.loads((src / "config.json").read_text())
    tensors = load_dir(src)
    if mtp:
        add_mtp(tensors, cfg["num_hidden_layers"], cfg["hidden_size"], mtp_source)
    hf = to_hf(tensors, fp8)
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    names = sorted(hf)
    # Shards split by name order, a weight and its _scale_inv kept together.
    groups, per = [], -(-len(names) // shards)
    cur = []
    for n in names:
        cur.append(n)
        if len(cur) >= per and not n + "_scale_inv" in hf:
            groups.append(cur)
            cur = []
    if cur:
        groups.append(cur)
    weight_map, total = {}, 0
    for i, g in enumerate(groups):
        fname = (f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" if len(groups) > 1
                 else "model.safetensors")
        save_file({n: hf[n] for n in g}, str(dst / fname), metadata={"format": "pt"})
        for n in g:
            weight_map[n] = fname
            total += hf[n].numel() * hf[n].element_size()
    if len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if fp8:
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK]}
    cfg["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    gen = {"eos_token_id": cfg["eos_token_id"], "do_sample": False}
    (dst / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    print(f"{dst.relative_to(ROOT)}: {len(hf)} tensors in {len(groups)} shard(s)")


def write_reference_tables(dst):
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    vals = codes.to(torch.float32)
    bits = [int(b) & 0xFFFFFFFF for b in vals.view(torch.int32).tolist()]
    (dst / "e4m3_table.json").write_text(json.dumps({"f32_bits": bits}) + "\n")
    g = torch.Generator().manual_seed(7)
    O, I = 136, 140
    raw = torch.randint(0, 256, (O, I), generator=g, dtype=torch.int32).to(torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x38  # no NaN codes here: NaN is checked in the table
    w = raw.view(torch.float8_e4m3fn)
    scale = torch.tensor([[0.5, 3.0e-3], [1.7, 1e-5]], dtype=torch.float32)
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:O, :I]
    expected = w.to(torch.float32) * full
    save_file({"w": w.contiguous(), "w_scale_inv": scale, "expected": expected.contiguous()},
              str(dst / "blocks.safetensors"))
    print(f"{dst.relative_to(ROOT)}: e4m3 table and [{O}, {I}] block reference")


def main():
    torch.manual_seed(0)
    write_checkpoint(FIX / "tiny-moe-bias", FIX / "hf-bf16-moe", fp8=False, shards=2, mtp=False)
    write_checkpoint(FIX / "tiny-moe-bias", FIX / "hf-fp8-moe", fp8=True, shards=2, mtp=True)
    write_checkpoint(FIX / "tiny-dense-shared", FIX / "hf-fp8-dense", fp8=True, shards=1,
                     mtp=False)
    write_reference_tables(FIX / "fp8")
    # DeepSeek-V3 / V3.2 as deepseek-ai ships them: FP8 blocks, the config's own
    # quantization_config, and the MTP layer after the last decoder layer.
    for name in ("deepseek-v3", "deepseek-v32"):
        src = FIX / f"tiny-{name}"
        last = json.loads((src / "config.json").read_text())["num_hidden_layers"] - 1
        write_checkpoint(src, FIX / f"hf-fp8-{name}", fp8=True, shards=2, mtp=True,
                         mtp_source=last)


if __name__ == "__main__":
    main()
