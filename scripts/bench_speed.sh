#!/usr/bin/env bash
# The speed figures of one run, each beside the limit measured in the same process:
# Warm runs time the replay several times (--rounds), each after a probe round, and put each
# side's best beside the other: this machine's bandwidth drifts by a quarter and more.
#   1. warm decode on the medium model (24 layers, 1 dense, hidden 2048, 16 heads, 128 int4-row
#      experts of 2.37 MB, vocab 16384) and at GLM-5 attention shapes: tok/s and the
#      whole-token ratio (weight bytes per token x tok/s / the memory-read probe);
#   2. prefill of 64 and 1024 positions with the experts resident: pos/s and the ratio of the
#      weight products' multiply-adds per second to the 8-bit compute probe;
#   3. decode after 1k, 4k, 16k and 32k positions of context with GLM-5 attention (DSA top-k
#      2048): the CONTEXT lines, cost relative to 1k;
#   4. peak RSS of the warm medium run without the probes (RssAnon + RssFile sampled every
#      100 ms);
#   5. a fresh process with the page cache holding the model: 64-position prefill pos/s and
#      first-use loads against the page-cache probe, with pread and with --mmap (zero-copy).
#
# env: MEDIUM (dir, /work/medium), GLM5 (dir, /work/glm5attn), BIN (colibri), DENSE_BITS (8).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MEDIUM=${MEDIUM:-/work/medium}
GLM5=${GLM5:-/work/glm5attn}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/colibri}
DB=${DENSE_BITS:-8}
SYN=$TARGET/release/examples/make_synthetic
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release --workspace)
[ -x "$SYN" ] || (cd "$ROOT" && cargo build --release --workspace --example make_synthetic)
[ -f "$MEDIUM/config.json" ] || "$SYN" --out "$MEDIUM" --layers 24 --dense-layers 1 --heads 16 \
  --inter 768 --expert-format i4row --vocab 16384
[ -f "$GLM5/config.json" ] || "$SYN" --out "$GLM5" --attn glm5 --layers 8 --dense-layers 1 \
  --experts 32 --inter 768 --expert-format i4row --max-pos 40000

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# References: random token ids (bench replays them; what they say does not matter).
python3 - "$TMP" <<'PY'
import json, random, sys
random.seed(1)
ids = [random.randrange(100, 4000) for _ in range(1024 + 33)]
json.dump({"prompt_ids": ids[:65], "full_ids": ids[:97]}, open(sys.argv[1] + "/short.json", "w"))
json.dump({"prompt_ids": ids[:1025], "full_ids": ids[:1025 + 8]}, open(sys.argv[1] + "/long.json", "w"))
PY

peak_rss() { # runs "$@", prints its peak RSS in MB beside its own output
  "$@" > "$TMP/out" 2>&1 &
  local pid=$! max=0
  while kill -0 $pid 2>/dev/null; do
    local kb
    kb=$(awk '/^Rss(Anon|File):/{s+=$2} END{print s+0}' /proc/$pid/status 2>/dev/null || echo 0)
    [ "$kb" -gt "$max" ] && max=$kb
    sleep 0.1
  done
  wait $pid
  grep -E "ratio|BENCH|CONTEXT|tokens/forward" "$TMP/out" || true
  echo "peak RSS $((max / 1024)) MB"
}

echo "== 1+2. medium model, warm, 64-position prefill"
"$BIN" bench --snap "$MEDIUM" --ref "$TMP/short.json" --dense-bits "$DB" --warmup --rounds 5 2>&1 \
  | grep -E "ratio|BENCH"
echo "== 4. medium model, warm, without the probes (the memory probe's buffer is 1 GiB)"
peak_rss "$BIN" bench --snap "$MEDIUM" --ref "$TMP/short.json" --dense-bits "$DB" --warmup \
  --no-membw --no-disk-probe
echo "== 2. medium model, warm, 1024-position prefill"
"$BIN" bench --snap "$MEDIUM" --ref "$TMP/long.json" --dense-bits "$DB" --warmup --rounds 3 2>&1 \
  | grep -E "prefill positions|ratio|BENCH"
echo "== 1+3. GLM-5 attention shapes: warm decode, then decode after long contexts"
"$BIN" bench --snap "$GLM5" --ref "$TMP/short.json" --dense-bits "$DB" --warmup --rounds 5 \
  --context 1024,4096,16384,32768 --context-steps 8 2>&1 | grep -E "ratio|BENCH|CONTEXT"
echo "== 5. medium model, fresh process, page cache warm: pread, then --mmap (zero-copy)"
cat "$MEDIUM"/*.safetensors > /dev/null
for mode in "--mmap 0" "--mmap"; do
  echo "-- $mode"
  # shellcheck disable=SC2086
  "$BIN" bench --snap "$MEDIUM" --ref "$TMP/short.json" --dense-bits "$DB" --no-membw $mode 2>&1 \
    | grep -E "disk:|BENCH" | sed 's/ | read service.*first-use/ | first-use/'
done
