#!/usr/bin/env bash
# The demo model's figures for the README: held-out perplexity per weight format, hit rates
# of the expert cache against Belady's optimum on a trace of its routing, decode speed, samples.
#
#   scripts/demo/report.sh ../demo-data/heldout.txt [OUT_DIR]
#
# Needs a release build (cargo build --release). Python figures (routing entropy, MTP
# acceptance) come from scripts/demo/analyze.py.
set -euo pipefail
HELD=${1:?held-out text (scripts/demo/prepare_text.py writes heldout.txt)}
OUT=${2:-$(mktemp -d)}
B=./target/release/colibri
mkdir -p "$OUT"
echo "# held-out perplexity, ctx 256 stride 128 (the training context)"
for f in "16 64 f32" "8 64 int8" "4 0 int4-row" "4 64 int4-g64" "3 64 int3-g64" "2 64 int2"; do
    set -- $f
    line=$($B score --text "$HELD" --ctx 256 --stride 128 --expert-bits "$1" --dense-bits "$1" \
        --group-size "$2" 2>/dev/null | tail -1)
    echo "$3 $line"
done
echo "# routing trace: usage history from one text, trace from another"
$B run --raw --temp 0.7 --seed 1 --max-tokens 400 --state-dir "$OUT/state" \
    --prompt "And it came to pass" >/dev/null 2>&1
$B run --raw --temp 0.7 --seed 2 --max-tokens 400 --state-dir "$OUT/trace-state" \
    --route-trace "$OUT/trace.txt" --prompt "Then spake Jesus unto them" >/dev/null 2>"$OUT/run.err"
for cap in 4 8; do
    python3 scripts/belady.py "$OUT/trace.txt" --cap "$cap"
    python3 scripts/belady.py "$OUT/trace.txt" --cap "$cap" --pins 6 --usage "$OUT/state/.coli_usage"
done
echo "# decode speed (greedy, 256 tokens)"
$B run --raw --temp 0 --max-tokens 256 --prompt "In the beginning" --state-dir "$OUT/speed" \
    2>&1 >/dev/null | grep -o 'decode [0-9.]* tok/s'
echo "# samples"
echo "temp 0: $($B run --raw --temp 0 --max-tokens 60 --prompt 'And God said' 2>/dev/null)"
for s in 1 2 3; do
    echo "temp 0.7 seed $s: $($B run --raw --temp 0.7 --seed $s --max-tokens 60 --prompt 'And God said' 2>/dev/null)"
done
echo "chat: $($B run --temp 0 --max-tokens 40 --prompt 'Who made the heaven and the earth?' 2>/dev/null)"
