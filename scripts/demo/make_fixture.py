#!/usr/bin/env python3
"""The oracle fixture of the trained demo model: transformers' logits on daemon/demo's weights.

    ../venv/bin/python scripts/demo/make_fixture.py --heldout ../demo-data/heldout.txt

Writes tests/fixtures/demo-trained/: ref.json and logits_<case>.f32 in the format of
scripts/make_fixtures.py (a short chat-template prompt and a long raw passage whose rows go past
index_topk, so the DSA sparse path runs), and score.txt + score.json, a held-out passage with
the perplexity `colibri score` must reproduce. The weights are not copied: the tests point
`--snap` at daemon/demo.

The model is read back from daemon/demo's BF16 safetensors into float32 (exact), eager
attention, so the reference is computed on exactly the stored weights. The trained model's
weights cannot be redrawn, so the margins of make_fixtures.py (top-1/top-2 logit gap, router and
indexer top-k boundary gaps, each >= MIN_GAP) are met by choosing the passage: candidates are
tried in a fixed order and the first that meets every margin is kept.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import GlmMoeDsaForCausalLM

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import make_fixtures as mf  # noqa: E402

SHORT_QUESTIONS = ["Who made the heaven and the earth?", "What did the LORD say unto Moses?",
                   "Where is the river of Jordan?", "Tell me of the kings of Israel.",
                   "Who was the son of David?", "What is love?"]
LONG_PROMPT, LONG_NEW, SHORT_NEW = 80, 16, 12
# The score windows stay within index_topk (64): the trained indexer's ReLU leaves many keys
# at exactly 0, and a row whose top-k boundary falls inside such a tie is decided by
# torch.topk's tie order, which no other implementation need share; nearly every window of
# 96 tokens has one. validate's long case covers the sparse path on a passage without ties.
SCORE_CTX, SCORE_STRIDE, SCORE_TOKENS = 64, 32, 128
# Engine and transformers agree on router scores to ~1e-7 (hidden states to ~1e-6 relative),
# so a boundary 1e-5 wide cannot flip; validate's 1e-4 rejects nearly every passage.
SCORE_MIN_GAP = 1e-5


def byte_table():
    """GPT-2 byte-level alphabet, inverted: token characters back to the bytes they stand for."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def windows(n, ctx, stride):
    """Same plan as daemon/src/cmd/score.rs: (begin, first scored target, end)."""
    out, begin, scored_to = [], 0, 1
    while scored_to < n:
        end = min(begin + ctx, n)
        first = max(scored_to, begin + 1)
        if first < end:
            out.append((begin, first, end))
        scored_to = end
        begin += stride
    return out


def score(model, tok, text):
    """The perplexity `colibri score` must print, or None when a router or indexer top-k
    boundary in some window is closer than SCORE_MIN_GAP (float noise could flip it there)."""
    ids = tok.encode(text).ids
    inv = byte_table()
    vocab = tok.get_vocab()
    id_bytes = {i: len(bytes(inv[c] for c in s)) for s, i in vocab.items()}
    nll, n, nbytes = 0.0, 0, 0
    for begin, first, end in windows(len(ids), SCORE_CTX, SCORE_STRIDE):
        probe = mf.Probe(model)
        try:
            with torch.no_grad():
                logits = model(torch.tensor([ids[begin:end]]), use_cache=False).logits[0].double()
        finally:
            probe.close()
        if min(probe.router_gaps + probe.index_gaps) < SCORE_MIN_GAP:
            return None
        logp = torch.log_softmax(logits, -1)
        for t in range(first, end):
            nll -= float(logp[t - begin - 1, ids[t]])
            n += 1
            nbytes += id_bytes[ids[t]]
    return {"ctx": SCORE_CTX, "stride": SCORE_STRIDE, "text_tokens": len(ids), "tokens": n,
            "nll": nll / n, "ppl": math.exp(nll / n), "bpb": nll / math.log(2) / nbytes,
            "bytes": nbytes}


def ok(gaps):
    return all(gaps[k] is None or gaps[k] >= mf.MIN_GAP for k in ("logit", "router", "indexer"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--demo", type=Path, default=ROOT / "daemon" / "demo")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "demo-trained")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GlmMoeDsaForCausalLM.from_pretrained(args.demo, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(args.demo / "tokenizer.json"))
    topk = model.config.index_topk
    chapters = [c for c in args.heldout.read_text().splitlines() if c]

    cases, all_gaps = {}, {}
    for q in SHORT_QUESTIONS:
        ids = tok.encode(f"[gMASK]<sop><|user|>{q}<|assistant|><think></think>").ids
        case, logits, gaps = mf.run_case(model, ids, SHORT_NEW, topk)
        if ok(gaps):
            cases["short"], all_gaps["short"] = (case, logits), gaps
            break
        print(f"short {q!r} rejected: {gaps}", file=sys.stderr)
    else:
        raise SystemExit("no short prompt meets the margins")
    # Long: passages that start at a verse (sentence) boundary, in a fixed order.
    candidates = []
    for ch in chapters:
        starts = [0] + [i + 2 for i in range(len(ch) - 2) if ch[i] == "." and ch[i + 1] == " "]
        candidates += [ch[s:] for s in starts[::7]]
    for passage in candidates:
        ids = tok.encode(passage).ids[:LONG_PROMPT]
        if len(ids) < LONG_PROMPT:
            continue
        case, logits, gaps = mf.run_case(model, ids, LONG_NEW, topk)
        if ok(gaps) and gaps["sparse_rows"] > 0:
            cases["long"], all_gaps["long"] = (case, logits), gaps
            break
        print(f"long passage rejected: {gaps}", file=sys.stderr)
    else:
        raise SystemExit("no long passage meets the margins")

    args.out.mkdir(parents=True, exist_ok=True)
    ref = {"meta": {"model": "daemon/demo", "min_gaps": all_gaps,
                    "transformers": __import__("transformers").__version__,
                    "torch": torch.__version__}}
    for name, (case, logits) in cases.items():
        fname = f"logits_{name}.f32"
        logits.tofile(args.out / fname)
        case["logits_file"] = fname
        ref[name] = case
    (args.out / "ref.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")

    # The score passage: SCORE_TOKENS tokens or more of held-out text from a verse start to a
    # verse end, the first (from the last chapter back) whose windows meet the margins.
    for passage in reversed(candidates):
        text = ""
        for verse in passage.split(". "):
            text += verse + ". "
            if len(tok.encode(text).ids) >= SCORE_TOKENS:
                break
        else:
            continue
        text = text.rstrip() + "\n"
        s = score(model, tok, text)
        if s is not None:
            break
        print("score passage rejected", file=sys.stderr)
    else:
        raise SystemExit("no score passage meets the margins")
    (args.out / "score.txt").write_text(text)
    (args.out / "score.json").write_text(json.dumps(s, indent=1) + "\n")
    print(json.dumps({"gaps": all_gaps, "score": s}))


if __name__ == "__main__":
    main()
