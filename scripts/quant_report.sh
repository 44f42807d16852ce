#!/usr/bin/env bash
# Accuracy of each weight format against transformers' f32 logits, per fixture and case:
# argmax agreement (VALIDATE tf=...) and the RMS logit error relative to the spread of the
# oracle logits (LOGITS rel_rms=...). Usage: cargo build --release && scripts/quant_report.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/colibri
for model in tiny-dense-shared tiny-moe-bias; do
  dir=tests/fixtures/$model
  for case in short long long_dense; do
    extra=()
    [ "$case" = long_dense ] && extra=(--index-topk 4096)
    for spec in "16 64 f32" "8 64 int8" "4 0 int4" "4 64 int4-g64" "3 64 int3-g64" "2 64 int2"; do
      set -- $spec
      for act in f32 int8; do
        [ "$1" = 16 ] && [ "$act" = int8 ] && continue
        out=$("$bin" validate --snap "$dir" --ref "$dir/ref.json" --case "$case" "${extra[@]}" \
              --expert-bits "$1" --dense-bits "$1" --group-size "$2" --act "$act" 2>/dev/null || true)
        printf '%-18s %-10s %-9s act=%-4s %s\n' "$model" "$case" "$3" "$act" "$(echo "$out" | tr '\n' ' ')"
      done
    done
  done
done
