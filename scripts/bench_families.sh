#!/usr/bin/env bash
# Decode speed of each family at the medium model's proportions (issue 47): for each family in
# FAMILIES, `make_synthetic --family F` writes the medium model (24 layers, hidden 2048, 128
# int4-row experts of moe_inter 768 = 2.37 MB, top 8, vocab 16384; glm_moe_dsa with its one
# dense layer and 16 heads, the others with their own attention: see
# daemon/examples/make_synthetic/families.rs) into a scratch folder outside the repository,
# then:
#   warm: the model's files read into the page cache, RUNS processes of
#         `colibri bench --warmup --rounds ROUNDS` (every expert the replay routes to resident):
#         decode tok/s and its whole-token ratio to the memory probe of the same process
#         (weight bytes per token x tok/s / probe GB/s), best and median over the processes;
#   cold: the model's pages dropped from the page cache (posix_fadvise DONTNEED on each file,
#         as bench_llamacpp.sh and `plan --measure` evict; no privilege needed), one process of
#         `colibri bench --cache COLD_CAP` (experts per layer in the LRU): decode tok/s, hit
#         rate, GB/s read and MB read per generated token;
# and deletes the model before the next family (each is 7-11 GB). `uptime` is printed beside
# every line: on a shared machine the load says how far to trust it.
#
# env: FAMILIES ("glm_moe_dsa gpt_oss minimax_m2 qwen3_5_moe deepseek_v4"), SCRATCH (a fresh
#      folder under /tmp), RUNS (3), ROUNDS (1), PROMPT (16 positions prefilled), GEN (32 decode
#      steps, warm), CGEN (24 decode steps, cold), COLD_CAP (4), DENSE_BITS (8), BIN (colibri),
#      SIZE (make_synthetic's size arguments), KEEP (1: keep each model, e.g. to rerun by hand).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FAMILIES=${FAMILIES:-"glm_moe_dsa gpt_oss minimax_m2 qwen3_5_moe deepseek_v4"}
RUNS=${RUNS:-3}
ROUNDS=${ROUNDS:-1}
PROMPT=${PROMPT:-16}
GEN=${GEN:-32}
CGEN=${CGEN:-24}
COLD_CAP=${COLD_CAP:-4}
# colibri reads CAP (and CAP_RAISE) from the environment as --cache: a CAP exported to this
# script would cap the warm runs too.
unset CAP CAP_RAISE
DB=${DENSE_BITS:-8}
# The medium model's proportions (make_synthetic's other defaults: hidden 2048, 128 experts,
# top 8); smaller ones (e.g. "--layers 4 --experts 8 --top-k 2 --hidden 256 --inter 128") check
# the script itself in seconds.
SIZE=${SIZE:-"--layers 24 --inter 768 --vocab 16384"}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/colibri}
SYN=${SYN:-$TARGET/release/examples/make_synthetic}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p colibri --bin colibri)
[ -x "$SYN" ] || (cd "$ROOT" && cargo build --release -p colibri --example make_synthetic)
SCRATCH=${SCRATCH:-$(mktemp -d /tmp/colibri-families.XXXXXX)}
case "$SCRATCH" in "$ROOT"/*) echo "SCRATCH must be outside the repository" >&2; exit 2 ;; esac
mkdir -p "$SCRATCH"
LOG=$SCRATCH/logs
mkdir -p "$LOG"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$SCRATCH"' EXIT

load() { uptime | sed -E 's/.*load average: //'; }

evict() { # drops the page cache of every file given (clean pages)
  python3 - "$@" <<'PY'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}

field() { # key, BENCH line: the value of key=...
  echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}

bench_line() { # log, command...: runs it, prints its BENCH line; on failure its log's tail
  local log=$1; shift
  if "$@" >"$log" 2>&1 && grep -q '^BENCH' "$log"; then
    grep -m1 '^BENCH' "$log"
  else
    { echo "failed: $*"; tail -5 "$log"; } >&2
  fi
}

stats() { # values...: "best X median Y"
  printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{printf "best %s, median %s", v[NR], v[int((NR+1)/2)]}'
}

echo "# colibri bench_families.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GB", $2/1e6}' /proc/meminfo)"
echo "# warm: $RUNS processes x --rounds $ROUNDS, $PROMPT prompt positions + $GEN decode steps; cold: --cache $COLD_CAP, $CGEN decode steps; --dense-bits $DB"
echo
echo "| family | model | warm decode tok/s | ratio to the memory probe | cold decode (--cache $COLD_CAP, page cache dropped) | load (1/5/15 min) |"
echo "|---|---|---|---|---|---|"
for F in $FAMILIES; do
  DIR=$SCRATCH/$F
  rm -rf "$DIR"
  T0=$(date +%s)
  extra=()
  [ "$F" = glm_moe_dsa ] && extra=(--dense-layers 1 --heads 16)
  # shellcheck disable=SC2086
  if ! "$SYN" --out "$DIR" --family "$F" $SIZE --expert-format i4row "${extra[@]}" \
    >"$LOG/$F.make" 2>&1; then
    echo "| \`$F\` | make_synthetic failed: $(tail -1 "$LOG/$F.make") | | | | $(load) |"
    rm -rf "$DIR"
    continue
  fi
  MADE=$(tail -1 "$LOG/$F.make" | sed -E 's/.*, ([0-9.]+ GB) on disk.*/\1/')
  # Warm: the files in the page cache, then each process's best round.
  cat "$DIR"/*.safetensors >/dev/null
  toks=() ratios=() probes=() hits=()
  for i in $(seq "$RUNS"); do
    B=$(bench_line "$LOG/$F.warm$i" "$BIN" bench --snap "$DIR" --prompt-tokens "$PROMPT" \
      --gen-tokens "$GEN" --dense-bits "$DB" --warmup --rounds "$ROUNDS" --no-disk-probe)
    [ -n "$B" ] || continue
    toks+=("$(field decode_tok_s "$B")")
    ratios+=("$(field decode_membw_ratio "$B")")
    hits+=("$(field hit_pct "$B")")
    probes+=("$(grep -m1 'memory read bandwidth' "$LOG/$F.warm$i" | sed -E 's/.*weights read per token ([0-9.]+ MB).*memory read bandwidth ([0-9.]+ GB\/s).*/\1 a token, probe \2/' || true)")
  done
  WARM="failed" RATIO="-"
  if [ ${#toks[@]} -gt 0 ]; then
    # The hit rate says whether the replay was warm (every expert resident: 100%).
    WARM="$(stats "${toks[@]}") (${toks[*]}; hit ${hits[*]}%)"
    RATIO="$(stats "${ratios[@]}") (${probes[0]})"
  fi
  # Cold: nothing of the model in the page cache, a small LRU.
  evict "$DIR"/*.safetensors
  B=$(bench_line "$LOG/$F.cold" "$BIN" bench --snap "$DIR" --prompt-tokens "$PROMPT" \
    --gen-tokens "$CGEN" --dense-bits "$DB" --cache "$COLD_CAP" --no-membw --no-disk-probe)
  CT=$(field decode_tok_s "$B")
  HIT=$(field hit_pct "$B")
  GBS=$(field read_gbs "$B")
  # The decode steps' expert loads and bytes read from disk per token.
  PERTOK=$(grep -m1 'MB read/token' "$LOG/$F.cold" | sed -nE 's/.*decode: ([0-9.]+) expert loads\/token, ([0-9.]+) MB read\/token.*/\2 MB read a token (\1 expert loads)/p' || true)
  COLD=failed
  [ -z "$B" ] || COLD="$CT tok/s, hit $HIT%, $GBS GB/s read${PERTOK:+, $PERTOK}"
  echo "| \`$F\` | $MADE | $WARM | $RATIO | $COLD | $(load) |"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$DIR"
  echo "$F: $(( $(date +%s) - T0 ))s" >>"$LOG/times"
done
echo
sed 's/^/# /' "$LOG/times"
