#!/bin/bash
# Expert-cache policies against Belady's optimum on route traces of the medium model and the
# bundled demo model (the README's table): records the traces, then replays them through the
# store's own cache with examples/cache_sim at 4, 8, 16 (medium) and 4, 8, 12 (demo) slots.
# usage: MEDIUM=/path/to/medium scripts/bench_policy.sh [OUT_DIR]   (after cargo build
# --release --workspace --all-targets; without MEDIUM only the demo traces are taken)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/colibri
SIM=$ROOT/target/release/examples/cache_sim
OUT=${1:-/tmp/colibri-policy}
mkdir -p "$OUT/state"
common=(--state-dir "$OUT/state" --usage-save 0 --autopin 0 --cache 16)
if [ -n "${MEDIUM:-}" ]; then
  $B run --snap "$MEDIUM" "${common[@]}" --max-tokens 600 --seed 7 \
    --route-trace "$OUT/medium.trace" \
    --prompt "Write a long story about a lighthouse keeper and the sea." > /dev/null 2> "$OUT/medium.err"
  echo "== medium model, 600 tokens"
  $SIM "$OUT/medium.trace" --caps 4,8,16
fi
for i in 1 2 3; do
  $B run "${common[@]}" --max-tokens 500 --seed $i --route-trace "$OUT/demo$i.trace" \
    --prompt "Tell me a story number $i about a cat, a dog and a bird." > /dev/null 2> "$OUT/demo$i.err"
done
echo "== demo model, 3 x 500 tokens"
$SIM "$OUT"/demo1.trace "$OUT"/demo2.trace "$OUT"/demo3.trace --caps 4,8,12
