#!/usr/bin/env python3
"""Tiny DeepSeek-V4 in the layout deepseek-ai publishes DeepSeek-V4-Flash in, with its oracle.

The model is scripts/make_fixture_deepseek_v4.py's architecture (every layer kind, hash and
score routing, hyper-connections, the clamped SwiGLU), its experts 32 wide so that FP4's groups
of 32 inputs fit every routed matrix. Its weights are stored as the published checkpoint
stores them (names of DeepSeek's own inference code, transformers' `conversion_mapping.py`
`deepseek_v4` read backwards; dtypes as the published headers have them):

* routed experts `layers.{l}.ffn.experts.{e}.w1/w2/w3.weight`: I8, two e2m1 (FP4) values a byte,
  the even element in the low nibble, beside `.scale`: F8_E8M0, one per 32 inputs of a row;
* attention `wq_a`, `wq_b`, `wkv`, `wo_a`, `wo_b`, the indexer's `wq_b` and the shared expert
  `w1/w2/w3`: F8_E4M3 beside `.scale`: F8_E8M0, one per 128x128 block;
* the embedding `embed.weight`, `head.weight`, the norms, the router `ffn.gate.weight`, the
  compressors' `wkv`/`wgate` and the indexer's `weights_proj`: BF16; the hyper-connections
  (`hc_*`, `hc_head_*`), `attn_sink`, the compressors' `ape`, the router's `gate.bias`: F32;
  the hash layers' `ffn.gate.tid2eid`: I64;
* two shards and `model.safetensors.index.json`, and a config with the published
  `quantization_config` (fp8, e4m3, ue8m0 scales, 128x128 blocks) and `expert_dtype: fp4`.

The oracle is transformers (float32, eager) on the DEQUANTIZED weights: every matrix above is
quantized, then put back in the model as its exact dequantized values (BF16 ones rounded to
BF16), and the reference tokens and logits are that model's. Each stored tensor is checked to
dequantize to the model's values bit for bit before it is written, by this script and by
transformers' own FP8/FP4 dequantization (integrations/finegrained_fp8.py). Seeds whose margins fall
below MIN_GAP are skipped, as in the other fixtures.

    ../venv-fixtures/bin/python scripts/make_fixture_deepseek_v4_published.py
"""
import json
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.integrations.finegrained_fp8 import Fp8Dequantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import LONG_TEXT, MIN_GAP, ROOT, make_tokenizer  # noqa: E402
from make_family_fixtures import DEEPSEEK_SPECIALS, deepseek_chat  # noqa: E402
from make_fixture_deepseek_v4 import (  # noqa: E402
    CONFIG, LONG_NEW, LONG_PROMPT, SHORT_NEW, STDS, VOCAB, check_cached, redraw, run_case)
from make_fixture_gpt_oss import FP4, mxfp4_dequantize, mxfp4_quantize  # noqa: E402

DIR = "tests/fixtures/tiny-deepseek-v4-published"
# FP4 groups are 32 inputs: down_proj's inputs are the experts' width.
PUB_CONFIG = dict(CONFIG, moe_intermediate_size=32)
BLOCK = 128
E4M3_MAX = 448.0

# Saved (reference) names -> storage class.
FP8 = (".attn.wq_a.", ".attn.wq_b.", ".attn.wkv.", ".attn.wo_a.", ".attn.wo_b.",
       ".indexer.wq_b.", ".shared_experts.")
FP32 = ("hc_", "attn_sink", ".ape", ".gate.bias")


def fp8_quantize(w):
    """[rows, cols] f32 -> (e4m3 codes as u8, e8m0 block scales [ceil(r/128), ceil(c/128)]):
    each block's scale the power of two bringing its largest magnitude to at most 448."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    exps = torch.zeros(br, bc)
    q = torch.empty_like(w)
    for i in range(br):
        for j in range(bc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = blk.abs().max().clamp(min=2.0 ** -126)
            e = torch.ceil(torch.log2(amax / E4M3_MAX)).clamp(-127, 127)
            exps[i, j] = e
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = blk / 2.0 ** e
    codes = q.to(torch.float8_e4m3fn)
    return codes.view(torch.uint8), (exps + 127).to(torch.uint8)


def fp8_dequantize(codes, scales):
    vals = codes.view(torch.float8_e4m3fn).to(torch.float32)
    s = torch.pow(2.0, scales.to(torch.float32) - 127)
    s = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return vals * s[: vals.shape[0], : vals.shape[1]]


def fp4_quantize(w):
    """[rows, cols] -> (I8 bytes [rows, cols/2], e8m0 [rows, cols/32]): gpt-oss's MXFP4 codes
    (the same arithmetic), laid out as V4 stores them."""
    blocks, scales = mxfp4_quantize(w)
    rows, cols = w.shape
    return blocks.reshape(rows, cols // 2), scales.reshape(rows, cols // 32)


def fp4_dequantize(packed, scales):
    rows, half = packed.shape
    return mxfp4_dequantize(packed.reshape(rows, half // 16, 16), scales).reshape(rows, 2 * half)


def bf16(w):
    return w.to(torch.bfloat16).to(torch.float32)


def quantize_model(model):
    """Puts every stored-quantized parameter back as its dequantized values, in place."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp.experts." in name:
                for e in range(p.shape[0]):
                    p[e] = fp4_dequantize(*fp4_quantize(p[e]))
            elif any(k in name for k in (
                    "self_attn.q_a_proj.", "self_attn.q_b_proj.", "self_attn.kv_proj.",
                    "self_attn.o_a_proj.", "self_attn.o_b_proj.", "indexer.q_b_proj.",
                    "shared_experts.")):
                p.copy_(fp8_dequantize(*fp8_quantize(p)))
            elif any(k in name for k in ("hc", "sinks", "position_bias")):
                pass
            else:
                p.copy_(bf16(p))


def published(name):
    """transformers' saved name -> the published one."""
    top = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    if name in top:
        return top[name]
    if name.startswith("model.hc_head.hc_"):
        return "hc_head_" + name[len("model.hc_head.hc_"):]
    if name.startswith("model.layers."):
        return name[len("model."):]
    return name


def transformers_dequantize(weight, scales, torch_dtype):
    """transformers' own reading of a stored pair (`Fp8Dequantize._dequantize_one`, what its
    FP8 loader runs on DeepSeek-V4-Flash with `dequantize=True`): the check that the bytes
    mean what the reference model holds, nibble order and scale grids included."""
    w = weight.view(torch_dtype) if torch_dtype is not None else weight.view(torch.int8)
    s = scales.view(torch.float8_e8m0fnu)
    return Fp8Dequantize(None)._dequantize_one(w, s, output_dtype=torch.float32)


def stored(name, w):
    """[(name, safetensors dtype, shape, bytes)] of one published tensor, checked to read back
    as `w` exactly."""
    if w.dtype == np.int64:
        return [(name, "I64", list(w.shape), w.astype("<i8").tobytes())]
    t = torch.from_numpy(w.copy())
    base = name[: -len(".weight")] if name.endswith(".weight") else None
    if base and ".ffn.experts." in name:
        packed, scales = fp4_quantize(t)
        assert torch.equal(fp4_dequantize(packed, scales), t), name
        assert torch.equal(transformers_dequantize(packed, scales, None), t), name
        return [(name, "I8", list(packed.shape), packed.numpy().tobytes()),
                (base + ".scale", "F8_E8M0", list(scales.shape), scales.numpy().tobytes())]
    if base and any(k in name for k in FP8):
        codes, scales = fp8_quantize(t)
        assert torch.equal(fp8_dequantize(codes, scales), t), name
        assert torch.equal(transformers_dequantize(codes, scales, torch.float8_e4m3fn), t), name
        return [(name, "F8_E4M3", list(codes.shape), codes.numpy().tobytes()),
                (base + ".scale", "F8_E8M0", list(scales.shape), scales.numpy().tobytes())]
    if any(k in name for k in FP32):
        return [(name, "F32", list(w.shape), w.astype("<f4").tobytes())]
    b = t.to(torch.bfloat16)
    assert torch.equal(b.to(torch.float32), t), name
    return [(name, "BF16", list(w.shape), b.view(torch.int16).numpy().tobytes())]


def write_safetensors(path, entries):
    header, offset, blobs = {}, 0, []
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def save_published(model, out):
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tensors = {}
        for f in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update(load_file(str(f)))
        config = json.loads((Path(tmp) / "config.json").read_text())
    shards = {1: [], 2: []}
    for name in sorted(tensors):
        pub = published(name)
        shards[2 if ".ffn.experts." in pub else 1].extend(stored(pub, tensors[name]))
    weight_map, total = {}, 0
    for i, entries in shards.items():
        fname = f"model-{i:05d}-of-00002.safetensors"
        write_safetensors(out / fname, entries)
        for name, _, _, data in entries:
            weight_map[name] = fname
            total += len(data)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                     "quant_method": "fp8", "scale_fmt": "ue8m0",
                                     "weight_block_size": [BLOCK, BLOCK]}
    config["expert_dtype"] = "fp4"
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return len(weight_map)


def main():
    out = ROOT / DIR
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(VOCAB, DEEPSEEK_SPECIALS)
    vocab = tok.get_vocab_size()
    eos = [tok.token_to_id("<｜end▁of▁sentence｜>")]
    short_ids = tok.encode(deepseek_chat("Hello! How are you today?")).ids
    long_ids = tok.encode(deepseek_chat(LONG_TEXT)).ids[:LONG_PROMPT]
    kwargs = dict(PUB_CONFIG, vocab_size=vocab, eos_token_id=eos, bos_token_id=None,
                  pad_token_id=None)
    assert FP4[1] == 0.5
    for seed in range(1, 400):
        torch.manual_seed(seed)
        config = DeepseekV4Config(**kwargs)
        config._attn_implementation = "eager"
        model = DeepseekV4ForCausalLM(config).float().eval()
        redraw(model, seed, STDS)
        quantize_model(model)
        cases, all_gaps, ok = {}, {}, True
        for name, pids, n_new in [("short", short_ids, SHORT_NEW), ("long", long_ids, LONG_NEW)]:
            case, logits, gaps = run_case(model, pids, n_new)
            cases[name] = (case, logits)
            all_gaps[name] = gaps
            if any(g is not None and g < MIN_GAP for g in gaps.values()):
                ok = False
                break
        if ok:
            break
        print(f"{DIR}: seed {seed} rejected ({all_gaps})", file=sys.stderr)
    else:
        raise SystemExit(f"{DIR}: no seed with margins >= {MIN_GAP}")
    cached_err = check_cached(model, cases["long"][0]["full_ids"])
    for f in list(out.glob("*.safetensors")) + list(out.glob("*.json")):
        f.unlink()
    n = save_published(model, out)
    tok.save(str(out / "tokenizer.json"))
    ref = {"meta": {"seed": seed, "min_gaps": all_gaps, "cached_decode_max_err": cached_err,
                    "weights": "transformers on the dequantized FP4/FP8/BF16 weights",
                    "transformers": __import__("transformers").__version__,
                    "torch": torch.__version__}}
    for name, (case, logits) in cases.items():
        fname = f"logits_{name}.f32"
        logits.tofile(out / fname)
        case["logits_file"] = fname
        ref[name] = case
    (out / "ref.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{DIR}: seed {seed}, vocab {vocab}, {n} tensors, gaps {all_gaps}, "
          f"cached err {cached_err:.2e}")


if __name__ == "__main__":
    main()
