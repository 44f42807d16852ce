#!/usr/bin/env python3
"""Tiny random oracle fixtures of the other model families, made by transformers.

Same contract as scripts/make_fixtures.py (GLM-5): a random model in float32 with eager
attention is the ground truth, the seeds whose margins (top-1/top-2 logit gap at every
position, the router's top-k boundary on every MoE layer and token) fall below MIN_GAP are
skipped, and each fixture directory holds config.json, *.safetensors, tokenizer.json,
ref.json and the teacher-forced logits.

    ../venv/bin/python scripts/make_family_fixtures.py            # every family
    ../venv/bin/python scripts/make_family_fixtures.py qwen3      # the specs whose dir matches

Families so far: qwen3_moe (Qwen3-30B-A3B / 235B-A22B / Coder-480B layout).
"""
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, AddedToken
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe import modeling_qwen3_moe as mq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import CORPUS, LONG_TEXT, MIN_GAP, ROOT, greedy  # noqa: E402

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def chatml(text):
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def make_tokenizer(vocab_size, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def redraw(model, seed, stds):
    """Matrices N(0, std of their group), norm weights 1 + N(0, 0.1), biases N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = stds["default"]
                for key, s in stds.items():
                    if key != "default" and key in name:
                        std = s
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)


class RouterProbe:
    """The smallest gap at the router's top-k boundary, over every MoE layer and token."""

    def __init__(self, model):
        self.gaps = []
        self.handles = [m.register_forward_hook(self._hook) for m in model.modules()
                        if isinstance(m, mq.Qwen3MoeTopKRouter)]

    def _hook(self, module, inputs, output):
        probs = torch.softmax(output[0].float(), dim=-1)
        srt = probs.sort(dim=-1, descending=True).values
        k = module.top_k
        if srt.shape[-1] > k:
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
            "router": min(probe.gaps) if probe.gaps else None}
    return case, logits.numpy().astype("<f4"), gaps


def build(spec):
    out = ROOT / spec["dir"]
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(spec["vocab"], QWEN_SPECIALS)
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
        config = Qwen3MoeConfig(**cfg_kwargs)
        config._attn_implementation = "eager"
        model = Qwen3MoeForCausalLM(config).float().eval()
        redraw(model, seed, spec["stds"])
        if config.tie_word_embeddings:
            model.tie_weights()
        cases, all_gaps, ok = {}, {}, True
        for name, pids, n_new in [("short", short_ids, spec["short_new"]),
                                  ("long", long_ids, spec["long_new"])]:
            case, logits, gaps = run_case(model, pids, n_new)
            cases[name] = (case, logits)
            all_gaps[name] = gaps
            if any(g is not None and g < MIN_GAP for g in gaps.values()):
                ok = False
                break
        if ok:
            break
        print(f"{spec['dir']}: seed {seed} rejected ({all_gaps})", file=sys.stderr)
    else:
        raise SystemExit(f"{spec['dir']}: no seed with margins >= {MIN_GAP}")

    for f in out.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(out, safe_serialization=True, max_shard_size=spec.get("shard", "50GB"))
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


SPECS = [
    # Qwen3-MoE: GQA (4 query heads over 2 key-value heads) with per-head q/k RMSNorm, a large
    # rope_theta, layer 0 dense through mlp_only_layers, softmax router with top-k
    # renormalisation, no shared expert.
    dict(dir="tests/fixtures/tiny-qwen3-moe", vocab=512, seed=1, short_new=12,
         long_prompt=64, long_new=16,
         stds={"default": 0.05, "mlp.gate.weight": 0.5},
         config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[0], rms_norm_eps=1e-6,
                     rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False)),
    # The other settings: every second layer sparse (decoder_sparse_step 2), no top-k
    # renormalisation, tied embeddings, head_dim wider than hidden / heads, several shards.
    dict(dir="tests/fixtures/tiny-qwen3-moe-step", vocab=400, seed=100, short_new=10,
         long_prompt=40, long_new=12, shard="200KB",
         stds={"default": 0.05, "mlp.gate.weight": 0.5},
         config=dict(hidden_size=48, intermediate_size=96, moe_intermediate_size=24,
                     num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=3,
                     head_dim=24, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
                     decoder_sparse_step=2, mlp_only_layers=[], rms_norm_eps=1e-6,
                     rope_theta=5000000.0, tie_word_embeddings=True, attention_bias=False)),
]

if __name__ == "__main__":
    only = sys.argv[1:]
    for spec in SPECS:
        if not only or any(o in spec["dir"] for o in only):
            build(spec)
