#!/usr/bin/env python3
"""Reference logits of the demo model's MTP head, for the engine's MTP test.

    ../venv/bin/python scripts/demo/mtp_reference.py

Loads daemon/demo at float32 with the MTP block of train.py (the module the head was trained
as, loaded the way analyze.py loads it), runs the main model teacher-forced over each case's
`full_ids` of tests/fixtures/demo-trained/ref.json, and feeds the head at every position t the
main model's last hidden state h[t] (before the final norm) and the token t+1. Writes
`mtp_logits_<case>.f32` ((len(full_ids) - 1) x vocab, little-endian f32, row-major) and
`mtp_ref.json` (ids, rows, the head's top-1 per row and its smallest top-1/top-2 gap).
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import analyze as A  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "demo-trained"


def main():
    torch.manual_seed(0)
    model, mtp = A.load(ROOT / "daemon" / "demo")
    ref = json.loads((FIX / "ref.json").read_text())
    out = {}
    for case in ("short",):
        ids = ref[case]["full_ids"]
        with torch.no_grad():
            _, hidden = A.hidden_and_logits(model, ids)
            logits = A.mtp_logits(model, mtp, ids, hidden).float().numpy()
        name = f"mtp_logits_{case}.f32"
        logits.astype("<f4").tofile(FIX / name)
        top2 = np.sort(logits, axis=1)[:, -2:]
        out[case] = {"full_ids": ids, "rows": int(logits.shape[0]), "logits_file": name,
                     "top1": [int(v) for v in logits.argmax(axis=1)],
                     "min_gap": float((top2[:, 1] - top2[:, 0]).min())}
    (FIX / "mtp_ref.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
