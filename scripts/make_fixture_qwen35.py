#!/usr/bin/env python3
"""Tiny random oracle fixture of `qwen3_5_moe` (Qwen3.5-397B-A17B, Qwen3.6-35B-A3B), made by
transformers' Qwen3_5MoeForCausalLM.

Same contract as scripts/make_family_fixtures.py: a random float32 model with eager attention
is the ground truth; a seed whose margins (top-1/top-2 logit gap at every position, the
router's top-k boundary on every layer and token) fall below MIN_GAP is skipped; the fixture
directory holds config.json, model.safetensors, tokenizer.json, ref.json and the
teacher-forced logits.

transformers runs every forward here without a cache (use_cache=False), so the whole
sequence goes through the CHUNKED gated delta rule (chunks of 64 positions); colibri runs
the recurrent form one position at a time. The long case's prompt is longer than a chunk, so
the chunked form crosses a chunk boundary and both forms must agree past it.

    /work/venv-fixtures/bin/python scripts/make_fixture_qwen35.py
"""
import json
import sys
from pathlib import Path

import torch
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as mq35

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import LONG_TEXT, MIN_GAP, ROOT, greedy, make_tokenizer  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def chatml(text):
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def redraw(model, seed, stds):
    """Every parameter redrawn: matrices N(0, std of their group); the zero-centred RMSNorm
    weights N(0, 0.1) (transformers multiplies by 1 + w), the DeltaNet's gated norm
    1 + N(0, 0.1), dt_bias N(0, 0.5), A_log log(U(0.5, 4)), biases N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = stds["default"]
                for key, s in stds.items():
                    if key != "default" and key in name:
                        std = s
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("A_log"):
                p.copy_(torch.log(0.5 + 3.5 * torch.rand(p.shape, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


class RouterProbe:
    """The smallest gap at the softmax router's top-k boundary, over every layer and token."""

    def __init__(self, model):
        self.gaps = []
        self.handles = [m.register_forward_hook(self._hook) for m in model.modules()
                        if isinstance(m, mq35.Qwen3_5MoeTopKRouter)]

    def _hook(self, module, inputs, output):
        probs = torch.softmax(output[0].float(), dim=-1)
        srt = probs.sort(dim=-1, descending=True).values
        k = module.top_k
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
        "sparse_rows": 0,
    }
    gaps = {"logit": float((srt.values[:, 0] - srt.values[:, 1]).min()),
            "router": min(probe.gaps)}
    return case, logits.numpy().astype("<f4"), gaps


# Both layer kinds, grouped values in the DeltaNet (4 value heads over 2 query/key heads, key
# and value heads of different widths), grouped-query attention (4 query heads over 2
# key-value heads) with a quarter of each head rotated, a shared expert wider than a routed
# one. Three layers (linear, full, linear) and six experts: every layer is a MoE one, and
# each more layer or expert makes a seed whose router margins all clear MIN_GAP rarer.
SPEC = dict(dir="tests/fixtures/tiny-qwen35-moe", vocab=384, seed=1, short_new=12,
            long_prompt=72, long_new=12,
            stds={"default": 0.05, "mlp.gate.weight": 0.3, "conv1d": 0.3},
            config=dict(hidden_size=64, num_hidden_layers=3,
                        layer_types=["linear_attention", "full_attention", "linear_attention"],
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        linear_conv_kernel_dim=4, linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_key_head_dim=16,
                        linear_value_head_dim=8, moe_intermediate_size=32,
                        shared_expert_intermediate_size=48, num_experts=6, num_experts_per_tok=2,
                        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                         "partial_rotary_factor": 0.25,
                                         "mrope_section": [1, 1, 0],
                                         "mrope_interleaved": True}))


def build(spec):
    out = ROOT / spec["dir"]
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(spec["vocab"], SPECIALS)
    vocab = tok.get_vocab_size()
    eos = [tok.token_to_id(s) for s in ("<|im_end|>", "<|endoftext|>")]
    cfg_kwargs = dict(spec["config"])
    cfg_kwargs.update(vocab_size=vocab, eos_token_id=eos, bos_token_id=None, pad_token_id=None,
                      max_position_embeddings=4096)
    short_ids = tok.encode(chatml("Hello! How are you today?")).ids
    long_ids = tok.encode(chatml(LONG_TEXT)).ids[: spec["long_prompt"]]
    assert len(long_ids) == spec["long_prompt"], len(long_ids)

    for seed in range(spec["seed"], spec["seed"] + 400):
        torch.manual_seed(seed)
        config = Qwen3_5MoeTextConfig(**cfg_kwargs)
        config._attn_implementation = "eager"
        model = Qwen3_5MoeForCausalLM(config).float().eval()
        redraw(model, seed, spec["stds"])
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
        print(f"{spec['dir']}: seed {seed} rejected ({all_gaps})", file=sys.stderr)
    else:
        raise SystemExit(f"{spec['dir']}: no seed with margins >= {MIN_GAP}")

    for f in out.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
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
    print(f"{spec['dir']}: seed {seed}, vocab {vocab}, gaps {all_gaps}")


if __name__ == "__main__":
    build(SPEC)
