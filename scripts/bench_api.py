#!/usr/bin/env python3
"""HTTP overhead of `colibri api` against `colibri serve --mux` on the same load.

For each concurrency N (default 1,4,8): N greedy requests of TOKENS tokens each, different
short prompts, started together; aggregate tok/s = all generated tokens over the wall time from
the first request sent to the last one finished (token counts from `usage` and DONE, so a
synthetic model whose tokens decode to no text is measured too). Then the time to first token
of a chat re-sending a ~2k-token history with one new turn (the history's KV reused: a
`max_tokens: 1` request's whole time), and the servers' peak RSS (VmHWM). Standard library
only.

usage: scripts/bench_api.py --snap /work/medium [--tokens 32] [--streams 1,4,8]
"""

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "colibri")


def prompt(i):
    return f"Request {i}: tell the story of the {i}th day, in plain words."


def peak_rss_gb(pid):
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmHWM:\s+(\d+) kB", f.read())
    return int(m.group(1)) / 1e6 if m else 0.0


def start_api(args, state):
    p = subprocess.Popen(
        [BIN, "api", "--snap", args.snap, "--listen", "127.0.0.1:0", "--kv-slots", "8",
         "--state-dir", state, "--kv-save", "0", "--ngen", "4096", "--ctx", "4096"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    addr = None
    for line in p.stderr:
        if line.startswith("[api] listening on http://"):
            addr = line.strip().rsplit("/", 1)[1]
        if line.startswith("[api] ready"):
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    host, port = addr.rsplit(":", 1)
    return p, host, int(port)


def stream_chat(host, port, body):
    """(completion tokens, seconds) of one streamed chat."""
    c = http.client.HTTPConnection(host, port, timeout=3600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    n = 0
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data: {"):
            v = json.loads(line[6:])
            if v.get("usage"):
                n = v["usage"]["completion_tokens"]
    c.close()
    return n


def http_round(host, port, n, tokens):
    res = [0] * n

    def one(i):
        body = {"messages": [{"role": "user", "content": prompt(i)}], "max_tokens": tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        res[i] = stream_chat(host, port, body)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(res) / (time.time() - t0)


def mux_round(args, n, tokens, template):
    """The same prompts (templated as the API renders them) through SUBMIT frames."""
    p = subprocess.Popen(
        [BIN, "serve", "--mux", "--snap", args.snap, "--kv-slots", "8", "--kv-save", "0",
         "--ngen", "4096", "--ctx", "4096", "--state-dir", args.state + "-mux"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout
    while b"READY" not in out.readline():
        pass
    rates = {}
    for rnd in ["warm"] + list(n):
        k = 1 if rnd == "warm" else rnd
        t0 = time.time()
        for i in range(k):
            payload = template(prompt(i)).encode()
            p.stdin.write(b"SUBMIT %d %d %d %d 0 1\n" % (i + 1, i, len(payload), tokens) + payload + b"\n")
        p.stdin.flush()
        done = total = 0
        while done < k:
            line = out.readline()
            if line.startswith(b"DATA "):
                out.read(int(line.split()[2]) + 1)
            elif line.startswith(b"DONE "):
                done += 1
                total += int(line.split()[3])
        if rnd != "warm":
            rates[rnd] = total / (time.time() - t0)
    peak = peak_rss_gb(p.pid)
    p.stdin.close()
    p.wait()
    return rates, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snap", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--state", default="/tmp/colibri-bench-api")
    args = ap.parse_args()
    ns = [int(x) for x in args.streams.split(",")]
    os.makedirs(args.state, exist_ok=True)
    os.makedirs(args.state + "-mux", exist_ok=True)
    p, host, port = start_api(args, args.state)
    # Warm the experts once, so both fronts see the same resident set.
    http_round(host, port, 1, args.tokens)
    api = {n: http_round(host, port, n, args.tokens) for n in ns}
    # Peak RSS after the same load mux gets (the long history below reads every expert).
    api_streams_peak = peak_rss_gb(p.pid)
    # Time to first token of a ~2k-token history re-sent with a new turn.
    words = " ".join(f"word{i % 97}" for i in range(1400))
    hist = [{"role": "user", "content": words}]
    c = http.client.HTTPConnection(host, port, timeout=3600)
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"messages": hist, "max_tokens": 8, "temperature": 0}), {"Content-Type": "application/json"})
    first = json.loads(c.getresponse().read())
    c.close()
    hist += [first["choices"][0]["message"], {"role": "user", "content": "And then?"}]
    t = time.time()
    c = http.client.HTTPConnection(host, port, timeout=3600)
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"messages": hist, "max_tokens": 1, "temperature": 0}), {"Content-Type": "application/json"})
    again = json.loads(c.getresponse().read())
    c.close()
    ttft = time.time() - t
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    api_peak = peak_rss_gb(p.pid)
    p.terminate()
    p.wait()
    # The API's own rendering of a one-message chat, for mux's raw prompts.
    family_turn = lambda text: f"[gMASK]<sop><|user|>{text}<|assistant|><think></think>"
    mux, mux_peak = mux_round(args, ns, args.tokens, family_turn)
    print(f"history of {again['usage']['prompt_tokens']} tokens re-sent ({cached} cached): time to first token {ttft:.2f} s")
    for n in ns:
        print(f"{n} streams: HTTP {api[n]:.1f} tok/s, mux {mux[n]:.1f} tok/s, ratio {api[n] / mux[n]:.3f}")
    print(f"peak RSS: api {api_streams_peak:.2f} GB after the streams (mux {mux_peak:.2f} GB after the same), "
          f"{api_peak:.2f} GB after the long history too")


if __name__ == "__main__":
    sys.exit(main())
