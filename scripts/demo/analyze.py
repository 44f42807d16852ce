#!/usr/bin/env python3
"""Figures of the trained demo model that the engine does not compute itself: how evenly the
routers spread tokens over the experts, and how often the MTP head's draft would be accepted.

    ../venv/bin/python scripts/demo/analyze.py --heldout ../demo-data/heldout.txt

Reads daemon/demo as stored (BF16 -> float32), the MTP block from its layer
`num_hidden_layers` tensors.

* Routing entropy, per MoE layer: the entropy (bits) of the experts' share of all selections
  over the held-out text, beside log2(n_experts), a uniform router's.
* MTP acceptance (greedy, as a one-token speculative draft): from held-out prompts the main
  model generates greedily; at every generated position t the MTP head, given h[t] and the
  token t+1, drafts token t+2, and the draft is accepted when it equals the main model's greedy
  token t+2. Also its teacher-forced top-1 accuracy on the held-out text itself.
* Indexer recall, per full-indexer layer: on rows with more than index_topk keys, the share of
  the dense attention's mass (mean over heads) that falls on the indexer's top-k keys, beside
  the share on the index_topk most recent keys (a sliding window of the same size).
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import GlmMoeDsaForCausalLM
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as T  # noqa: E402


def load(demo):
    model = GlmMoeDsaForCausalLM.from_pretrained(demo, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    n = cfg.num_hidden_layers
    deep = GlmMoeDsaForCausalLM.from_pretrained(demo, config=T.mtp_config(cfg),
                                                dtype=torch.float32).eval()
    mtp = T.Mtp(cfg).eval()
    mtp.layer = deep.model.layers[n]
    with safe_open(str(demo / "model.safetensors"), "pt") as f:
        for name in ("enorm.weight", "hnorm.weight", "eh_proj.weight"):
            getattr(mtp, name.split(".")[0]).weight.data.copy_(
                f.get_tensor(f"model.layers.{n}.{name}").float())
        mtp.shared_head_norm.weight.data.copy_(
            f.get_tensor(f"model.layers.{n}.shared_head.norm.weight").float())
    return model, mtp


def hidden_and_logits(model, ids):
    """Main logits and the last decoder layer's output (before the final norm)."""
    pre = {}
    h = model.model.norm.register_forward_pre_hook(lambda m, a: pre.setdefault("h", a[0]))
    try:
        logits = model(torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        h.remove()
    return logits, pre["h"]


def mtp_logits(model, mtp, ids, hidden):
    s = len(ids) - 1
    pos = model.model.rotary_emb(hidden, torch.arange(s).unsqueeze(0))
    mask = torch.full((s, s), torch.finfo(torch.float32).min).triu(1)[None, None]
    nxt = model.model.embed_tokens(torch.tensor([ids[1:]]))
    return mtp(hidden[:, :s], nxt, pos, mask, model.lm_head)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--demo", type=Path, default=ROOT / "daemon" / "demo")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--new", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, mtp = load(args.demo)
    tok = Tokenizer.from_file(str(args.demo / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    ids = []
    for d in args.heldout.read_text().splitlines():
        if d:
            ids += tok.encode(d).ids + [eot]

    # Routing over the held-out text, windows of the training context.
    counts = {}
    hooks = []
    for li, layer in enumerate(model.model.layers):
        if isinstance(layer.mlp, mg.GlmMoeDsaMoE):
            def hook(mod, inp, out, li=li):
                c = torch.bincount(out[2].reshape(-1), minlength=mod.num_experts)
                counts[li] = counts.get(li, 0) + c
            hooks.append(layer.mlp.gate.register_forward_hook(hook))
    tf_hits = tf_n = main_hits = 0
    with torch.no_grad():
        for b in range(0, len(ids) - 3, T.CTX):
            w = ids[b:b + T.CTX + 1]
            if len(w) < 4:
                break
            logits, hidden = hidden_and_logits(model, w[:-1])
            ml = mtp_logits(model, mtp, w[:-1], hidden)     # position t drafts t+2
            main_hits += int((logits[:-1].argmax(-1) == torch.tensor(w[1:-1])).sum())
            tf_hits += int((ml.argmax(-1) == torch.tensor(w[2:])).sum())
            tf_n += len(w) - 2
    for h in hooks:
        h.remove()
    n_exp = model.config.n_routed_experts
    entropy = {}
    for li, c in sorted(counts.items()):
        p = c.double() / c.sum()
        entropy[li] = float(-(p[p > 0] * p[p > 0].log2()).sum())

    # Indexer recall against dense attention, on windows of the training context.
    rec = T.Recorder([model])
    rec.dense = True
    saved = mg.eager_attention_forward
    mg.eager_attention_forward = rec.attention
    k = model.config.index_topk
    mass = {}
    with torch.no_grad():
        for b in range(0, min(len(ids) - T.CTX, 40 * T.CTX), T.CTX):
            rec.clear()
            model(torch.tensor([ids[b:b + T.CTX]]), use_cache=False)
            for li, (ix, hidden, q_resid, (cos, sin)) in rec.index_in.items():
                scores = T.index_scores(ix, hidden, q_resid, cos, sin)[0]
                dense = rec.attn_probs[li][0]
                s_ = scores.shape[-1]
                scores = scores + torch.full((s_, s_), float("-inf")).triu(1)
                for r in range(k, s_):
                    top = scores[r, : r + 1].topk(k).indices
                    m = mass.setdefault(li, [0.0, 0.0, 0])
                    m[0] += float(dense[r, top].sum())
                    m[1] += float(dense[r, r + 1 - k: r + 1].sum())
                    m[2] += 1
    mg.eager_attention_forward = saved
    recall = {li: {"indexer_topk_mass": m[0] / m[2], "recent_window_mass": m[1] / m[2],
                   "rows": m[2]} for li, m in sorted(mass.items())}

    # Greedy acceptance.
    acc = tot = 0
    step = max(1, (len(ids) - 64) // args.prompts)
    with torch.no_grad():
        for k in range(args.prompts):
            seq = ids[k * step: k * step + 32]
            for _ in range(args.new):
                logits, _ = hidden_and_logits(model, seq)
                seq.append(int(logits[-1].argmax()))
            _, hidden = hidden_and_logits(model, seq)
            ml = mtp_logits(model, mtp, seq, hidden)
            for t in range(31, len(seq) - 2):
                acc += int(ml[t].argmax()) == seq[t + 2]
                tot += 1
    out = {"routing_entropy_bits": entropy, "uniform_bits": math.log2(n_exp),
           "selection_share_max": {li: float((c.double() / c.sum()).max()) for li, c in counts.items()},
           "mtp_greedy_acceptance": acc / tot, "mtp_greedy_positions": tot,
           "mtp_teacher_forced_top1": tf_hits / tf_n, "main_teacher_forced_top1": main_hits / tf_n,
           "heldout_tokens": len(ids), "indexer_recall": recall}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
