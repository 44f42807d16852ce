#!/usr/bin/env python3
"""Measures the prefix-cache side channel of `colibri api` between two clients.

Each round a new victim ("alice-<round>") tells the server her password, one of ten words
(the next one each round, so the attacker's own history cannot favour the right one by
chance); the attacker probes "The password is <w>" for each word w and guesses the word
whose answer came back with the most `cached_tokens`, or the fastest. Against a server that shares prefixes across clients the
right digit stands out; against one that keeps them apart, guesses are at chance (10%).

    colibri api --listen 127.0.0.1:8080 &
    scripts/probe_prefix_leak.py --url http://127.0.0.1:8080 --rounds 20

`--attacker-user` (default "mallory") is the attacker's `user`; `--attacker-user ''` sends none
(on a key-less server the attacker is then the machine's owner, as alice is not). (The control, where
the channel shows, is the end-to-end test `prefix_reuse_never_crosses_clients_and_survives_a_
restart`: there the victim's own probes single out her password.)
Prints, for both channels, how often the guess was right and the bits per request that
accuracy is worth (the mutual information of a 10-way guess right with probability p).
Only the standard library is used.
"""

import argparse
import json
import math
import time
import urllib.request

WORDS = ["apple", "river", "swordfish", "candle", "mountain",
         "silver", "garden", "thunder", "lantern", "harvest"]



def post(url, body, key):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), headers
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.load(r)
    return out, time.perf_counter() - t0


def chat(text, user):
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
        "temperature": 0,
    }
    if user:
        body["user"] = user
    return body


def bits(p, n=10):
    """Information in a guess among n right with probability p (errors spread evenly)."""
    if p <= 1.0 / n:
        return 0.0
    h = -p * math.log2(p)
    if p < 1:
        q = (1 - p) / (n - 1)
        h -= (n - 1) * q * math.log2(q)
    return math.log2(n) - h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--key", default=None, help="the API key both clients use")
    ap.add_argument("--attacker-user", default="mallory")
    a = ap.parse_args()
    by_cache = by_time = 0
    cached_seen = set()
    for r in range(a.rounds):
        right = WORDS[r % len(WORDS)]
        victim = f"alice-{r}"
        secret = f"The password is {right}"
        post(a.url, chat(secret, victim), a.key)
        post(a.url, chat(secret, victim), a.key)
        results = {}
        for d in WORDS:
            out, dt = post(a.url, chat(f"The password is {d}", a.attacker_user or None), a.key)
            c = out["usage"]["prompt_tokens_details"]["cached_tokens"]
            results[d] = (c, dt)
            cached_seen.add(c)
        best_c = max(results, key=lambda d: (results[d][0], -results[d][1]))
        best_t = min(results, key=lambda d: results[d][1])
        by_cache += best_c == right and len({c for c, _ in results.values()}) > 1
        by_time += best_t == right
    pc, pt = by_cache / a.rounds, by_time / a.rounds
    print(f"rounds {a.rounds}, {len(WORDS)} probes each; cached_tokens values seen: {sorted(cached_seen)}")
    print(f"cached_tokens channel: right {by_cache}/{a.rounds} ({pc:.0%}), {bits(pc):.3f} bits per round of 10 requests")
    print(f"latency channel:       right {by_time}/{a.rounds} ({pt:.0%}, chance 10%), {bits(pt):.3f} bits per round of 10 requests")


if __name__ == "__main__":
    main()
