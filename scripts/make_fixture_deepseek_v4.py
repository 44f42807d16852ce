#!/usr/bin/env python3
"""Tiny random oracle fixture of DeepSeek-V4 (`deepseek_v4`), made by transformers.

Same contract as scripts/make_family_fixtures.py: a random model in float32 with eager
attention is the ground truth, seeds whose margins fall below MIN_GAP are skipped, and the
fixture directory holds config.json, model.safetensors, tokenizer.json, ref.json and the
teacher-forced logits. The margins checked: the top-1/top-2 logit gap at every position, the
router's top-k boundary (score + correction bias) on every learned-routed layer and token, and
the lightning indexer's top-k boundary on every compressed-sparse layer and query that has more
compressed entries than it keeps.

The config mixes every kind this family has: layer types sliding / compressed-sparse /
heavily-compressed / compressed-sparse, the first two layers hash-routed and the last two
routed by sqrt-softplus scores, 3 hyper-connection streams, a grouped output projection of 2
groups, a clamp of the SwiGLU that bites (limit 0.5 against pre-activations of std ~0.5), YaRN
on the compressed layers' rotary. Rates are small (CSA 4, HCA 8) and the window 8, so the long
case (48 + 16 positions) closes 16 CSA and 8 HCA blocks, its indexer keeps 4 of up to 16
entries (8 indexer heads, so that a key every head ReLUs to zero, a tie at 0.0, is rare), and
every query past position 8 sees only part of its past through the window.

    ../venv-fixtures/bin/python scripts/make_fixture_deepseek_v4.py
"""
import json
import sys
from pathlib import Path

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as md4

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import LONG_TEXT, MIN_GAP, ROOT, greedy, make_tokenizer  # noqa: E402
from make_family_fixtures import DEEPSEEK_SPECIALS, deepseek_chat  # noqa: E402

DIR = "tests/fixtures/tiny-deepseek-v4"
VOCAB = 320
SHORT_NEW, LONG_PROMPT, LONG_NEW = 12, 48, 16

CONFIG = dict(
    hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
    head_dim=16, partial_rotary_factor=0.5, q_lora_rank=16, o_groups=2, o_lora_rank=8,
    moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
    scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=0.5,
    layer_types=["sliding_attention", "compressed_sparse_attention",
                 "heavily_compressed_attention", "compressed_sparse_attention"],
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    sliding_window=8, hc_mult=3, hc_sinkhorn_iters=20, hc_eps=1e-6,
    index_n_heads=8, index_head_dim=16, index_topk=4,
    rope_theta=10000.0, compress_rope_theta=160000.0,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                     "beta_fast": 32.0, "beta_slow": 1.0},
    rms_norm_eps=1e-6, max_position_embeddings=128, tie_word_embeddings=False,
)

STDS = {"default": 0.08, "mlp.gate.weight": 0.5, "experts": 0.1, "position_bias": 0.5,
        "attn_hc.fn": 0.2, "ffn_hc.fn": 0.2, "hc_head.hc_fn": 0.2, "indexer": 0.3,
        "lm_head": 0.5}


def redraw(model, seed, stds=STDS):
    """Every parameter drawn: matrices N(0, std of their group), norms, sinks, hyper-connection
    bases and scales 1 + N(0, 0.1), the correction bias N(0, 0.1); each hash row a random
    set of distinct experts."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = stds["default"]
                for key, s in stds.items():
                    if key != "default" and key in name:
                        std = s
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
            elif name.endswith("tid2eid"):
                rows = [torch.randperm(model.config.n_routed_experts, generator=g)[: b.shape[1]]
                        for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows))


class Probe:
    """The smallest gaps at the learned routers' and the indexers' top-k boundaries."""

    def __init__(self, model):
        self.router, self.index, self.index_rows = [], [], 0
        self.handles = []
        for m in model.modules():
            if isinstance(m, md4.DeepseekV4TopKRouter):
                self.handles.append(m.register_forward_hook(self._route))
            if isinstance(m, md4.DeepseekV4Indexer):
                self.handles.append(m.scorer.register_forward_hook(self._make_index(m)))

    def _route(self, module, inputs, output):
        logits = output[0].float()
        choice = module.score_fn(logits) + module.e_score_correction_bias
        srt = choice.sort(dim=-1, descending=True).values
        k = module.top_k
        self.router.append(float((srt[:, k - 1] - srt[:, k]).min()))

    def _make_index(self, ix):
        def hook(module, inputs, output):
            scores = output[0]  # [S, T]
            s, t = scores.shape
            for row in range(s):
                valid = (row + 1) // ix.compress_rate
                if valid > ix.index_topk:
                    self.index_rows += 1
                    srt = scores[row, :valid].sort(descending=True).values
                    k = ix.index_topk
                    self.index.append(float(srt[k - 1] - srt[k]))
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def run_case(model, prompt_ids, n_new):
    full = greedy(model, prompt_ids, n_new)
    probe = Probe(model)
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
        "sparse_rows": probe.index_rows,
    }
    gaps = {"logit": float((srt.values[:, 0] - srt.values[:, 1]).min()),
            "router": min(probe.router) if probe.router else None,
            "indexer": min(probe.index) if probe.index else None}
    return case, logits.numpy().astype("<f4"), gaps


def check_cached(model, full):
    """The cached decode (prefill, then one token at a time through the compressors' buffers
    and overlap states) gives the logits of the uncached forward: the rule colibri follows."""
    with torch.no_grad():
        ref = model(torch.tensor([full]), use_cache=False).logits[0]
        out = model(torch.tensor([full[:5]]), use_cache=True)
        rows, cache = [out.logits[0]], out.past_key_values
        for t in full[5:]:
            out = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            rows.append(out.logits[0])
            cache = out.past_key_values
    got = torch.cat(rows)
    err = float((got - ref).abs().max())
    assert err < 1e-4, f"cached decode differs from the full forward by {err}"
    return err


def main():
    out = ROOT / DIR
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(VOCAB, DEEPSEEK_SPECIALS)
    vocab = tok.get_vocab_size()
    eos = [tok.token_to_id("<｜end▁of▁sentence｜>")]
    short_ids = tok.encode(deepseek_chat("Hello! How are you today?")).ids
    long_ids = tok.encode(deepseek_chat(LONG_TEXT)).ids[:LONG_PROMPT]
    assert len(long_ids) == LONG_PROMPT, len(long_ids)
    kwargs = dict(CONFIG, vocab_size=vocab, eos_token_id=eos, bos_token_id=None,
                  pad_token_id=None)
    for seed in range(1, 400):
        torch.manual_seed(seed)
        config = DeepseekV4Config(**kwargs)
        config._attn_implementation = "eager"
        model = DeepseekV4ForCausalLM(config).float().eval()
        redraw(model, seed)
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
    for f in out.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    tok.save(str(out / "tokenizer.json"))
    ref = {"meta": {"seed": seed, "min_gaps": all_gaps, "cached_decode_max_err": cached_err,
                    "transformers": __import__("transformers").__version__,
                    "torch": torch.__version__}}
    for name, (case, logits) in cases.items():
        fname = f"logits_{name}.f32"
        logits.tofile(out / fname)
        case["logits_file"] = fname
        ref[name] = case
    (out / "ref.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{DIR}: seed {seed}, vocab {vocab}, gaps {all_gaps}, cached err {cached_err:.2e}")


if __name__ == "__main__":
    main()
