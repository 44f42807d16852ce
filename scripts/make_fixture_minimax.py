#!/usr/bin/env python3
"""Tiny random oracle fixtures of the minimax_m2 family (MiniMax-M2 / M2.1 / M2.5 / M2.7),
made by transformers' MiniMaxM2ForCausalLM, and its FP8 copy as MiniMax ships it.

    /work/venv-fixtures/bin/python scripts/make_fixture_minimax.py

Same contract as scripts/make_family_fixtures.py (whose build() this reuses): a random model
in float32 with eager attention is the ground truth, seeds whose margins (top-1/top-2 logit
gap at every position, the router's top-k boundary on every layer and token) fall below
MIN_GAP are skipped, and each directory holds config.json, model.safetensors, tokenizer.json,
ref.json and the teacher-forced logits.

* tests/fixtures/tiny-minimax-m2/   4 query heads over 2 key-value heads, q/k RMSNorm over the
    whole projection, rotary on half of each head (the published `rotary_dim` 64 of 128, written
    as `rotary_dim` beside transformers 5's `rope_parameters.partial_rotary_factor`), sigmoid
    router with correction bias, 8 experts of which 2 per token, every layer sparse. The
    weights are saved as transformers saves this family: Mixtral's layout
    (`block_sparse_moe.experts.{e}.w1/w2/w3`), which is MiniMax's own.
* tests/fixtures/tiny-minimax-m2-gqa/  4 query heads per key-value head, a quarter of each head
    rotated (given as `rope_parameters.partial_rotary_factor` alone), 3 experts of 16 per
    token, tied embeddings, several shards.
* tests/fixtures/hf-fp8-minimax-m2/  tiny-minimax-m2 as MiniMaxAI/MiniMax-M2 ships it: every
    projection (attention and experts) F8_E4M3 with `weight_scale_inv` per 128x128 block, the
    router (`block_sparse_moe.gate`) and the correction bias F32, embeddings, norms and
    lm_head BF16, and the published `quantization_config`.
"""
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM
from transformers.models.minimax_m2 import modeling_minimax_m2 as mm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_family_fixtures as mff  # noqa: E402
from make_hf_fixtures import BLOCK, fp8_blocks  # noqa: E402
from make_fixtures import ROOT  # noqa: E402

SPECIALS = ["]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>",
            "</minimax:tool_call>"]


def minimax_chat(text):
    return (f"]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\n{text}[e~[\n"
            f"]~b]ai\n<think>\n")


class MiniMaxProbe(mff.RouterProbe):
    """make_family_fixtures' probe, plus the smallest gap at MiniMax-M2's top-k boundary
    (sigmoid + correction bias) over every layer and token: MiniMaxM2TopKRouter takes the bias
    as its second argument, where the other families' routers hold it."""

    def __init__(self, model, tie_rule=None):
        super().__init__(model, tie_rule)
        self.handles += [m.register_forward_hook(self._minimax_hook) for m in model.modules()
                         if isinstance(m, mm.MiniMaxM2TopKRouter)]

    def _minimax_hook(self, module, inputs, output):
        choice = output[0].float().sigmoid() + inputs[1]
        k = module.top_k
        srt = choice.sort(dim=-1, descending=True).values
        if srt.shape[-1] > k:
            self.gaps.append(float((srt[:, k - 1] - srt[:, k]).min()))


# Importing this module (scripts/sweep_families.py does) adds the family to the fixture
# machinery: its probe sees every family's routers.
mff.RouterProbe = MiniMaxProbe
mff.FAMILIES["minimax_m2"] = dict(config=MiniMaxM2Config, model=MiniMaxM2ForCausalLM,
                                  specials=SPECIALS, chat=minimax_chat, eos=("[e~[",))

SPECS = [
    dict(dir="tests/fixtures/tiny-minimax-m2", family="minimax_m2", vocab=512, seed=1,
         short_new=12, long_prompt=64, long_new=16, rotary_dim=8,
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1},
         config=dict(hidden_size=64, intermediate_size=32, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-6,
                     tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                      "partial_rotary_factor": 0.5})),
    dict(dir="tests/fixtures/tiny-minimax-m2-gqa", family="minimax_m2", vocab=400, seed=100,
         short_new=10, long_prompt=40, long_new=12, shard="200KB",
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1},
         config=dict(hidden_size=48, intermediate_size=24, num_hidden_layers=3,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                     num_local_experts=16, num_experts_per_tok=3, rms_norm_eps=1e-5,
                     tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                      "partial_rotary_factor": 0.25})),
]


def add_rotary_dim(out, rotary_dim):
    """Writes `rotary_dim` beside the saved `rope_parameters`, as the published configs carry
    it; transformers must read the file back to the same rotary parameters."""
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    before = MiniMaxM2Config.from_pretrained(out).rope_parameters
    cfg["rotary_dim"] = rotary_dim
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    after = MiniMaxM2Config.from_pretrained(out).rope_parameters
    assert after == before, (after, before)


def write_fp8(src, dst):
    """`src` re-stored as MiniMax ships MiniMax-M2 (see the module's note)."""
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    out = {}
    for name, t in tensors.items():
        linear = t.dim() == 2 and name.endswith(".weight") and (
            ".self_attn." in name or ".experts." in name)
        if linear:
            codes, scale = fp8_blocks(t)
            out[name] = codes
            out[name + "_scale_inv"] = scale
        elif name.endswith("e_score_correction_bias") or name.endswith("block_sparse_moe.gate.weight"):
            out[name] = t.float().contiguous()
        else:
            out[name] = t.to(torch.bfloat16).contiguous()
    assert any(n.endswith("experts.0.w1.weight_scale_inv") for n in out), sorted(out)[:8]
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn",
                                  "quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK],
                                  "modules_to_not_convert": ["gate", "e_score_correction_bias",
                                                             "lm_head"]}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    print(f"{dst.relative_to(ROOT)}: {len(out)} tensors")


def main():
    only = sys.argv[1:]
    for spec in SPECS:
        if only and not any(o in spec["dir"] for o in only):
            continue
        mff.build(spec)
        out = ROOT / spec["dir"]
        if "rotary_dim" in spec:
            add_rotary_dim(out, spec["rotary_dim"])
    if not only or any(o in "hf-fp8-minimax-m2" for o in only):
        write_fp8(ROOT / "tests/fixtures/tiny-minimax-m2", ROOT / "tests/fixtures/hf-fp8-minimax-m2")


if __name__ == "__main__":
    main()
