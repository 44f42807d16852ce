#!/usr/bin/env python3
"""Resume a saved conversation vs re-prefilling it (the serve issue's benchmark).

    cargo build --release && python3 scripts/bench_resume.py [--tokens 2000] [--snap DIR]

1. A fresh daemon prefills a ~N-token `\\x02PROMPT` (max_tokens 1) and saves it to .coli_kv.
2. A new daemon starts on the same state directory: it resumes the file (stderr says how
   long that took) and the same prompt then prefills 1 token.
Prints both times, the ratio, and the .coli_kv bytes per token. Only the standard library.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "colibri")
TEXT = ("The router scores each expert and keeps the best eight; the cache keeps the experts "
        "that were used recently and the hot store keeps the ones used most often. ")


def start(args, state):
    err = open(os.path.join(state, "stderr.log"), "ab")
    p = subprocess.Popen([BIN, "serve", "--state-dir", state, "--temp", "0"] + args,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    for _ in range(3):  # READY, STAT, TIERS
        p.stdout.readline()
    return p


def turn(p, prompt):
    data = prompt.encode()
    t0 = time.perf_counter()
    p.stdin.write(b"\x02PROMPT %d 1 0 1\n" % len(data) + data + b"\n")
    p.stdin.flush()
    buf = b""
    while not buf.endswith(b"\x01\x01END\x01\x01\n"):
        buf += p.stdout.read(1)
    p.stdout.readline()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--snap", default=None, help="model directory (default: the demo model)")
    a = ap.parse_args()
    state = tempfile.mkdtemp(prefix="colibri-resume-")
    args = ["--ctx", str(a.tokens * 2 + 64)] + (["--snap", a.snap] if a.snap else [])
    # About 1.1 tokens per word on the demo tokenizer: grow the text until the prefill is long enough.
    prompt = "[gMASK]<sop><|user|>" + TEXT * max(1, a.tokens // 30)

    p = start(args, state)
    prefill_s = turn(p, prompt)
    p.stdin.close()
    p.wait()
    log = open(os.path.join(state, "stderr.log")).read()
    n = int(re.findall(r"prefix \d+/(\d+) token", log)[-1])

    t0 = time.perf_counter()
    p = start(args, state)
    startup_s = time.perf_counter() - t0
    again_s = turn(p, prompt)
    p.stdin.close()
    p.wait()
    log = open(os.path.join(state, "stderr.log")).read()
    m = re.search(r"resumed conversation from disk: (\d+) tokens in ([0-9.]+)s", log)
    if not m:
        sys.exit("the second daemon did not resume:\n" + log)
    resumed, load_s = int(m.group(1)), float(m.group(2))
    size = os.path.getsize(os.path.join(state, ".coli_kv"))
    print(f"prompt: {n} tokens")
    print(f"re-prefill: {prefill_s:.3f} s ({n / prefill_s:.0f} tokens/s)")
    print(f"resume: file load {load_s:.3f} s for {resumed} tokens, then the same prompt in {again_s:.3f} s "
          f"(1 token re-run); daemon start-up {startup_s:.3f} s")
    print(f"speed-up of resume + turn over re-prefill: {prefill_s / max(load_s + again_s, 1e-9):.1f}x")
    print(f".coli_kv: {size} bytes for {resumed} records = {(size - 40) / max(resumed, 1):.0f} bytes/token")


if __name__ == "__main__":
    main()
