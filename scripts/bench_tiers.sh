#!/usr/bin/env bash
# Tier benchmarks on a synthetic medium model (daemon/examples/make_synthetic.rs):
#   1. the disk's O_DIRECT sequential read bandwidth (dd), measured in this run;
#   2. cold decode with --direct and a small cache, as a fraction of that bandwidth
#      (bytes read per second of the run / disk GB/s), without and with --pipe;
#   3. hit rates of LRU alone, LRU + pins from the usage history, and + live re-pin, each
#      beside Belady's optimal hit rate on the same routing trace and capacity (belady.py).
#
# env: SYNTH (model dir, default /work/synth), GB (expert GB, 4), TOK (tokens per run, 48),
#      CAP (cache of the cold runs, 2), HCAP (cache of the hit-rate runs, 16), BIN (colibri).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SYNTH=${SYNTH:-/work/synth}
GB=${GB:-4}
TOK=${TOK:-48}
CAP=${CAP:-2}
HCAP=${HCAP:-16}
# belady.py replays the plain LRU, so the engine runs it too.
export COLI_CACHE_POLICY=lru
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/colibri}
OUT=${OUT:-$SYNTH/bench}
mkdir -p "$OUT"

if [ ! -f "$SYNTH/config.json" ]; then
  (cd "$ROOT" && cargo run --release -p colibri --example make_synthetic -- --out "$SYNTH" --expert-gb "$GB")
fi
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p colibri)

drop_caches() {
  sync
  if (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo "page cache dropped"; else echo "drop_caches not permitted: relying on O_DIRECT"; fi
}

# 1. O_DIRECT sequential bandwidth of the disk holding the experts.
SHARD=$(ls "$SYNTH"/model-experts-*.safetensors | head -1)
DD=$(dd if="$SHARD" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1)
# dd: "<bytes> bytes (...) copied, <secs> s, <rate>"
DISK_GBS=$(echo "$DD" | sed -E 's/^([0-9]+) bytes.*copied, ([0-9.]+) s.*/\1 \2/' | awk '{printf "%.3f", $1/$2/1e9}')
echo "DISK O_DIRECT sequential: $DISK_GBS GB/s ($DD)"

PROMPT="The history of the small hummingbird begins"
run() { # name, extra args...
  local name=$1; shift
  "$BIN" run --snap "$SYNTH" --raw --prompt "$PROMPT" --max-tokens "$TOK" --temp 1 --seed 7 \
    --dense-bits 8 --usage-save 0 "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  local io tokline
  io=$(grep -m1 '^\[PROF\] expert I/O' "$OUT/$name.err")
  tokline=$(grep -m1 '^\[run\]' "$OUT/$name.err")
  local gbs mbt dec hit
  gbs=$(echo "$io" | sed -E 's/.*MB\/token, ([0-9.]+) GB\/s over the run.*/\1/')
  mbt=$(echo "$io" | sed -E 's/.*\(([0-9.]+) MB\/token.*/\1/')
  dec=$(echo "$tokline" | sed -E 's/.*decode ([0-9.]+) tok\/s.*/\1/')
  hit=$(echo "$tokline" | sed -E 's/.*expert hit ([0-9.]+)%.*/\1/')
  echo "$name: decode $dec tok/s | $mbt MB/token | $gbs GB/s read | $(awk -v a="$gbs" -v b="$DISK_GBS" 'BEGIN{printf "%.0f", 100*a/b}')% of disk | hit $hit%"
  echo "$hit" >"$OUT/$name.hit"
}

# 2. Cold decode, O_DIRECT, small cache.
drop_caches
run cold_direct --direct --cache "$CAP" --autopin 0 --pilot off
drop_caches
run cold_direct_pipe --direct --cache "$CAP" --autopin 0 --pipe 4 --pilot off
drop_caches
run cold_direct_pipe_pilot --direct --cache "$CAP" --autopin 0 --pipe 4 --pilot on

# 3. Hit rates beside Belady. A history first (another prompt and seed), then the runs.
rm -f "$SYNTH/.coli_usage"
"$BIN" run --snap "$SYNTH" --raw --prompt "Once upon a time in a valley" --max-tokens $((TOK * 3)) \
  --temp 1 --seed 3 --dense-bits 8 --cache "$HCAP" --autopin 0 >/dev/null 2>"$OUT/history.err"
HIST=$(awk '$1>=0{s+=$3} END{print s}' "$SYNTH/.coli_usage")
echo "usage history: $HIST selections"
EB=$(python3 -c "
import json; c=json.load(open('$SYNTH/config.json')); h=c['hidden_size']; i=c['moe_intermediate_size']
m=lambda r,k: r*k//2 + r*(k//64)*4
print(2*m(i,h)+m(h,i))")
LAYERS=$(python3 -c "import json; print(json.load(open('$SYNTH/config.json'))['num_hidden_layers'])")
HALF=$((HCAP / 2))
NPIN=$((HALF * LAYERS))
PIN_GB=$(python3 -c "print($NPIN * $EB / 1e9 + 1e-6)")

TOKH=$((TOK * 2))
hrun() { # name, cap, extra...
  local name=$1 cap=$2; shift 2
  TOK=$TOKH run "$name" --cache "$cap" --route-trace "$OUT/$name.trace" "$@"
}
hrun lru "$HCAP" --autopin 0
python3 "$ROOT/scripts/belady.py" "$OUT/lru.trace" --cap "$HCAP" --engine-hit "$(cat "$OUT/lru.hit")"
hrun lru_half "$HALF" --autopin 0
python3 "$ROOT/scripts/belady.py" "$OUT/lru_half.trace" --cap "$HALF" --engine-hit "$(cat "$OUT/lru_half.hit")"
hrun lru_pins "$HALF" --pin auto --pin-gb "$PIN_GB"
python3 "$ROOT/scripts/belady.py" "$OUT/lru_pins.trace" --cap "$HALF" --pins "$NPIN" --usage "$SYNTH/.coli_usage" --engine-hit "$(cat "$OUT/lru_pins.hit")"
hrun lru_pins_repin "$HALF" --pin auto --pin-gb "$PIN_GB" --repin 8
python3 "$ROOT/scripts/belady.py" "$OUT/lru_pins_repin.trace" --cap "$HALF" --pins "$NPIN" --usage "$SYNTH/.coli_usage" --engine-hit "$(cat "$OUT/lru_pins_repin.hit")"
grep -c '^\[REPIN\]' "$OUT/lru_pins_repin.err" | sed 's/^/re-pin swaps: /'
