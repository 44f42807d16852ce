#!/usr/bin/env bash
# Issue 50 item 4: llama.cpp beside this engine at Qwen3-30B-A3B's real shapes, in the same
# memory cgroups, alternated. Both models are random-weight and route alike:
#   - ours: `colibri plan --measure DIR --write-only` (int4-g64 experts, int8 dense);
#   - llama.cpp's: scripts/gguf_real_shape.py (Q4_0 everywhere, the same weight spreads).
#
#   scripts/plan_pair.sh [WORK_DIR]
#
# Each cgroup size in CGROUPS_GB gets one pair (colibri decode, llama-bench -p 0 -n N), the
# order alternating from one size to the next, each side started with the model's pages
# dropped from the page cache (cold). llama.cpp maps the whole file and pages it through the
# cgroup: each of its runs is time-boxed (LLAMA_TIMEOUT). The files are deleted at the end
# unless KEEP=1. `uptime` is printed with every run: the machine is shared.
#
# env: BIN (colibri, target/release/colibri), LLAMA_BENCH (~/.cache/colibri-bench/build/bin/
# llama-bench), PYTHON (with numpy and gguf: /work/venv-fixtures/bin/python), LAYERS (24; the
# full model has 48), CGROUPS_GB ("4 2": at 24 layers the model-to-RAM ratio of 8 and 4 GB at
# 48), GEN (colibri's decode steps, 64), LLAMA_GEN (8), LLAMA_TIMEOUT (300 s), THREADS (2),
# LLAMA_ARGS ("--repack 0": llama.cpp's CPU backend otherwise copies every Q4_0 weight into
# an interleaved layout in anonymous memory, and the cgroup's OOM killer stops it within a
# minute; without the copy its mmap pages the file through the cgroup, the comparison the
# issue asks for), COLI_ARGS (more `colibri bench` options, e.g. "--direct off": in these
# cgroups the default `--direct auto` reads with O_DIRECT, while buffered reads are charged to
# the cgroup and reclaimed in the read path, and ran at 0.38 of O_DIRECT's rate here), KEEP_FREE_GB (8: refuse to write if less would stay free), KEEP (0).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/colibri}
LLAMA_BENCH=${LLAMA_BENCH:-$HOME/.cache/colibri-bench/build/bin/llama-bench}
PYTHON=${PYTHON:-/work/venv-fixtures/bin/python}
WORK=${1:-/tmp/colibri-plan-pair}
LAYERS=${LAYERS:-24}
CGROUPS_GB=${CGROUPS_GB:-4 2}
GEN=${GEN:-64}
LLAMA_GEN=${LLAMA_GEN:-8}
LLAMA_TIMEOUT=${LLAMA_TIMEOUT:-300}
THREADS=${THREADS:-2}
KEEP_FREE_GB=${KEEP_FREE_GB:-8}
KEEP=${KEEP:-0}
LLAMA_ARGS=${LLAMA_ARGS:---repack 0}
COLI_ARGS=${COLI_ARGS:-}
CONFIG=$ROOT/tests/fixtures/configs/qwen3-30b-a3b.json
INT4=$WORK/int4
GGUF=$WORK/q4_0.gguf

# evict (the files' pages dropped from the page cache) and limited ("$@" in a memory cgroup of
# $1 bytes, swap off; exit 125 where none can be made), as the llama.cpp benchmarks run them.
# shellcheck source=scripts/bench_lib.sh
. "$ROOT/scripts/bench_lib.sh"

log() { echo "[plan_pair] $*" >&2; }
load() { uptime | sed 's/.*load average/load/'; }
free_gb() { df -B1 --output=avail "$WORK" | tail -1 | awk '{printf "%.1f", $1/1e9}'; }

mkdir -p "$WORK"
echo "# scripts/plan_pair.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $THREADS threads each, $LAYERS of 48 layers, colibri $(git -C "$ROOT" rev-parse --short HEAD)"

# --- the two models ------------------------------------------------------------------------
if [ ! -f "$INT4/colibri-measure.json" ]; then
  need=$("$BIN" plan --json --config "$CONFIG" --layers "$LAYERS" --disk-gbs 1 --mem-gbs 1 --prefill-gmacs 1 --expert-gmacs 1 --attention-gmacs 1 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["disk_bytes"])')
  # The GGUF is about the int4 container's size (Q4_0 is 4.5 bits, int4-g64 4.5 bits).
  avail=$(df -B1 --output=avail "$WORK" | tail -1)
  if [ $((avail - 2 * need)) -lt $((KEEP_FREE_GB * 1000000000)) ]; then
    log "refused: both models need about $((2 * need / 1000000)) MB, $((avail / 1000000)) MB free, $KEEP_FREE_GB GB must stay free (LAYERS=$LAYERS)"
    exit 1
  fi
  log "writing the int4 container ($((need / 1000000)) MB) into $INT4"
  "$BIN" plan --config "$CONFIG" --layers "$LAYERS" --expert-bits 4 --measure "$INT4" --write-only >&2 || exit 1
fi
if [ ! -f "$GGUF" ]; then
  log "writing the GGUF Q4_0 $GGUF"
  "$PYTHON" "$ROOT/scripts/gguf_real_shape.py" "$GGUF.part" --layers "$LAYERS" >&2 && mv "$GGUF.part" "$GGUF" || exit 1
fi
INT4_BYTES=$(du -cb "$INT4"/*.safetensors | tail -1 | cut -f1)
GGUF_BYTES=$(stat -c %s "$GGUF")
echo "models: colibri int4 $(awk "BEGIN{printf \"%.2f\", $INT4_BYTES/1e9}") GB, GGUF Q4_0 $(awk "BEGIN{printf \"%.2f\", $GGUF_BYTES/1e9}") GB; free disk $(free_gb) GB"

# --- the pairs -----------------------------------------------------------------------------
coli() {
  local bytes=$1 out c
  evict "$INT4"/*.safetensors "$GGUF"
  echo "colibri${COLI_ARGS:+ $COLI_ARGS} ($(load)):"
  # No --ram-gb: the budget is 88% of the cgroup's limit, as `run` takes it.
  # shellcheck disable=SC2086  # COLI_ARGS is a list of options
  out=$(limited "$bytes" "$BIN" bench --snap "$INT4" --threads "$THREADS" --no-membw --no-disk-probe \
    --prompt-tokens 1 --gen-tokens "$GEN" $COLI_ARGS 2>&1)
  c=$(sed -n 's/^BENCH .*decode_tok_s=\([0-9.]*\).*/\1/p' <<<"$out")
  echo "  ${c:--} tok/s over $GEN tokens"
  grep -E '^\[RAM\] budget|expert loads/token|prefetch' <<<"$out" | sed 's/^/  /' || true
  [ -n "$c" ] || tail -3 <<<"$out" | sed 's/^/  /'
  COLI_TS=$c
}
llama() {
  local bytes=$1 rc=0 t0 l why
  evict "$INT4"/*.safetensors "$GGUF"
  echo "llama.cpp ($(load)):"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  limited "$bytes" timeout "$LLAMA_TIMEOUT" "$LLAMA_BENCH" -m "$GGUF" -t "$THREADS" -r 1 --no-warmup \
    $LLAMA_ARGS -p 0 -n "$LLAMA_GEN" -o csv >"$WORK/llama.csv" 2>"$WORK/llama.err" || rc=$?
  l=$(python3 -c '
import csv, sys
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.strip()))
print("%.3f" % float(rows[-1]["avg_ts"]) if rows and rows[-1].get("avg_ts") else "")' "$WORK/llama.csv")
  if [ -n "$l" ]; then
    echo "  $l tok/s (tg$LLAMA_GEN, $(($(date +%s) - t0)) s in all)"
  else
    case $rc in
      124) why="timed out: fewer than $LLAMA_GEN tokens in $LLAMA_TIMEOUT s" ;;
      137) why="killed (the cgroup's OOM killer)" ;;
      *) why="exit $rc: $(grep -v '^\s*$' "$WORK/llama.err" | tail -1)" ;;
    esac
    echo "  no result after $(($(date +%s) - t0)) s: $why"
  fi
  LLAMA_TS=$l
  LLAMA_RC=$rc
}

i=0
for gb in $CGROUPS_GB; do
  bytes=$(python3 -c "print(int($gb * 1e9))")
  echo
  echo "## memory cgroup $gb GB (swap off), cold page cache"
  COLI_TS=""; LLAMA_TS=""; LLAMA_RC=""
  if [ $((i % 2)) = 0 ]; then llama "$bytes"; coli "$bytes"; else coli "$bytes"; llama "$bytes"; fi
  if [ -n "$COLI_TS" ] && [ -n "$LLAMA_TS" ]; then
    echo "ratio colibri / llama.cpp: $(python3 -c "print(f'{$COLI_TS / $LLAMA_TS:.1f}x')")"
  elif [ -n "$COLI_TS" ] && [ "$LLAMA_RC" = 124 ]; then
    echo "ratio colibri / llama.cpp: llama.cpp made no timed figure within ${LLAMA_TIMEOUT} s (at most ${LLAMA_GEN} tokens' worth); colibri's rate is at least $(python3 -c "print(f'{$COLI_TS * $LLAMA_TIMEOUT / $LLAMA_GEN:.0f}')")x that bound"
  fi
  i=$((i + 1))
done

if [ "$KEEP" = 1 ]; then
  log "kept $INT4 and $GGUF (KEEP=1)"
else
  rm -rf "$INT4" "$GGUF"
  log "deleted the models; free disk $(free_gb) GB"
fi
