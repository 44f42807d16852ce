#!/usr/bin/env python3
"""Plot train.py's log.jsonl: the losses per step, held-out LM loss at each evaluation.

    ../venv/bin/python scripts/demo/plot_loss.py ../demo-train/log.jsonl scripts/demo/loss.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    step = [r["step"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(step, [r["lm"] for r in rows], label="LM (train batch)")
    a.plot(step, [r["mtp"] for r in rows], label="MTP, token t+2 (train batch)")
    held = [r for r in rows if "held_lm" in r]
    a.plot([r["step"] for r in held], [r["held_lm"] for r in held], "o-", label="LM (held out)")
    a.plot([r["step"] for r in held], [r["held_mtp"] for r in held], "s-", label="MTP (held out)")
    a.set_xlabel("step (16 x 256 tokens)")
    a.set_ylabel("cross-entropy, nats/token")
    a.set_title("demo model: KJV text")
    a.grid(alpha=0.3)
    a.legend()
    b.plot(step, [r["kl"] for r in rows], color="tab:red")
    b.set_xlabel("step")
    b.set_ylabel("KL(dense attention || indexer)")
    b.set_title("DSA indexer loss (first 60 steps dense attention)")
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=80)


if __name__ == "__main__":
    main()
