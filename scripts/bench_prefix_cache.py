#!/usr/bin/env python3
"""Time to first token with the prefix cache (`colibri api --prefix-cache-gb`).

Starts `colibri api` on a model with a fresh state folder and `--kv-save 0` (so after the
restart nothing but the prefix cache can supply the prefix), then, streaming, measures from
the client the time to the first content token of:

  1. a first conversation with a long system prompt (a full prefill),
  2. a second one with the same system prompt and another question (the prompt adopts the
     first one's rows from its slot; the shared prefix is written to the prefix cache at its
     end),
  3. after a kill -9 and a restart, a third one with the same system prompt (adopted from
     the prefix cache on disk),

and, with --baseline, 4. the same third conversation on a server with `--prefix-cache-gb 0`
after a restart (a full prefill again).

Only the standard library. Example (the medium model of the speed issues):

  scripts/bench_prefix_cache.py --colibri target/release/colibri --snap /work/medium \
      --system-words 9000 --ctx 12288
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


def start(args, state, extra):
    cmd = [args.colibri, "api", "--snap", args.snap, "--listen", "127.0.0.1:0",
           "--state-dir", state, "--kv-save", "0", "--kv-slots", "2",
           "--ctx", str(args.ctx), "--request-timeout", "86400"] + extra
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    addr = None
    log = []
    while True:
        line = p.stderr.readline()
        if not line:
            p.kill()
            sys.exit("colibri api exited before ready:\n" + "".join(log))
        log.append(line)
        if line.startswith("[api] listening on http://"):
            addr = line.strip().split("http://", 1)[1]
        if line.startswith("[api] ready"):
            break
    # Keep draining stderr (the prefix cache's lines are printed as they happen).
    def drain():
        for line in p.stderr:
            log.append(line)
            if args.verbose:
                sys.stderr.write(line)
    threading.Thread(target=drain, daemon=True).start()
    host, port = addr.rsplit(":", 1)
    return p, host, int(port), log


def ttft(host, port, system, question, max_tokens):
    body = json.dumps({
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": question}],
        "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    })
    c = http.client.HTTPConnection(host, port, timeout=3600)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:500]!r}")
    first = None
    usage = None
    text = ""
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                if first is None:
                    first = time.monotonic() - t0
                text += piece
    total = time.monotonic() - t0
    c.close()
    # No content (nothing printable sampled): the end of a one-token request is its first token.
    return first if first is not None else total, total, usage, text


def show(row):
    name, f, t, u = row
    u = u or {}
    cached = u.get("prompt_tokens_details", {}).get("cached_tokens", "-")
    print(f"{name:50} {f:8.2f} {t:8.2f} {u.get('prompt_tokens', '-'):>7} {cached:>7}",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--colibri", default="target/release/colibri")
    ap.add_argument("--snap", required=True, help="the model folder")
    ap.add_argument("--system-words", type=int, default=9000,
                    help="length of the system prompt in words (about one token each)")
    ap.add_argument("--ctx", type=int, default=12288)
    # One token: the request's end is its first token, whatever it decodes to (a synthetic
    # model's padded vocabulary decodes to nothing, so no content chunk may ever come).
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--extra", default="", help="more colibri api flags, space-separated")
    ap.add_argument("--baseline", action="store_true",
                    help="also time the third conversation with --prefix-cache-gb 0")
    ap.add_argument("--verbose", action="store_true", help="echo the server's stderr")
    args = ap.parse_args()

    words = "the tool reads a record from the archive and returns its fields".split()
    system = " ".join(words[i % len(words)] + (f" {i}" if i % 50 == 0 else "")
                      for i in range(args.system_words))
    extra = args.extra.split()
    state = tempfile.mkdtemp(prefix="colibri-prefix-bench-")
    rows = []
    written, adopted = [], []
    p = None

    def stop():
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()

    try:
        p, host, port, log = start(args, state, extra)
        for name, q in [("first conversation (prefill)", "What does record 3 hold?"),
                        ("second conversation, same system prompt",
                         "Which record holds the fields?")]:
            f, t, u, _ = ttft(host, port, system, q, args.max_tokens)
            rows.append((name, f, t, u))
            show(rows[-1])
        stop()
        written = [l for l in log if "prefix cache" in l]
        p, host, port, log = start(args, state, extra)
        f, t, u, _ = ttft(host, port, system, "Name a record.", args.max_tokens)
        rows.append(("first conversation after a kill -9 and restart", f, t, u))
        show(rows[-1])
        stop()
        adopted = [l for l in log if "prefix cache" in l]
        if args.baseline:
            p, host, port, log = start(args, state, extra + ["--prefix-cache-gb", "0"])
            f, t, u, _ = ttft(host, port, system, "Name a record.", args.max_tokens)
            rows.append(("the same after a restart, --prefix-cache-gb 0", f, t, u))
            show(rows[-1])
            stop()
    finally:
        stop()
        shutil.rmtree(state, ignore_errors=True)
    print(f"{'':50} {'TTFT s':>8} {'total s':>8} {'prompt':>7} {'cached':>7}")
    for r in rows:
        show(r)
    for l in written + adopted:
        print(l.rstrip())


if __name__ == "__main__":
    main()
