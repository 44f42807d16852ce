#!/usr/bin/env python3
"""Hit rates of a per-layer expert cache replayed over a `--route-trace` file, beside Belady's
optimal (offline MIN with bypass) at the same capacity.

Belady is computed per request (a batch's experts one after another, bypass allowed); the
engine settles a whole batch against the cache of its start, which can hold a batch's experts a
little longer, so `sim` (the engine's policy replayed) must equal the engine's own figure.

The trace has one line per routed row: `<call> <row> <layer> <id>:<gate> ...`. The engine
fetches each expert once per (forward call, layer), in ascending order, so the request stream
of a layer is, call after call, the sorted union of the experts its rows picked. A request is a
hit when the expert is pinned or cached.

usage: belady.py TRACE --cap C [--pins N --usage FILE] [--engine-hit PCT]
  --cap C        LRU experts per layer
  --pins N       also pin the N most used experts of FILE (a .coli_usage), as the engine does;
                 OPT then gets C + (pins of that layer) slots per layer
"""

import argparse
import collections


def requests(path):
    """{layer: [expert, ...]} in the engine's fetch order."""
    batches = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) < 4:
                continue
            call, layer = int(p[0]), int(p[2])
            ids = batches.setdefault((call, layer), set())
            for t in p[3:]:
                ids.add(int(t.split(":")[0]))
    per_layer = collections.defaultdict(list)
    for (_, layer), ids in batches.items():
        per_layer[layer].append(sorted(ids))
    return per_layer


def lru_hits(batches, cap, pinned):
    """The engine's LRU: a batch's hits and misses are settled against the cache as it was at
    the batch's start (recency stamps in request order), then the misses are inserted and the
    oldest stamps evicted down to `cap`."""
    stamp = {}
    clock = 0
    hits = 0
    for batch in batches:
        misses = []
        for e in batch:
            clock += 1
            if e in pinned:
                hits += 1
            elif e in stamp:
                hits += 1
                stamp[e] = clock
            else:
                misses.append((e, clock))
        for e, t in misses:
            stamp[e] = t
        while len(stamp) > cap:
            del stamp[min(stamp, key=stamp.get)]
    return hits


def opt_hits(seq, cap):
    """Belady MIN with bypass: on a miss with a full cache, drop whichever of the cached
    experts and the incoming one is used again farthest in the future."""
    inf = len(seq) + 1
    nxt = [inf] * len(seq)
    last = {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = last.get(seq[i], inf)
        last[seq[i]] = i
    cache = {}  # expert -> next use
    hits = 0
    for i, e in enumerate(seq):
        if e in cache:
            hits += 1
            cache[e] = nxt[i]
            continue
        if cap <= 0:
            continue
        if len(cache) < cap:
            cache[e] = nxt[i]
            continue
        victim = max(cache, key=lambda k: cache[k])
        if cache[victim] > nxt[i]:
            del cache[victim]
            cache[e] = nxt[i]
    return hits


def pins_from_usage(path, n):
    recs = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 3 and int(p[0]) >= 0:
                recs.append((-int(p[2]), int(p[0]), int(p[1])))
    recs.sort()
    out = collections.defaultdict(set)
    for _, layer, e in recs[:n]:
        out[layer].add(e)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--cap", type=int, required=True)
    ap.add_argument("--pins", type=int, default=0)
    ap.add_argument("--usage")
    ap.add_argument("--engine-hit", type=float)
    a = ap.parse_args()
    per_layer = requests(a.trace)
    pins = pins_from_usage(a.usage, a.pins) if a.pins and a.usage else {}
    total = sum(sum(len(b) for b in s) for s in per_layer.values())
    lru = sum(lru_hits(s, a.cap, pins.get(l, set())) for l, s in per_layer.items())
    opt = sum(
        opt_hits([e for b in s for e in b], a.cap + len(pins.get(l, ())))
        for l, s in per_layer.items()
    )
    npin = sum(len(v) for v in pins.values())
    line = (
        f"BELADY requests={total} cap={a.cap} pins={npin} "
        f"sim_hit_pct={100.0 * lru / max(total, 1):.1f} opt_hit_pct={100.0 * opt / max(total, 1):.1f}"
    )
    if a.engine_hit is not None:
        line += f" engine_hit_pct={a.engine_hit:.1f} engine_over_opt={a.engine_hit / max(100.0 * opt / max(total, 1), 1e-9):.3f}"
    print(line)


if __name__ == "__main__":
    main()
