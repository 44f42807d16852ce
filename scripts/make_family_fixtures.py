#!/usr/bin/env python3
"""Tiny random oracle fixtures of the other model families, made by transformers.

Same contract as scripts/make_fixtures.py (GLM-5): a random model in float32 with eager
attention is the ground truth, the seeds whose margins (top-1/top-2 logit gap at every
position, the router's top-k boundary on every MoE layer and token) fall below MIN_GAP are
skipped, and each fixture directory holds config.json, *.safetensors, tokenizer.json,
ref.json and the teacher-forced logits.

    ../venv/bin/python scripts/make_family_fixtures.py            # every family
    ../venv/bin/python scripts/make_family_fixtures.py qwen3      # the specs whose dir matches

Families so far: qwen3_moe (Qwen3-30B-A3B / 235B-A22B / Coder-480B layout), glm4_moe
(GLM-4.5 / 4.6 / 4.7, GLM-4.5-Air), deepseek_v3 (DeepSeek-V3 / R1 / V3.1, Kimi K2) and
deepseek_v32 (DeepSeek-V3.2: the DSA indexer's top-k boundary is a margin too, except where a
spec states the rule that settles ties there, `tie_rule`).

A spec may carry `legacy_rope`: the saved config.json then spells RoPE as the checkpoints and
model cards of transformers 4 do (top-level `rope_theta` and `rope_scaling`), after checking
that transformers reads that spelling back to the very parameters the reference ran with.
"""
import json
import sys
from pathlib import Path

import torch
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, DeepseekV32Config,
                          DeepseekV32ForCausalLM, Glm4MoeConfig, Glm4MoeForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as md3
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as md32
from transformers.models.glm4_moe import modeling_glm4_moe as mg4
from transformers.models.qwen3_moe import modeling_qwen3_moe as mq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (LONG_TEXT, MIN_GAP, ROOT, SPECIALS as GLM_SPECIALS,  # noqa: E402
                           greedy, make_tokenizer, redraw)

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def chatml(text):
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


DEEPSEEK_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                     "<｜Assistant｜>", "<think>", "</think>"]


def deepseek_chat(text):
    return f"<｜begin▁of▁sentence｜><｜User｜>{text}<｜Assistant｜></think>"


def glm4_chat(text):
    return f"[gMASK]<sop><|user|>\n{text}<|assistant|>\n<think></think>"


FAMILIES = {
    "qwen3_moe": dict(config=Qwen3MoeConfig, model=Qwen3MoeForCausalLM, specials=QWEN_SPECIALS,
                      chat=chatml, eos=("<|im_end|>", "<|endoftext|>")),
    "glm4_moe": dict(config=Glm4MoeConfig, model=Glm4MoeForCausalLM, specials=GLM_SPECIALS,
                     chat=glm4_chat, eos=("<|endoftext|>", "<|user|>", "<|observation|>")),
    "deepseek_v3": dict(config=DeepseekV3Config, model=DeepseekV3ForCausalLM,
                        specials=DEEPSEEK_SPECIALS, chat=deepseek_chat,
                        eos=("<｜end▁of▁sentence｜>",)),
    "deepseek_v32": dict(config=DeepseekV32Config, model=DeepseekV32ForCausalLM,
                         specials=DEEPSEEK_SPECIALS, chat=deepseek_chat,
                         eos=("<｜end▁of▁sentence｜>",)),
}


# Index-score ties. The indexer ReLUs each head's score, so a key every head scores at or
# below zero scores exactly 0.0, and where fewer than index_topk keys score above the cut
# the cut falls among equal zeros. transformers and DeepSeek's own inference code
# (DeepSeek-V3.2-Exp inference/model.py: `index_score.topk(..., sorted=False)`) both take
# torch.topk, which promises nothing among equal values. colibri keeps the earliest keys of a
# tie; a spec with tie_rule "earliest" makes its reference with that rule (a stable
# descending sort) instead of torch.topk's pick, so its checked positions are defined.
def _indexer_forward_earliest(self_, hidden_states, q_resid, position_embeddings, attention_mask,
                              position_ids, cache=None):
    """DeepseekV32Indexer.forward (no cache) with ties at the top-k cut going to the earlier
    key."""
    assert cache is None, "the fixtures run without a cache"
    b, s, _ = hidden_states.shape
    cos, sin = position_embeddings
    q = self_.wq_b(q_resid).view(b, s, self_.n_heads, self_.head_dim)
    r = self_.qk_rope_head_dim
    q_rot, q_pass = torch.split(q, [r, self_.head_dim - r], dim=-1)
    k = self_.k_norm(self_.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [r, self_.head_dim - r], dim=-1)
    q_rot, k_rot = md32.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self_.softmax_scale
    scores = torch.relu(scores)
    weights = self_.weights_proj(hidden_states.to(self_.weights_proj.weight.dtype)).float() * (
        self_.n_heads ** -0.5)
    index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
    if attention_mask.dtype == torch.bool:
        index_scores = index_scores.masked_fill(~attention_mask, float("-inf"))
    else:
        index_scores = index_scores + attention_mask
    topk = min(self_.index_topk, index_scores.shape[-1])
    order = torch.sort(index_scores, dim=-1, descending=True, stable=True).indices
    return order[..., :topk].to(torch.int32)


class RouterProbe:
    """The smallest gap at the router's top-k boundary (and, with expert groups, at the group
    boundary), over every MoE layer and token."""

    def __init__(self, model, tie_rule=None):
        self.tie_rule = tie_rule
        self.boundary_ties = 0
        self.gaps = []
        self.handles = [m.register_forward_hook(self._hook) for m in model.modules()
                        if isinstance(m, (mq.Qwen3MoeTopKRouter, mg4.Glm4MoeTopkRouter,
                                          md3.DeepseekV3TopkRouter,
                                          md32.DeepseekV32TopkRouter))]
        self.index_gaps = []
        self.sparse_rows = 0
        self._orig = md32.DeepseekV32Indexer.forward
        probe = self

        def indexer_forward(self_, hidden_states, q_resid, position_embeddings, attention_mask,
                            position_ids, cache=None):
            forward = _indexer_forward_earliest if probe.tie_rule == "earliest" else probe._orig
            out = forward(self_, hidden_states, q_resid, position_embeddings, attention_mask,
                          position_ids, cache=cache)
            probe._index_hook(self_, hidden_states, q_resid, position_embeddings)
            return out

        md32.DeepseekV32Indexer.forward = indexer_forward

    def _index_hook(self, ix, hidden_states, q_resid, position_embeddings):
        # DeepseekV32Indexer.forward's arithmetic (no cache), keeping the scores.
        b, s, _ = hidden_states.shape
        cos, sin = position_embeddings
        q = ix.wq_b(q_resid).view(b, s, ix.n_heads, ix.head_dim)
        r = ix.qk_rope_head_dim
        q_rot, q_pass = torch.split(q, [r, ix.head_dim - r], -1)
        k = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [r, ix.head_dim - r], -1)
        q_rot, k_rot = md32.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], -1)
        k = torch.cat([k_rot, k_pass], -1).squeeze(2)
        raw = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale
        scores = torch.relu(raw)
        w = ix.weights_proj(hidden_states).float() * ix.n_heads ** -0.5
        idx = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)[0]
        kk = ix.index_topk
        for row in range(s):
            if row + 1 > kk:
                srt = idx[row, : row + 1].sort(descending=True).values
                self.sparse_rows += 1
                v = srt[kk - 1]
                if self.tie_rule is None or srt[kk] != v:
                    self.index_gaps.append(float(v - srt[kk]))
                    continue
                # A tie at the cut, settled by the stated rule: what must hold is that no
                # score near the tied value could join or leave it (the gaps to the nearest
                # other values) and that no head's score is so near zero that its ReLU could
                # go the other way in another summation order.
                self.boundary_ties += 1
                above, below = srt[srt > v], srt[srt < v]
                if len(above):
                    self.index_gaps.append(float(above.min() - v))
                if len(below):
                    self.index_gaps.append(float(v - below.max()))
                self.index_gaps.append(float(raw[0, row, :, : row + 1].abs().min()) * 10)

    def _hook(self, module, inputs, output):
        logits = output[0].float()
        k = module.top_k
        if isinstance(module, mq.Qwen3MoeTopKRouter):
            choice = torch.softmax(logits, dim=-1)
        else:
            choice = logits.sigmoid() + module.e_score_correction_bias
            g = module.num_group
            if g > 1:
                per = choice.shape[-1] // g
                groups = choice.view(-1, g, per).topk(2, dim=-1)[0].sum(-1)
                gs = groups.sort(dim=-1, descending=True).values
                self.gaps.append(float((gs[:, module.topk_group - 1] - gs[:, module.topk_group]).min()))
                keep = torch.zeros_like(groups).scatter_(1, groups.topk(module.topk_group, -1)[1], 1)
                mask = keep.unsqueeze(-1).expand(-1, g, per).reshape(choice.shape).bool()
                choice = choice.masked_fill(~mask, float("-inf"))
        srt = choice.sort(dim=-1, descending=True).values
        if srt.shape[-1] > k and torch.isfinite(srt[:, k]).all():
            self.gaps.append(float((srt[:, k - 1] - srt[:, k]).min()))

    def close(self):
        md32.DeepseekV32Indexer.forward = self._orig
        for h in self.handles:
            h.remove()


def run_case(model, prompt_ids, n_new, tie_rule=None):
    if tie_rule == "earliest":
        orig = md32.DeepseekV32Indexer.forward
        md32.DeepseekV32Indexer.forward = _indexer_forward_earliest
        try:
            full = greedy(model, prompt_ids, n_new)
        finally:
            md32.DeepseekV32Indexer.forward = orig
    else:
        full = greedy(model, prompt_ids, n_new)
    probe = RouterProbe(model, tie_rule)
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
            "router": min(probe.gaps) if probe.gaps else None,
            "indexer": min(probe.index_gaps) if probe.index_gaps else None}
    case["sparse_rows"] = probe.sparse_rows
    if tie_rule is not None:
        # Rows (layer x position) whose index_topk-th and next best scores are equal: what
        # `colibri validate` reports as boundary_ties for the teacher-forced forward.
        case["tie_rule"] = tie_rule
        case["index_boundary_ties"] = probe.boundary_ties
    return case, logits.numpy().astype("<f4"), gaps


def build(spec):
    fam = FAMILIES[spec["family"]]
    chat = fam["chat"]
    out = ROOT / spec["dir"]
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(spec["vocab"], fam["specials"])
    vocab = tok.get_vocab_size()
    eos = [tok.token_to_id(s) for s in fam["eos"]]
    cfg_kwargs = dict(spec["config"])
    cfg_kwargs.update(vocab_size=vocab, eos_token_id=eos, bos_token_id=None, pad_token_id=None)
    cfg_kwargs.setdefault("max_position_embeddings", 4096)
    short_ids = tok.encode(chat("Hello! How are you today?")).ids
    long_ids = tok.encode(chat(LONG_TEXT)).ids[: spec["long_prompt"]]
    assert len(long_ids) == spec["long_prompt"], len(long_ids)

    for seed in range(spec["seed"], spec["seed"] + 400):
        torch.manual_seed(seed)
        config = fam["config"](**cfg_kwargs)
        config._attn_implementation = "eager"
        model = fam["model"](config).float().eval()
        redraw(model, seed, spec["stds"])
        if config.tie_word_embeddings:
            model.tie_weights()
        cases, all_gaps, ok = {}, {}, True
        for name, pids, n_new in [("short", short_ids, spec["short_new"]),
                                  ("long", long_ids, spec["long_new"])]:
            case, logits, gaps = run_case(model, pids, n_new, spec.get("tie_rule"))
            cases[name] = (case, logits)
            all_gaps[name] = gaps
            if any(g is not None and g < MIN_GAP for g in gaps.values()):
                ok = False
                break
            # A tie spec is only worth its name when its long case has ties at the cut.
            if name == "long" and spec.get("tie_rule") and not case["index_boundary_ties"]:
                ok = False
                break
        if ok:
            break
        print(f"{spec['dir']}: seed {seed} rejected ({all_gaps})", file=sys.stderr)
    else:
        raise SystemExit(f"{spec['dir']}: no seed with margins >= {MIN_GAP}")

    # Every bias is drawn (redraw): one left at zero would pass whether it is loaded or not.
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert p.abs().min() > 0, f"{spec['dir']}: {name} has a zero"
    for f in out.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(out, safe_serialization=True, max_shard_size=spec.get("shard", "50GB"))
    (out / "generation_config.json").unlink(missing_ok=True)
    if spec.get("legacy_rope"):
        legacy_rope(out / "config.json", fam["config"], config)
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


def legacy_rope(path, config_class, config):
    """Rewrites the saved `rope_parameters` as transformers 4 wrote RoPE (what Qwen3's model
    card tells users to add): `rope_theta` at the top level, the rest as `rope_scaling` with
    `rope_type`; transformers must read it back to the same parameters."""
    cfg = json.loads(path.read_text())
    params = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    back = config_class.from_pretrained(path.parent)
    assert back.rope_parameters == config.rope_parameters, (back.rope_parameters,
                                                            config.rope_parameters)


SPECS = [
    # Qwen3-MoE: GQA (4 query heads over 2 key-value heads) with per-head q/k RMSNorm, a large
    # rope_theta, layer 0 dense through mlp_only_layers, softmax router with top-k
    # renormalisation, no shared expert.
    dict(dir="tests/fixtures/tiny-qwen3-moe", family="qwen3_moe", vocab=512, seed=1, short_new=12,
         long_prompt=64, long_new=16,
         stds={"default": 0.05, "mlp.gate.weight": 0.5},
         config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[0], rms_norm_eps=1e-6,
                     rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False)),
    # The other settings: every second layer sparse (decoder_sparse_step 2), no top-k
    # renormalisation, tied embeddings, head_dim wider than hidden / heads, several shards.
    dict(dir="tests/fixtures/tiny-qwen3-moe-step", family="qwen3_moe", vocab=400, seed=100, short_new=10,
         long_prompt=40, long_new=12, shard="200KB",
         stds={"default": 0.05, "mlp.gate.weight": 0.5},
         config=dict(hidden_size=48, intermediate_size=96, moe_intermediate_size=24,
                     num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=3,
                     head_dim=24, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
                     decoder_sparse_step=2, mlp_only_layers=[], rms_norm_eps=1e-6,
                     rope_theta=5000000.0, tie_word_embeddings=True, attention_bias=False)),
    # Qwen3-MoE with `attention_bias`: transformers biases o_proj as well as q/k/v in this
    # family (GLM-4.x never biases o_proj). Matrices drawn wider (0.15) so the biases, drawn
    # at 0.1, do not drown the tokens' own signal.
    dict(dir="tests/fixtures/tiny-qwen3-moe-bias", family="qwen3_moe", vocab=320, seed=1,
         short_new=10, long_prompt=48, long_new=12,
         stds={"default": 0.15, "mlp.gate.weight": 0.5},
         config=dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=8, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[0], rms_norm_eps=1e-6,
                     rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=True)),
    # Qwen3-MoE with YaRN as Qwen3's model card adds it for long contexts (factor 4, legacy
    # `rope_scaling` spelling with `rope_type`), over an original context of 64 so the long
    # case (48 + 24 positions) runs past it: the ramp blends the middle frequencies and the
    # attention factor 0.1 ln 4 + 1 scales cos and sin.
    dict(dir="tests/fixtures/tiny-qwen3-moe-yarn", family="qwen3_moe", vocab=320, seed=1,
         short_new=10, long_prompt=48, long_new=24, legacy_rope=True,
         stds={"default": 0.05, "mlp.gate.weight": 0.5},
         config=dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[0], rms_norm_eps=1e-6,
                     max_position_embeddings=256, tie_word_embeddings=False,
                     attention_bias=False,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0,
                                      "factor": 4.0, "original_max_position_embeddings": 64})),
    # Qwen3-MoE with every layer sparse (no mlp_only_layers): the shape llama.cpp's qwen3moe
    # GGUF can hold (it has no dense layers), for tests/fixtures/gguf/tiny-qwen3-moe-sparse-f32.gguf.
    dict(dir="tests/fixtures/tiny-qwen3-moe-sparse", family="qwen3_moe", vocab=320, seed=1,
         short_new=10, long_prompt=48, long_new=12,
         stds={"default": 0.05, "mlp.gate.weight": 0.5},
         config=dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
                     rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False)),
    # Qwen3-MoE, every layer sparse, every quantized matrix's rows a multiple of 256 wide
    # (hidden 256, 4 heads x 64, moe_intermediate 256): the K-quant and IQ super-blocks fit, so
    # llama-quantize writes those types rather than a fallback (tests/fixtures/gguf/
    # kq-qwen3-moe-*.gguf, scripts/make_gguf_fixtures.sh). Two layers of two experts keep
    # the F32 GGUF and its thirteen quantizations near 10 MB.
    dict(dir="tests/fixtures/kq-qwen3-moe", family="qwen3_moe", vocab=320, seed=1,
         short_new=10, long_prompt=48, long_new=12,
         stds={"default": 0.05, "mlp.gate.weight": 0.5},
         config=dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                     head_dim=64, num_experts=2, num_experts_per_tok=1, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
                     rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False)),
    # GLM-4.5: biased q/k/v, partial rotary (half of each head), sigmoid router with
    # correction bias and routed scaling, a shared expert, the first layer dense.
    dict(dir="tests/fixtures/tiny-glm4-moe", family="glm4_moe", vocab=512, seed=1, short_new=12,
         long_prompt=64, long_new=16,
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1},
         config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                     routed_scaling_factor=2.5, n_group=1, topk_group=1,
                     first_k_dense_replace=1, norm_topk_prob=True, use_qk_norm=False,
                     attention_bias=True, partial_rotary_factor=0.5, rms_norm_eps=1e-5,
                     rope_theta=10000.0, tie_word_embeddings=False)),
    # GLM-4.5 with the options the big checkpoints do not all use: q/k RMSNorm,
    # group-limited routing (4 groups, 2 kept, as DeepSeek-V3 routes), two shared experts,
    # no top-k renormalisation, every layer sparse, several shards.
    dict(dir="tests/fixtures/tiny-glm4-moe-groups", family="glm4_moe", vocab=400, seed=100,
         short_new=10, long_prompt=40, long_new=12, shard="250KB",
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1},
         config=dict(hidden_size=48, intermediate_size=96, moe_intermediate_size=24,
                     num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                     head_dim=16, n_routed_experts=16, num_experts_per_tok=3, n_shared_experts=2,
                     routed_scaling_factor=1.5, n_group=4, topk_group=2,
                     first_k_dense_replace=0, norm_topk_prob=False, use_qk_norm=True,
                     attention_bias=True, partial_rotary_factor=0.5, rms_norm_eps=1e-6,
                     rope_theta=5000.0, tie_word_embeddings=False)),
    # GLM-4.5 with YaRN (transformers 5's `rope_parameters` spelling, betas 8 and 1 without
    # truncation so the ramp's ends are fractional): the ramp runs over the rotated half of
    # each head only (partial rotary); o_proj unbiased though attention_bias biases q/k/v.
    dict(dir="tests/fixtures/tiny-glm4-moe-yarn", family="glm4_moe", vocab=320, seed=1,
         short_new=10, long_prompt=48, long_new=24,
         stds={"default": 0.05, "q_proj": 0.3, "k_proj": 0.3, "mlp.gate.weight": 0.5,
               "router_bias": 0.1},
         config=dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                     routed_scaling_factor=2.5, n_group=1, topk_group=1,
                     first_k_dense_replace=1, norm_topk_prob=True, use_qk_norm=False,
                     attention_bias=True, rms_norm_eps=1e-5, max_position_embeddings=256,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                      "partial_rotary_factor": 0.5, "factor": 4.0,
                                      "original_max_position_embeddings": 64,
                                      "beta_fast": 8.0, "beta_slow": 1.0, "truncate": False},
                     tie_word_embeddings=False)),
    # DeepSeek-V3 as published at a tiny size: MLA without an indexer, the first layer dense,
    # 16 experts in 4 groups of which 2 are kept, a shared expert, and YaRN exactly as the
    # checkpoints configure it (factor 40 over an original 4096, mscale = mscale_all_dim = 1):
    # its ramp blends the rotary frequencies and its mscale^2 scales the softmax.
    dict(dir="tests/fixtures/tiny-deepseek-v3", family="deepseek_v3", vocab=512, seed=1,
         short_new=12, long_prompt=64, long_new=16, shard="300KB",
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1},
         config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=4,
                     num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                     qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                     n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3,
                     n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                     rms_norm_eps=1e-6, rope_interleave=True, attention_bias=False,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                      "factor": 40.0, "original_max_position_embeddings": 4096,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                      "mscale_all_dim": 1.0},
                     tie_word_embeddings=False)),
    # DeepSeek-V3.2: the same plus the DSA indexer on every layer (rotate-half rotary there),
    # index_topk 16 so the long case's rows past 16 attend sparsely.
    dict(dir="tests/fixtures/tiny-deepseek-v32", family="deepseek_v32", vocab=512, seed=1,
         short_new=12, long_prompt=64, long_new=16,
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1,
               "indexer.wq_b": 0.3, "indexer.wk": 0.3, "indexer.weights_proj": 0.5},
         config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
                     num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                     qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                     n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3,
                     n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                     rms_norm_eps=1e-6, rope_interleave=True, attention_bias=False,
                     index_topk=16, index_head_dim=16, index_n_heads=8,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                      "factor": 40.0, "original_max_position_embeddings": 4096,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                      "mscale_all_dim": 1.0},
                     tie_word_embeddings=False)),
    # Moonlight-16B-A3B / DeepSeek-V2-Lite's attention: q_lora_rank null, so one q_proj
    # instead of q_a_proj, q_a_layernorm and q_b_proj; no expert groups, two shared experts,
    # plain RoPE, as Moonlight's config.json has them.
    dict(dir="tests/fixtures/tiny-deepseek-v3-q-proj", family="deepseek_v3", vocab=400, seed=1,
         short_new=10, long_prompt=40, long_new=12,
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1},
         config=dict(hidden_size=48, intermediate_size=96, moe_intermediate_size=16,
                     num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
                     num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=24,
                     qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                     n_routed_experts=8, n_group=1, topk_group=1, num_experts_per_tok=3,
                     n_shared_experts=2, routed_scaling_factor=2.446, norm_topk_prob=True,
                     rms_norm_eps=1e-5, rope_interleave=True, attention_bias=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
                     tie_word_embeddings=False)),
    # DeepSeek-V3.2 with its dense layer in the middle: mlp_layer_types decides, and
    # first_k_dense_replace (1, which alone would make layer 0 dense) is not read.
    dict(dir="tests/fixtures/tiny-deepseek-v32-mlp-types", family="deepseek_v32", vocab=400,
         seed=1, short_new=10, long_prompt=40, long_new=12,
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1,
               "indexer.wq_b": 0.3, "indexer.wk": 0.3, "indexer.weights_proj": 0.5},
         config=dict(hidden_size=48, intermediate_size=96, moe_intermediate_size=16,
                     num_hidden_layers=3, first_k_dense_replace=1,
                     mlp_layer_types=["sparse", "dense", "sparse"], num_attention_heads=4,
                     num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=24,
                     qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                     n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2,
                     n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                     rms_norm_eps=1e-6, rope_interleave=True, attention_bias=False,
                     index_topk=16, index_head_dim=16, index_n_heads=8,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                     tie_word_embeddings=False)),
    # DeepSeek-V3.2 with 4 indexer heads: keys every head scores at or below zero tie at
    # exactly 0.0, and rows whose cut falls among them are the ones torch.topk settles
    # arbitrarily. The reference keeps the earliest keys of a tie (tie_rule), colibri's rule.
    dict(dir="tests/fixtures/tiny-deepseek-v32-ties", family="deepseek_v32", vocab=400,
         seed=1, short_new=10, long_prompt=48, long_new=12, tie_rule="earliest",
         stds={"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1,
               "indexer.wq_b": 0.3, "indexer.wk": 0.3, "indexer.weights_proj": 0.5},
         config=dict(hidden_size=48, intermediate_size=96, moe_intermediate_size=16,
                     num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                     num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=24,
                     qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                     n_routed_experts=8, n_group=1, topk_group=1, num_experts_per_tok=2,
                     n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                     rms_norm_eps=1e-6, rope_interleave=True, attention_bias=False,
                     index_topk=16, index_head_dim=16, index_n_heads=4,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                     tie_word_embeddings=False)),
]

if __name__ == "__main__":
    only = sys.argv[1:]
    for spec in SPECS:
        if not only or any(o in spec["dir"] for o in only):
            build(spec)
