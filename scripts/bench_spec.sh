#!/usr/bin/env bash
# Speculative decoding and grammar figures of one run (issue 18):
#   1. the trained demo model (daemon/demo, the model built into the binary): its own greedy
#      continuation of a prompt replayed with drafts off and on in turn (`bench --gen N
#      --draft-ab PAIRS`), warm (every expert resident) and cold (2 experts per layer in the
#      cache, read with O_DIRECT from daemon/demo/model.safetensors);
#   2. the same on the medium model with an MTP head (random weights: `make_synthetic ... --mtp`),
#      warm and cold (4 experts per layer, O_DIRECT);
#   3. the grammar mask's cost per token (`cargo bench --bench grammar`) and a JSON-Schema
#      constrained `run` on the demo model (its `[grammar]` line).
# Each case prints the `tokens/forward` line of the first replay, one `SPEC_AB` line per pair
# (tok/s off, on, their ratio, from the same process) and `SPEC_AB_SUMMARY` (means, median
# ratio, acceptance per source over the "on" replays, the measured costs).
#
# env: MEDIUM (dir, /work/models/medium-mtp; made when missing, ~8.6 GB), BIN (colibri),
#      DRAFT (3), DEMO_PAIRS (24), MEDIUM_PAIRS (4), COLD_PAIRS (3), DENSE_BITS (8, medium).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MEDIUM=${MEDIUM:-/work/models/medium-mtp}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/colibri}
SYN=$TARGET/release/examples/make_synthetic
DRAFT=${DRAFT:-3}
DEMO_PAIRS=${DEMO_PAIRS:-24}
MEDIUM_PAIRS=${MEDIUM_PAIRS:-4}
COLD_PAIRS=${COLD_PAIRS:-3}
DB=${DENSE_BITS:-8}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p colibri --bin colibri)
[ -x "$SYN" ] || (cd "$ROOT" && cargo build --release -p colibri --example make_synthetic)
[ -f "$MEDIUM/config.json" ] || "$SYN" --out "$MEDIUM" --layers 24 --dense-layers 1 --heads 16 \
  --inter 768 --expert-format i4row --vocab 16384 --mtp

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$ROOT" "$TMP" <<'PY'
import json, random, sys
root, tmp = sys.argv[1], sys.argv[2]
# The demo: the long prompt of its oracle fixture (bench --gen replaces the continuation).
r = json.load(open(root + "/tests/fixtures/demo-trained/ref.json"))["long"]
json.dump({"prompt_ids": r["prompt_ids"], "full_ids": r["prompt_ids"]}, open(tmp + "/demo.json", "w"))
# The medium model: random ids (what they say does not matter).
random.seed(1)
ids = [random.randrange(100, 4000) for _ in range(48)]
json.dump({"prompt_ids": ids, "full_ids": ids}, open(tmp + "/medium.json", "w"))
json.dump({"type": "object", "properties": {"name": {"type": "string"},
           "count": {"type": "integer"}, "ok": {"type": "boolean"}},
           "required": ["name", "count", "ok"]}, open(tmp + "/schema.json", "w"))
PY

show() { grep -E "tokens/forward|SPEC_AB|BENCH|\[RAM\]" || true; }
bench() { "$BIN" bench --no-membw --no-disk-probe --draft "$DRAFT" "$@" 2>&1 | show; }

echo "== 1a. demo model, warm: its greedy continuation (300 tokens), drafts off/on x $DEMO_PAIRS"
bench --ref "$TMP/demo.json" --gen 300 --warmup --draft-ab "$DEMO_PAIRS"
echo "== 1b. demo model, cold: --cache 2 --direct (experts read from daemon/demo on each miss)"
bench --snap "$ROOT/daemon/demo" --ref "$TMP/demo.json" --gen 300 --cache 2 --direct \
  --draft-ab "$DEMO_PAIRS"
echo "== 2a. medium model + MTP head, warm: greedy continuation (64 tokens), off/on x $MEDIUM_PAIRS"
bench --snap "$MEDIUM" --dense-bits "$DB" --ref "$TMP/medium.json" --gen 64 --warmup \
  --draft-ab "$MEDIUM_PAIRS"
echo "== 2b. medium model + MTP head, cold: --cache 4 --direct (24 tokens), off/on x $COLD_PAIRS"
bench --snap "$MEDIUM" --dense-bits "$DB" --ref "$TMP/medium.json" --gen 24 --cache 4 --direct \
  --draft-ab "$COLD_PAIRS"
echo "== 3a. grammar mask per token (demo vocabulary and a 150k one)"
(cd "$ROOT" && cargo bench -q -p colibri --bench grammar 2>&1) | grep -vE "^\s*$|Compiling|Finished|Running" || true
echo "== 3b. JSON-Schema constrained run on the demo model, drafts $DRAFT (forced spans)"
"$BIN" run --json-schema "$TMP/schema.json" --draft "$DRAFT" --max-tokens 64 \
  --prompt "Give the record as JSON." 2>&1 | grep -E "\[grammar\]|tokens/forward|tok/s" || true
