#!/usr/bin/env python3
"""Generate the tiny random glm_moe_dsa oracle fixtures with transformers.

The bundled demo model is trained instead: scripts/demo/ (train.py, export.py, make_fixture.py).

Needs a virtual environment *outside* the repository (see README "Regenerating fixtures"):

    python3 -m venv ../venv
    ../venv/bin/pip install torch==2.15.0 transformers==5.24.0 safetensors tokenizers numpy
    ../venv/bin/python scripts/make_fixtures.py            # writes tests/fixtures/tiny-*

Every model is a random `GlmMoeDsaForCausalLM` in float32 with eager attention, which is the
ground truth the engine must match token for token (shared/reference/glm_moe_dsa-forward.md).
Weights are re-drawn, then the margins that make the oracle well defined are checked: the
top-1/top-2 logit gap at every position, the router's top-k boundary gap on every MoE layer and
token, and the DSA indexer's top-k boundary gap on every row that really is sparse. A seed that
leaves any of them below MIN_GAP is skipped, never patched.

Each fixture directory holds config.json, *.safetensors, tokenizer.json and ref.json:

    {"meta": {...margins, seed...},
     "<case>": {"prompt_ids": [...], "full_ids": [...], "tf_pred": [...],
                "top5": [[[id, logit] x5] per position], "index_topk": N,
                "logits_file": "logits_<case>.f32"}}

`logits_<case>.f32` holds the teacher-forced logits over full_ids, little-endian f32,
len(full_ids) x vocab, row-major.
"""
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, AddedToken
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mg

ROOT = Path(__file__).resolve().parent.parent
MIN_GAP = 1e-4

SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
            "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>"]

CORPUS = """\
The hummingbird is the smallest of birds, and the colibri of the old naturalists. It hovers in
front of a flower, wings beating faster than the eye can follow, and drinks the nectar with a long
tongue. A hummingbird can fly backwards, sideways and upside down. Its heart beats more than a
thousand times a minute when it is busy, and at night it falls into a torpor to save its energy.
Mixture-of-experts models route every token to a few experts out of many. The router scores each
expert, keeps the best eight, and the rest of the network never runs for that token. A model ten
times larger than memory can still answer, if the experts it needs are read from the disk in time.
The cache keeps the experts that were used recently; the hot store keeps the ones used most often.
Attention compresses the keys and values of every past token into a small latent vector, and a
lightning indexer chooses which past tokens deserve attention at all. Questions and answers:
What is the capital of France? Paris is the capital of France. How many legs does a spider have?
A spider has eight legs. What is two plus two? Two plus two is four. Write a short poem about the
sea. The sea is wide, the sea is deep, it sings the sailors into sleep. Hello! How are you today?
I am fine, thank you. Ciao, come stai? Bene, grazie. Ça va très bien, merci. 你好，世界。 Über
alles, naïve café, jalapeño, smörgåsbord. Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2026 3.14159.
def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)
for i in range(10): print(i, fib(i))
"""

SHORT_PROMPT = "[gMASK]<sop><|user|>Hello! How are you today?<|assistant|><think></think>"
LONG_TEXT = ("The router scores each expert and keeps the best eight. The cache keeps the experts "
             "that were used recently, the hot store keeps the ones used most often, and the "
             "lightning indexer chooses which past tokens deserve attention at all. A hummingbird "
             "hovers in front of a flower, wings beating faster than the eye can follow, and drinks "
             "the nectar with a long tongue. What is the capital of France? Paris is the capital of "
             "France. How many legs does a spider have? A spider has eight legs.")


def make_tokenizer(vocab_size, specials=SPECIALS):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def redraw(model, seed, stds):
    """Re-draw every parameter: matrices N(0, std of their group), norms 1 + N(0, 0.1)."""
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
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * stds.get("router_bias", 0.05))


class Probe:
    """Records the router and indexer top-k boundary gaps during a forward."""

    def __init__(self, model):
        self.router_gaps = []
        self.index_gaps = []
        self.handles = []
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if isinstance(gate, mg.GlmMoeDsaTopkRouter):
                self.handles.append(gate.register_forward_hook(self._router_hook))
        self._orig = mg.GlmMoeDsaIndexer.forward
        probe = self

        def indexer_forward(self_, hidden_states, q_resid, position_embeddings, attention_mask,
                            position_ids, cache=None):
            out = probe._orig(self_, hidden_states, q_resid, position_embeddings, attention_mask,
                              position_ids, cache=cache)
            probe._index_hook(self_, hidden_states, q_resid, position_embeddings, attention_mask)
            return out

        mg.GlmMoeDsaIndexer.forward = indexer_forward

    def close(self):
        mg.GlmMoeDsaIndexer.forward = self._orig
        for h in self.handles:
            h.remove()

    def _router_hook(self, module, inputs, output):
        logits = output[0]
        choice = logits.sigmoid() + module.e_score_correction_bias
        srt = choice.sort(dim=-1, descending=True).values
        k = module.top_k
        if srt.shape[-1] > k:
            self.router_gaps.append(float((srt[:, k - 1] - srt[:, k]).min()))

    def _index_hook(self, ix, hidden_states, q_resid, position_embeddings, attention_mask):
        # Same arithmetic as GlmMoeDsaIndexer.forward (no cache), keeping the scores.
        b, s, _ = hidden_states.shape
        cos, sin = position_embeddings
        q = ix.wq_b(q_resid).view(b, s, ix.n_heads, ix.head_dim)
        q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], -1)
        k = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], -1)
        q_rot, k_rot = mg.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], -1)
        k = torch.cat([k_rot, k_pass], -1).squeeze(2)
        scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
        w = ix.weights_proj(hidden_states).float() * ix.n_heads ** -0.5
        idx = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)[0]  # [S, T]
        kk = ix.index_topk
        for row in range(s):
            if row + 1 > kk:
                srt = idx[row, : row + 1].sort(descending=True).values
                self.index_gaps.append(float(srt[kk - 1] - srt[kk]))


def greedy(model, prompt_ids, n_new):
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n_new):
            out = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
            ids.append(int(out.argmax()))
    return ids


def run_case(model, prompt_ids, n_new, index_topk):
    for layer in model.model.layers:
        ix = layer.self_attn.indexer
        if ix is not None:
            ix.index_topk = index_topk
    model.config.index_topk = index_topk
    full = greedy(model, prompt_ids, n_new)
    probe = Probe(model)
    try:
        with torch.no_grad():
            logits = model(torch.tensor([full]), use_cache=False).logits[0]
    finally:
        probe.close()
    srt = logits.sort(dim=-1, descending=True)
    logit_gap = float((srt.values[:, 0] - srt.values[:, 1]).min())
    case = {
        "prompt_ids": list(prompt_ids),
        "full_ids": full,
        "tf_pred": [int(x) for x in logits.argmax(-1)],
        "top5": [[[int(srt.indices[p, j]), round(float(srt.values[p, j]), 6)] for j in range(5)]
                 for p in range(len(full))],
        "index_topk": index_topk,
    }
    gaps = {"logit": logit_gap,
            "router": min(probe.router_gaps) if probe.router_gaps else None,
            "indexer": min(probe.index_gaps) if probe.index_gaps else None,
            "sparse_rows": len(probe.index_gaps)}
    return case, logits.numpy().astype("<f4"), gaps


def build(spec):
    out = ROOT / spec["dir"]
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(spec["vocab"])
    vocab = tok.get_vocab_size()
    eos = [tok.token_to_id(s) for s in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    cfg_kwargs = dict(spec["config"])
    cfg_kwargs.update(vocab_size=vocab, eos_token_id=eos, bos_token_id=None, pad_token_id=None,
                      tie_word_embeddings=False, max_position_embeddings=4096)
    short_ids = tok.encode(SHORT_PROMPT).ids
    long_ids = tok.encode("[gMASK]<sop><|user|>" + LONG_TEXT + "<|assistant|><think></think>").ids
    long_ids = long_ids[: spec["long_prompt"]]
    assert len(long_ids) == spec["long_prompt"], len(long_ids)
    topk = cfg_kwargs["index_topk"]

    for seed in range(spec["seed"], spec["seed"] + 400):
        torch.manual_seed(seed)
        config = GlmMoeDsaConfig(**cfg_kwargs)
        config._attn_implementation = "eager"
        model = GlmMoeDsaForCausalLM(config).float().eval()
        redraw(model, seed, spec["stds"])
        if spec.get("dtype") == "bf16":
            # Round to bf16 first so the f32 reference is exact for the weights stored on disk.
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
        cases, all_gaps, ok = {}, {}, True
        plan = [("short", short_ids, spec["short_new"], topk)]
        if spec.get("long_new"):
            plan += [("long", long_ids, spec["long_new"], topk),
                     ("long_dense", long_ids, spec["long_new"], 4096)]
        for name, pids, n_new, k in plan:
            case, logits, gaps = run_case(model, pids, n_new, k)
            cases[name] = (case, logits)
            all_gaps[name] = gaps
            for key in ("logit", "router", "indexer"):
                if gaps[key] is not None and gaps[key] < MIN_GAP:
                    ok = False
            if not ok:
                break
        if ok:
            break
        print(f"{spec['dir']}: seed {seed} rejected ({all_gaps})", file=sys.stderr)
    else:
        raise SystemExit(f"{spec['dir']}: no seed with margins >= {MIN_GAP}")
    if spec.get("long_new"):
        assert all_gaps["long"]["sparse_rows"] > 0, "long case never ran the sparse path"

    # restore the config's own index_topk before saving
    for layer in model.model.layers:
        if layer.self_attn.indexer is not None:
            layer.self_attn.indexer.index_topk = topk
    model.config.index_topk = topk
    for f in out.glob("*.safetensors"):
        f.unlink()
    if spec.get("dtype") == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=spec.get("shard", "50GB"))
    for extra in ("generation_config.json",):
        (out / extra).unlink(missing_ok=True)
    tok.save(str(out / "tokenizer.json"))
    ref = {"meta": {"seed": seed, "min_gaps": all_gaps, "transformers": __import__("transformers").__version__,
                    "torch": torch.__version__}}
    for name, (case, logits) in cases.items():
        fname = f"logits_{name}.f32"
        if spec.get("write_logits", True):
            logits.tofile(out / fname)
            case["logits_file"] = fname
        ref[name] = case
    (out / "ref.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{spec['dir']}: seed {seed}, vocab {vocab}, gaps {all_gaps}")


SPECS = [
    # Dense first layer, shared-indexer layers, long prompt 4x index_topk.
    dict(dir="tests/fixtures/tiny-dense-shared", vocab=512, seed=1, short_new=12,
         long_prompt=64, long_new=16,
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1,
               "indexer.wq_b": 0.3, "indexer.wk": 0.3, "indexer.weights_proj": 0.5},
         config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                     indexer_types=["full", "shared", "full", "shared"],
                     num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                     num_experts_per_tok=2, n_shared_experts=1, q_lora_rank=32, kv_lora_rank=32,
                     qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, index_topk=16,
                     index_head_dim=16, index_n_heads=32, routed_scaling_factor=2.5,
                     norm_topk_prob=True, rms_norm_eps=1e-5, rope_theta=10000.0)),
    # All-MoE, all-full indexer, attention bias, two shared experts, no top-k normalisation,
    # written in several shards.
    dict(dir="tests/fixtures/tiny-moe-bias", vocab=400, seed=100, short_new=10,
         long_prompt=40, long_new=12, shard="300KB",
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1,
               "indexer.wq_b": 0.3, "indexer.wk": 0.3, "indexer.weights_proj": 0.5},
         config=dict(hidden_size=48, intermediate_size=96, moe_intermediate_size=24,
                     num_hidden_layers=3, first_k_dense_replace=0,
                     num_attention_heads=3, num_key_value_heads=3, n_routed_experts=8,
                     num_experts_per_tok=3, n_shared_experts=2, q_lora_rank=24, kv_lora_rank=16,
                     qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=12, index_topk=8,
                     index_head_dim=24, index_n_heads=32, routed_scaling_factor=1.5,
                     norm_topk_prob=False, rms_norm_eps=1e-6, rope_theta=5000.0,
                     attention_bias=True)),
]

if __name__ == "__main__":
    only = sys.argv[1:]
    for spec in SPECS:
        if not only or any(o in spec["dir"] for o in only):
            build(spec)
