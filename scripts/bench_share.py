#!/usr/bin/env python3
"""Time to first token of a request that shares a long prefix with another session, with the
prefix adopted (`--kv-share 1`, the default) against prefilled (`--kv-share 0`).

    scripts/bench_share.py --snap /work/medium [--prefix 1024] [--colibri target/release/colibri]

Starts `colibri serve --mux` twice (a fresh state directory each time). Slot 0 answers a prompt
of `--prefix` random token ids plus a tail; then slot 1 gets the same prefix with another tail,
and the seconds from its SUBMIT to its first DATA are its time to first token. Prompts are sent
as `ids=1` payloads, so any model works whatever its tokenizer. Standard library only.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time


def read_frame(out):
    """One reply frame: (kind, id, payload-or-line)."""
    line = out.readline()
    if not line:
        raise SystemExit("daemon closed stdout")
    words = line.split()
    if words and words[0] == b"DATA":
        n = int(words[2])
        data = out.read(n)
        out.read(1)
        return "DATA", int(words[1]), data
    if words and words[0] in (b"ACCEPT", b"DONE", b"ERROR"):
        return words[0].decode(), int(words[1]), line
    return "OTHER", 0, line


def submit(proc, rid, slot, ids, max_tokens):
    payload = " ".join(map(str, ids)).encode()
    head = f"SUBMIT {rid} {slot} {len(payload)} {max_tokens} 0 1 0 ids=1\n".encode()
    proc.stdin.write(head + payload + b"\n")
    proc.stdin.flush()


def until_done(proc, rid):
    """Seconds to the first DATA of `rid`, reading until its DONE."""
    t0 = time.monotonic()
    first = None
    while True:
        kind, i, _ = read_frame(proc.stdout)
        if i != rid:
            continue
        if kind == "DATA" and first is None:
            first = time.monotonic() - t0
        if kind in ("DONE", "ERROR"):
            return first if first is not None else float("nan"), kind


def run(colibri, snap, share, prefix, seed):
    rng = random.Random(seed)
    vocab = 380  # below every eos id (and vocabulary size) of the synthetic and fixture models
    common = [rng.randrange(vocab) for _ in range(prefix)]
    tail_a = [rng.randrange(vocab) for _ in range(8)]
    tail_b = [rng.randrange(vocab) for _ in range(8)]
    state = tempfile.mkdtemp(prefix="colibri-share-")
    cmd = [colibri, "serve", "--mux", "--snap", snap, "--kv-slots", "2",
           "--ctx", str(prefix + 64), "--kv-share", "1" if share else "0",
           "--state-dir", state]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(os.path.join(state, "stderr.log"), "wb"))
    for _ in range(5):  # READY STAT HWINFO TIERS EMAP
        read_frame(proc.stdout)
    submit(proc, 1, 0, common + tail_a, 4)
    ttft_a, _ = until_done(proc, 1)
    submit(proc, 2, 1, common + tail_b, 4)
    ttft_b, kind = until_done(proc, 2)
    proc.stdin.close()
    proc.wait()
    err = open(os.path.join(state, "stderr.log"), "rb").read().decode(errors="replace")
    adopted = [l for l in err.splitlines() if "cross-slot adopt" in l]
    return ttft_a, ttft_b, kind, adopted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snap", required=True)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--colibri", default="target/release/colibri")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rows = []
    for share in (True, False):
        first, second, kind, adopted = run(a.colibri, a.snap, share, a.prefix, a.seed)
        rows.append((share, first, second))
        print(f"kv-share {int(share)}: first request TTFT {first:.3f}s, second (shared "
              f"{a.prefix}-token prefix) TTFT {second:.3f}s [{kind}] "
              f"{adopted[0] if adopted else 'no adoption'}")
    (_, _, adopted_s), (_, _, prefilled_s) = rows
    print(f"SHARE prefix={a.prefix} ttft_adopted_s={adopted_s:.3f} "
          f"ttft_prefilled_s={prefilled_s:.3f} speedup={prefilled_s / max(adopted_s, 1e-9):.1f}")


if __name__ == "__main__":
    sys.exit(main())
