#!/usr/bin/env python3
"""Prepare the demo model's training text: the King James Bible from Debian's `bible-kjv`.

The text must come from a package registry so any fresh machine can rebuild it:

    apt-get install bible-kjv bible-kjv-text      # Debian; the KJV text is public domain
    ../venv/bin/python scripts/demo/prepare_text.py OUT_DIR

`bible -f` prints one verse per line, "Ge1:1 In the beginning ...". Each chapter becomes one
document: its verses joined by spaces, the verse references dropped, so the model learns
running prose and not reference numbers. Every 40th chapter (in canonical order) is held out
for perplexity, so the held-out text is spread over the whole book and not one genre of it.

Writes OUT_DIR/train.txt and OUT_DIR/heldout.txt, one document per line.
"""
import re
import subprocess
import sys
from pathlib import Path

HOLDOUT_EVERY = 40
REF = re.compile(r"^([0-9]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def chapters():
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True).stdout
    current, verses = None, []
    for line in out.splitlines():
        m = REF.match(line.strip())
        if not m:
            continue
        key = (m.group(1), m.group(2))
        if key != current and verses:
            yield " ".join(verses)
            verses = []
        current = key
        verses.append(m.group(4).strip())
    if verses:
        yield " ".join(verses)


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-data")
    out.mkdir(parents=True, exist_ok=True)
    train, held = [], []
    for i, ch in enumerate(chapters()):
        (held if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train).append(ch)
    (out / "train.txt").write_text("\n".join(train) + "\n")
    (out / "heldout.txt").write_text("\n".join(held) + "\n")
    print(f"{len(train)} train chapters ({sum(map(len, train))} chars), "
          f"{len(held)} held out ({sum(map(len, held))} chars)")


if __name__ == "__main__":
    main()
