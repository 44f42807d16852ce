#!/usr/bin/env python3
"""Train the bundled demo model: a small `glm_moe_dsa` on the King James Bible, on CPU.

    ../venv/bin/python scripts/demo/prepare_text.py ../demo-data
    nice -n 5 ../venv/bin/python scripts/demo/train.py --data ../demo-data --out ../demo-train
    ../venv/bin/python scripts/demo/export.py --ckpt ../demo-train/ckpt.pt   # -> daemon/demo/

The model is transformers' own `GlmMoeDsaForCausalLM`, so the checkpoint is exactly what
transformers computes; only three things are added around it, each the way the papers do it:

* DSA indexer. transformers runs the indexer under `no_grad` (it only picks keys), so the LM
  loss never reaches it. It is trained by DeepSeek-V3.2's objective instead: the KL divergence
  from the main attention's dense distribution (summed over heads, renormalised, detached) to
  the indexer's softmax, on the indexer's detached inputs. A full-indexer layer's target is the
  mean over it and the "shared" layers that reuse its selection. The first DENSE_STEPS steps
  run the main attention dense (V3.2's warm-up), the rest sparse, exactly as transformers'
  eager attention masks it. Warm-up, dense phase and batch order do not depend on --steps, so
  a run resumed (--resume) after step WARMUP with another --steps is the run with that --steps.
* Router bias. The sigmoid router's `e_score_correction_bias` is a buffer no loss touches; it is
  kept balanced auxiliary-loss-free (DeepSeek-V3 section 2.1.2): after each step, every expert's
  bias moves by BIAS_RATE (BIAS_RATE_LATE after the warm-up) toward the mean load (up if
  under-loaded, down if over-loaded).
* MTP. A DeepSeek-V3 / GLM-5 "nextn" block predicts token t+2 from the main model's last
  hidden state at t (before the final norm) and the embedding of token t+1:
  eh_proj([enorm(emb(x[t+1])); hnorm(h[t])]) -> one MoE decoder layer -> shared_head.norm ->
  the main lm_head. It shares the embedding and the head with the main model, and is saved as
  layer `num_hidden_layers` (export.py), which transformers ignores on load.

Fixed seed; single process, two threads. Writes OUT/log.jsonl (losses), OUT/ckpt.pt every
CKPT_EVERY steps (a usable model exists if training is stopped early) and OUT/tokenizer.json.
"""
import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mg

SEED = 1611
VOCAB = 4096
CTX = 256
BATCH = 16
SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
            "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>"]
CONFIG = dict(hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
              num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
              indexer_types=["full", "shared", "full", "shared"],
              num_attention_heads=4, num_key_value_heads=4, n_routed_experts=16,
              num_experts_per_tok=4, n_shared_experts=1, q_lora_rank=128, kv_lora_rank=64,
              qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, index_topk=64,
              index_head_dim=32, index_n_heads=4, routed_scaling_factor=2.5, n_group=1,
              topk_group=1, norm_topk_prob=True, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
              max_position_embeddings=4096, tie_word_embeddings=False, initializer_range=0.02)
LR, WARMUP, MIN_LR_FRAC, WEIGHT_DECAY = 2e-3, 100, 0.1, 0.1
MTP_WEIGHT, KL_WEIGHT = 0.3, 1.0
BIAS_RATE, BIAS_RATE_LATE = 1e-3, 4e-3
DENSE_STEPS = 60
CKPT_EVERY, EVAL_EVERY, LOG_EVERY = 100, 100, 10


def make_tokenizer(train_text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_text.splitlines(), trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def encode_docs(tok, text):
    """Documents (one per line) joined by <|endoftext|>, as one token stream."""
    eot = tok.token_to_id("<|endoftext|>")
    ids = []
    for enc in tok.encode_batch([d for d in text.splitlines() if d]):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.array(ids, dtype=np.int64)


def model_config(tok):
    eos = [tok.token_to_id(s) for s in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    cfg = GlmMoeDsaConfig(**CONFIG, vocab_size=VOCAB, eos_token_id=eos, bos_token_id=None,
                          pad_token_id=None)
    cfg._attn_implementation = "eager"
    return cfg


def mtp_config(cfg):
    """The config a decoder layer at index num_hidden_layers reads: one more MoE, full-indexer layer."""
    d = cfg.to_dict()
    n = cfg.num_hidden_layers
    d.update(num_hidden_layers=n + 1, mlp_layer_types=list(cfg.mlp_layer_types) + ["sparse"],
             indexer_types=list(cfg.indexer_types) + ["full"],
             layer_types=list(cfg.layer_types) + [cfg.layer_types[-1]])
    for k in ("model_type", "transformers_version", "architectures"):
        d.pop(k, None)
    c = GlmMoeDsaConfig(**d)
    c._attn_implementation = "eager"
    return c


class Mtp(nn.Module):
    """DeepSeek-V3 / GLM-5 nextn block; parameter names match the checkpoint's layer N tensors."""

    def __init__(self, cfg):
        super().__init__()
        h, n = cfg.hidden_size, cfg.num_hidden_layers
        self.enorm = mg.GlmMoeDsaRMSNorm(h, cfg.rms_norm_eps)
        self.hnorm = mg.GlmMoeDsaRMSNorm(h, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layer = mg.GlmMoeDsaDecoderLayer(mtp_config(cfg), n)
        self.shared_head_norm = mg.GlmMoeDsaRMSNorm(h, cfg.rms_norm_eps)

    def forward(self, hidden, next_embeds, position_embeddings, mask, lm_head):
        x = self.eh_proj(torch.cat([self.enorm(next_embeds), self.hnorm(hidden)], dim=-1))
        x, _ = self.layer(x, attention_mask=mask, position_embeddings=position_embeddings,
                          position_ids=None)
        return lm_head(self.shared_head_norm(x))

    def checkpoint_tensors(self, n):
        """This block's tensors under the names GLM-5 checkpoints give layer n's MTP block."""
        out = {}
        for name, t in self.state_dict().items():
            if name.startswith("layer."):
                name = name[len("layer."):]
            elif name.startswith("shared_head_norm."):
                name = "shared_head.norm." + name[len("shared_head_norm."):]
            out[f"model.layers.{n}.{name}"] = t
        return out


class Recorder:
    """Hooks that collect what the extra objectives need from transformers' forward."""

    def __init__(self, modules):
        self.dense = True
        self.attn_probs = {}   # layer -> [B, S, T] dense attention, mean over heads, detached
        self.index_in = {}     # layer -> (indexer module, hidden, q_resid, (cos, sin))
        self.loads = {}        # router -> expert counts this step
        for m in modules:
            for mod in m.modules():
                if isinstance(mod, mg.GlmMoeDsaIndexer):
                    mod.register_forward_pre_hook(self._indexer_hook)
                elif isinstance(mod, mg.GlmMoeDsaTopkRouter):
                    mod.register_forward_hook(self._router_hook)

    def clear(self):
        self.attn_probs.clear()
        self.index_in.clear()
        self.loads.clear()

    def _indexer_hook(self, mod, args):
        hidden, q_resid, pos = args[0], args[1], args[2]
        self.index_in[mod.layer_idx] = (mod, hidden.detach(), q_resid.detach(),
                                        tuple(p.detach() for p in pos))

    def _router_hook(self, mod, inputs, output):
        idx = output[2].reshape(-1)
        counts = torch.bincount(idx, minlength=mod.num_experts).float()
        self.loads[mod] = self.loads.get(mod, 0) + counts

    def attention(self, module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
        """Replaces transformers' eager attention while training: the same arithmetic, plus the
        dense distribution recorded as the indexer's target, and dense attention in warm-up."""
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
        s, t = scores.shape[-2:]
        causal = torch.full((s, t), float("-inf")).triu(1)
        with torch.no_grad():
            self.attn_probs[module.layer_idx] = torch.softmax(scores.detach() + causal, -1).mean(1)
        mask = causal if self.dense else attention_mask
        probs = torch.softmax(scores + mask, dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(probs, value).transpose(1, 2).contiguous()
        return out, None

    def indexer_kl(self, indexer_types):
        """DeepSeek-V3.2's indexer loss, summed over full-indexer layers."""
        total, n = 0.0, 0
        layers = sorted(self.attn_probs)
        for li, (ix, hidden, q_resid, (cos, sin)) in sorted(self.index_in.items()):
            group = [li]
            for lj in layers:
                if lj > li and lj < len(indexer_types) and indexer_types[lj] == "shared" and all(
                        indexer_types[m] == "shared" for m in range(li + 1, lj + 1)):
                    group.append(lj)
            target = torch.stack([self.attn_probs[g] for g in group]).mean(0)
            logits = index_scores(ix, hidden, q_resid, cos, sin)
            s, t = logits.shape[-2:]
            logits = logits + torch.full((s, t), float("-inf")).triu(1)
            logq = torch.log_softmax(logits, -1)
            valid = target > 0
            kl = torch.where(valid, target * (torch.log(target.clamp_min(1e-30)) - logq),
                             torch.zeros_like(target))
            total = total + kl.sum(-1).mean()
            n += 1
        return total / max(n, 1)


def index_scores(ix, hidden, q_resid, cos, sin):
    """GlmMoeDsaIndexer.forward's scores, with gradients (transformers computes them under no_grad)."""
    b, s, _ = hidden.shape
    q = ix.wq_b(q_resid).view(b, s, ix.n_heads, ix.head_dim)
    rd = ix.qk_rope_head_dim
    q_rot, q_pass = torch.split(q, [rd, ix.head_dim - rd], dim=-1)
    k = ix.k_norm(ix.wk(hidden)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [rd, ix.head_dim - rd], dim=-1)
    q_rot, k_rot = mg.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    w = ix.weights_proj(hidden).float() * ix.n_heads ** -0.5
    return torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)


def build(tok):
    cfg = model_config(tok)
    model = GlmMoeDsaForCausalLM(cfg).float()
    mtp = Mtp(cfg).float()
    with torch.no_grad():
        for mod in mtp.modules():
            model._init_weights(mod)
        for mod in mtp.modules():
            if isinstance(mod, mg.GlmMoeDsaRMSNorm):
                mod.weight.fill_(1.0)
    for p in list(model.parameters()) + list(mtp.parameters()):
        assert torch.isfinite(p).all()
    return cfg, model, mtp


def forward_losses(model, mtp, rec, batch, cfg):
    """LM, MTP and indexer-KL losses on a [B, CTX + 2] batch."""
    rec.clear()
    x, y, y2 = batch[:, :CTX], batch[:, 1:CTX + 1], batch[:, 2:CTX + 2]
    pre_norm = {}
    handle = model.model.norm.register_forward_pre_hook(lambda m, a: pre_norm.setdefault("h", a[0]))
    try:
        out = model(input_ids=x, use_cache=False)
    finally:
        handle.remove()
    lm = F.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
    pos = model.model.rotary_emb(pre_norm["h"], torch.arange(CTX).unsqueeze(0))
    mask = torch.full((CTX, CTX), torch.finfo(torch.float32).min).triu(1)[None, None]
    mask = mask.expand(x.shape[0], 1, CTX, CTX)
    mtp_logits = mtp(pre_norm["h"], model.model.embed_tokens(y), pos, mask, model.lm_head)
    mtp_loss = F.cross_entropy(mtp_logits.reshape(-1, cfg.vocab_size), y2.reshape(-1))
    types = list(cfg.indexer_types) + ["full"]
    kl = rec.indexer_kl(types)
    return lm, mtp_loss, kl


def balance_router_bias(rec, step):
    # DeepSeek-V3's rate is tuned for a run of many thousand steps; this one has a few hundred,
    # so after the warm-up the bias moves four times as fast to catch up with the routers.
    rate = BIAS_RATE if step < WARMUP else BIAS_RATE_LATE
    with torch.no_grad():
        for router, load in rec.loads.items():
            router.e_score_correction_bias += rate * torch.sign(load.mean() - load)


def lr_at(step, total):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    p = (step - WARMUP) / max(1, total - WARMUP)
    return LR * (MIN_LR_FRAC + (1 - MIN_LR_FRAC) * 0.5 * (1 + math.cos(math.pi * p)))


def eval_windows(ids, n, seed):
    g = np.random.default_rng(seed)
    starts = g.integers(0, len(ids) - CTX - 2, n)
    return torch.from_numpy(np.stack([ids[s:s + CTX + 2] for s in starts]))


def save_ckpt(path, model, mtp, opt, step, args):
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(),
                "step": step, "args": vars(args)}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=420)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--log-every", type=int, default=LOG_EVERY)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    args.out.mkdir(parents=True, exist_ok=True)

    train_text = (args.data / "train.txt").read_text()
    tok = make_tokenizer(train_text)
    tok.save(str(args.out / "tokenizer.json"))
    train_ids = encode_docs(tok, train_text)
    held_ids = encode_docs(tok, (args.data / "heldout.txt").read_text())
    print(f"train {len(train_ids)} tokens, held out {len(held_ids)}", flush=True)

    cfg, model, mtp = build(tok)
    rec = Recorder([model, mtp])
    mg.eager_attention_forward = rec.attention
    params = list(model.named_parameters()) + [("mtp." + n, p) for n, p in mtp.named_parameters()]
    decay = [p for n, p in params if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in params if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))
    ckpt_path = args.out / "ckpt.pt"
    start = 0
    log = open(args.out / "log.jsonl", "a" if args.resume else "w")
    if args.resume and ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ck["model"])
        mtp.load_state_dict(ck["mtp"])
        opt.load_state_dict(ck["opt"])
        start = ck["step"]
    rng = np.random.default_rng(SEED)
    for _ in range(start):
        # Replay the batch draws, so a resumed run sees the same batches as an unbroken one.
        rng.integers(0, len(train_ids) - CTX - 2, BATCH)
    held_batch = eval_windows(held_ids, 32, SEED)
    t0 = time.time()
    for step in range(start, args.steps):
        model.train()
        mtp.train()
        rec.dense = step < DENSE_STEPS
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps)
        starts = rng.integers(0, len(train_ids) - CTX - 2, BATCH)
        batch = torch.from_numpy(np.stack([train_ids[s:s + CTX + 2] for s in starts]))
        lm, mtp_loss, kl = forward_losses(model, mtp, rec, batch, cfg)
        loss = lm + MTP_WEIGHT * mtp_loss + KL_WEIGHT * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        opt.step()
        balance_router_bias(rec, step)
        rec_line = {"step": step + 1, "lm": lm.item(), "mtp": mtp_loss.item(), "kl": kl.item(),
                    "lr": lr_at(step, args.steps), "dense": rec.dense,
                    "elapsed": round(time.time() - t0, 1)}
        if (step + 1) % EVAL_EVERY == 0 or step + 1 == args.steps:
            model.eval()
            mtp.eval()
            rec.dense = False
            with torch.no_grad():
                hl, hm, hk = forward_losses(model, mtp, rec, held_batch, cfg)
            rec_line.update(held_lm=float(hl), held_mtp=float(hm), held_kl=float(hk))
            loads = [(l / l.sum()).max().item() * 16 for l in rec.loads.values()]
            rec_line["max_load_x_mean"] = [round(v, 2) for v in loads]
        if (step + 1) % args.log_every == 0 or "held_lm" in rec_line:
            log.write(json.dumps(rec_line) + "\n")
            log.flush()
            print(json.dumps(rec_line), flush=True)
        if (step + 1) % CKPT_EVERY == 0 or step + 1 == args.steps:
            save_ckpt(ckpt_path, model, mtp, opt, step + 1, args)
    log.close()


if __name__ == "__main__":
    main()
