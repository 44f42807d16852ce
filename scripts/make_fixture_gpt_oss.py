#!/usr/bin/env python3
"""Tiny random oracle fixtures of the gpt_oss family (OpenAI gpt-oss-20b / gpt-oss-120b layout),
made by transformers, on the contract of scripts/make_family_fixtures.py: a random model in
float32 with eager attention is the ground truth, seeds whose margins (top-1/top-2 logit gap at
every position, the router's top-k boundary on every layer and token) fall below MIN_GAP are
skipped, and each fixture directory holds config.json, model.safetensors, tokenizer.json,
ref.json and the teacher-forced logits.

    /work/venv-fixtures/bin/python scripts/make_fixture_gpt_oss.py

Fixtures:
  tests/fixtures/tiny-gpt-oss        f32, the published (fused, gate/up interleaved) layout;
                                     sliding_window 8 on the even layers, YaRN over an original
                                     context of 64, so the long case (48 + 24 positions) runs
                                     past both.
  tests/fixtures/tiny-gpt-oss-split  the same weights with the experts split per expert as the
                                     engine reads them (`mlp.experts.{e}.{gate,up,down}_proj.
                                     {weight,bias}`, [out, in]), gate and up de-interleaved here
                                     in torch: what `colibri convert` must write, bit for bit, from
                                     the fused layout (no reference of its own: tiny-gpt-oss's).
  tests/fixtures/tiny-gpt-oss-mxfp4  the same model with its experts stored as gpt-oss ships
                                     them: `*_blocks` (e2m1 nibbles, two a byte, low first) and
                                     `*_scales` (e8m0, one per 32 inputs), quantized here by
                                     round-to-nearest on the e2m1 grid; the reference is
                                     transformers' run of the dequantized weights.
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.models.gpt_oss import modeling_gpt_oss as mgo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import LONG_TEXT, MIN_GAP, ROOT, greedy, make_tokenizer, redraw  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
            "<|constrain|>", "<|return|>", "<|call|>"]
EOS = ("<|return|>", "<|call|>")

# e2m1's values by code (bit 3 the sign), as transformers' integrations/mxfp4.py FP4_VALUES.
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def harmony(text):
    return f"<|start|>user<|message|>{text}<|end|><|start|>assistant"


class RouterProbe:
    """The smallest gap between the k-th and (k+1)-th router logit, over every layer and
    token (GptOssTopKRouter picks by logit)."""

    def __init__(self, model):
        self.gaps = []
        self.handles = [m.register_forward_hook(self._hook) for m in model.modules()
                        if isinstance(m, mgo.GptOssTopKRouter)]

    def _hook(self, module, inputs, output):
        logits = output[0].float()
        k = module.top_k
        srt = logits.sort(dim=-1, descending=True).values
        self.gaps.append(float((srt[:, k - 1] - srt[:, k]).min()))

    def close(self):
        for h in self.handles:
            h.remove()


def run_case(model, prompt_ids, n_new):
    full = greedy(model, prompt_ids, n_new)
    probe = RouterProbe(model)
    try:
        with torch.no_grad():
            logits = model(torch.tensor([full]), use_cache=False).logits[0]
    finally:
        probe.close()
    srt = logits.sort(dim=-1, descending=True)
    case = {
        "prompt_ids": list(prompt_ids),
        "full_ids": full,
        "tf_pred": [int(x) for x in logits.argmax(-1)],
        "top5": [[[int(srt.indices[p, j]), round(float(srt.values[p, j]), 6)] for j in range(5)]
                 for p in range(len(full))],
    }
    gaps = {"logit": float((srt.values[:, 0] - srt.values[:, 1]).min()),
            "router": min(probe.gaps)}
    return case, logits.numpy().astype("<f4"), gaps


def mxfp4_quantize(w):
    """`w` [..., rows, cols] (cols a multiple of 32) to gpt-oss's blocks [..., rows, cols/32,
    16] (u8) and scales [..., rows, cols/32] (u8, e8m0): each group's scale is the power of two
    that brings its largest magnitude to at most 6 (e2m1's largest), each value the nearest
    e2m1 value of w / scale (ties to the even code)."""
    *lead, rows, cols = w.shape
    g = w.reshape(*lead, rows, cols // 32, 32)
    amax = g.abs().amax(-1).clamp(min=2.0 ** -126)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    q = g / torch.pow(2.0, exp).unsqueeze(-1)
    grid = torch.tensor(FP4[:8])
    dist = (q.abs().unsqueeze(-1) - grid).abs()
    # Nearest magnitude; on a tie the lower code, whose mantissa bit is even for the ties
    # e2m1 has (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5).
    code = dist.argmin(-1)
    code = code | ((q < 0) & (code > 0)).to(code.dtype) * 8
    code = code.to(torch.uint8).reshape(*lead, rows, cols // 32, 16, 2)
    blocks = code[..., 0] | (code[..., 1] << 4)
    scales = (exp + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def mxfp4_dequantize(blocks, scales):
    """transformers' dequantization (integrations/mxfp4.py `_convert_moe_packed_tensors`),
    without the final transpose: [..., rows, cols]."""
    lut = torch.tensor(FP4)
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], -1).flatten(-2)  # [..., rows, G, 32]
    vals = torch.ldexp(vals, (scales.to(torch.int32) - 127).unsqueeze(-1))
    return vals.flatten(-2)


SPEC = dict(vocab=320, seed=1, short_new=10, long_prompt=48, long_new=24,
            stds={"default": 0.05, "q_proj": 0.1, "k_proj": 0.1, "router.weight": 0.5,
                  "experts": 0.05},
            config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-5,
                        sliding_window=8, max_position_embeddings=256,
                        layer_types=["sliding_attention", "full_attention"] * 2,
                        swiglu_limit=7.0, attention_bias=True, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                         "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                         "truncate": False,
                                         "original_max_position_embeddings": 64}))


def draw_sinks(model, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, mgo.GptOssAttention):
                m.sinks.copy_(torch.randn(m.sinks.shape, generator=g))


def mxfp4_experts(model):
    """Replaces every expert matrix by its MXFP4 round trip; returns the blocks and scales per
    tensor name, in the published orientation ([E, out, in/32, 16])."""
    packed = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                w = p.transpose(1, 2).contiguous()  # [E, out, in]
                blocks, scales = mxfp4_quantize(w)
                p.copy_(mxfp4_dequantize(blocks, scales).transpose(1, 2))
                packed[name] = (blocks, scales)
    return packed


def write_split(src, out):
    """`src`'s fused experts split per expert, into `out` (config and tokenizer copied)."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(src / "model.safetensors")
    split = {}
    for name, t in tensors.items():
        prefix, _, fused = name.rpartition(".mlp.experts.")
        if not prefix:
            split[name] = t
            continue
        for e in range(t.shape[0]):
            base = f"{prefix}.mlp.experts.{e}"
            if fused == "gate_up_proj":
                split[f"{base}.gate_proj.weight"] = t[e][:, 0::2].T.contiguous()
                split[f"{base}.up_proj.weight"] = t[e][:, 1::2].T.contiguous()
            elif fused == "gate_up_proj_bias":
                split[f"{base}.gate_proj.bias"] = t[e][0::2].contiguous()
                split[f"{base}.up_proj.bias"] = t[e][1::2].contiguous()
            elif fused == "down_proj":
                split[f"{base}.down_proj.weight"] = t[e].T.contiguous()
            elif fused == "down_proj_bias":
                split[f"{base}.down_proj.bias"] = t[e].clone()
            else:
                raise SystemExit(f"unknown fused tensor {name}")
    save_file(split, out / "model.safetensors", metadata={"format": "pt"})
    if src != out:
        for f in ["config.json", "tokenizer.json"]:
            (out / f).write_bytes((src / f).read_bytes())
        print(f"{out}: {len(split)} tensors")


def build(out, mx):
    spec = SPEC
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(spec["vocab"], SPECIALS)
    vocab = tok.get_vocab_size()
    eos = [tok.token_to_id(s) for s in EOS]
    cfg_kwargs = dict(spec["config"], vocab_size=vocab, eos_token_id=eos, bos_token_id=None,
                      pad_token_id=None)
    short_ids = tok.encode(harmony("Hello! How are you today?")).ids
    long_ids = tok.encode(harmony(LONG_TEXT)).ids[: spec["long_prompt"]]
    assert len(long_ids) == spec["long_prompt"], len(long_ids)
    for seed in range(spec["seed"], spec["seed"] + 400):
        torch.manual_seed(seed)
        config = GptOssConfig(**cfg_kwargs)
        config._attn_implementation = "eager"
        model = GptOssForCausalLM(config).float().eval()
        redraw(model, seed, spec["stds"])
        draw_sinks(model, seed)
        packed = mxfp4_experts(model) if mx else None
        cases, all_gaps, ok = {}, {}, True
        for name, pids, n_new in [("short", short_ids, spec["short_new"]),
                                  ("long", long_ids, spec["long_new"])]:
            case, logits, gaps = run_case(model, pids, n_new)
            cases[name] = (case, logits)
            all_gaps[name] = gaps
            if any(g < MIN_GAP for g in gaps.values()):
                ok = False
                break
        if ok:
            break
        print(f"{out}: seed {seed} rejected ({all_gaps})", file=sys.stderr)
    else:
        raise SystemExit(f"{out}: no seed with margins >= {MIN_GAP}")
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert p.abs().min() > 0, f"{out}: {name} has a zero"
    for f in out.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    if mx:
        # The experts as gpt-oss publishes them: blocks and scales in place of the floats,
        # and the config's quantization_config saying so.
        path = out / "model.safetensors"
        tensors = load_file(path)
        for name, (blocks, scales) in packed.items():
            del tensors[name]
            tensors[f"{name}_blocks"] = blocks
            tensors[f"{name}_scales"] = scales
        save_file(tensors, path, metadata={"format": "pt"})
        cfg = json.loads((out / "config.json").read_text())
        cfg["quantization_config"] = {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4"}
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    ref = {"meta": {"seed": seed, "min_gaps": all_gaps,
                    "transformers": __import__("transformers").__version__,
                    "torch": torch.__version__}}
    for name, (case, logits) in cases.items():
        fname = f"logits_{name}.f32"
        logits.tofile(out / fname)
        case["logits_file"] = fname
        ref[name] = case
    (out / "ref.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{out}: seed {seed}, vocab {vocab}, gaps {all_gaps}")


if __name__ == "__main__":
    only = sys.argv[1:]
    for d, mx in [("tests/fixtures/tiny-gpt-oss", False),
                  ("tests/fixtures/tiny-gpt-oss-mxfp4", True)]:
        if not only or any(o in d for o in only):
            build(ROOT / d, mx)
            if not mx:
                write_split(ROOT / d, ROOT / "tests/fixtures/tiny-gpt-oss-split")
