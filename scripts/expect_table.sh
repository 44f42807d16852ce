#!/usr/bin/env bash
# Issue 50: the README's "what to expect on your machine" table, from `colibri plan` over the
# published configs in tests/fixtures/configs at several RAM sizes and two disks, all with the
# same probes (this machine's, measured once at the start; pass PROBES="--disk-gbs X ..." to
# reuse earlier ones). The rows `colibri plan --measure` checked are named in the README.
#
#   scripts/expect_table.sh > table.md
#
# env: BIN (target/release/colibri), RAMS ("16 32 64"), FAST_DISK (3.5: a PCIe 4 NVMe's GB/s,
# the second disk column), ROWS (config:bits pairs), PROBES (skip the probe run),
# EXPERT_DECODE ("2:X 3:Y 4:Z": skip the expert decode probes, GB/s by expert bits).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/colibri}
RAMS=${RAMS:-16 32 64}
FAST_DISK=${FAST_DISK:-3.5}
ROWS=${ROWS:-qwen3-30b-a3b:4 gpt-oss-120b:4 glm-4.5-air:3 glm-4.5-air:4 qwen3-235b-a22b:3 minimax-m2.5:3 glm-4.7:3 deepseek-v3:2 kimi-k2-instruct:2}
CFG=$ROOT/tests/fixtures/configs
if [ -z "${PROBES:-}" ]; then
  # One probe run; its figures go to every row so the rows differ by model, RAM and disk only.
  json=$("$BIN" plan --config "$CFG/qwen3-30b-a3b.json" --expert-bits 4 --ram-gb 16 --json 2>/dev/null)
  PROBES=$(python3 -c '
import json, sys
p = json.loads(sys.argv[1])["probes"]
print("--disk-gbs %.3f --mem-gbs %.2f --copy-gbs %.2f --dense-gbs %.2f --prefill-gmacs %.1f --expert-gmacs %.1f --attention-gmacs %.1f" % (
    p["disk_gb_s"], p["memory_gb_s"], p["copy_gb_s"], p["dense_decode_gb_s"], p["prefill_gmac_s"], p["expert_gmac_s"], p["attention_gmac_s"]))
' "$json")
fi
# The experts' decode product depends on their format (int2 and int3 unpack slower than
# memory): probed once per expert width the rows use, at DeepSeek-V3's expert shape, unless
# EXPERT_DECODE ("2:X 3:Y 4:Z", GB/s) is given.
if [ -z "${EXPERT_DECODE:-}" ]; then
  EXPERT_DECODE=""
  for bits in $(for row in $ROWS; do echo "${row##*:}"; done | sort -u); do
    g=$("$BIN" plan --config "$CFG/deepseek-v3.json" --expert-bits "$bits" $PROBES --json 2>/dev/null |
      python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)["probes"]["expert_decode_gb_s"])')
    EXPERT_DECODE="$EXPERT_DECODE $bits:$g"
  done
fi
expert_decode() { for p in $EXPERT_DECODE; do [ "${p%%:*}" = "$1" ] && echo "--expert-decode-gbs ${p##*:}"; done; return 0; }
DISK=$(sed -E 's/.*--disk-gbs ([0-9.]+).*/\1/' <<<"$PROBES")
echo "<!-- scripts/expect_table.sh, $(date -u +%Y-%m-%d), probes: $PROBES, expert decode GB/s by bits:$EXPERT_DECODE -->"
echo "| model (experts) | on disk | RAM | experts held a layer | decode cold / warm, this disk ($DISK GB/s) | first token (1k prompt) | decode warm, a $FAST_DISK GB/s NVMe | limit |"
echo "|---|---|---|---|---|---|---|---|"
for row in $ROWS; do
  cfg=${row%%:*}; bits=${row##*:}
  for ram in $RAMS; do
    a=$("$BIN" plan --config "$CFG/$cfg.json" --expert-bits "$bits" --ram-gb "$ram" $PROBES $(expert_decode "$bits") --json 2>/dev/null || true)
    fast="$(sed -E "s/--disk-gbs [0-9.]+/--disk-gbs $FAST_DISK/" <<<"$PROBES") $(expert_decode "$bits")"
    b=$("$BIN" plan --config "$CFG/$cfg.json" --expert-bits "$bits" --ram-gb "$ram" $fast --json 2>/dev/null || true)
    python3 -c '
import json, sys
name, bits, ram, a, b = sys.argv[1:6]
if not a:
    print(f"| {name} (int{bits}) | | {ram} GB | plan failed | | | | |"); sys.exit()
a = json.loads(a); b = json.loads(b) if b else None
r, p = a["ram"], a["predicted"]
disk = a["disk_bytes"] / 1e9
dense = r["dense_bytes"] / 1e9
if not a.get("fits", True):
    print(f"| {name} (int{bits}) | {disk:.0f} GB | {ram} GB | does not fit (dense {dense:.1f} GB) | - | - | - | RAM |"); sys.exit()
warm_fast = b["predicted"]["warm"]["decode_tok_s"] if b else float("nan")
held, per = r["experts_in_ram_per_layer"], a["experts_per_layer"]
cold, warm, ttft, limit = p["decode_tok_s"], p["warm"]["decode_tok_s"], p["ttft_s"], p["limit"]
print(f"| {name} (int{bits}) | {disk:.0f} GB | {ram} GB | {held} / {per} | {cold:.2f} / {warm:.2f} tok/s | {ttft:.0f} s | {warm_fast:.2f} tok/s | {limit} |")
' "$cfg" "$bits" "$ram" "$a" "$b"
  done
done
