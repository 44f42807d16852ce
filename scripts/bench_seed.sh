#!/usr/bin/env bash
# Warm decode of this engine beside the seed C engine (upstream's glm.c, the engine this one
# was rewritten from) on the same model, the same token ids and the same threads (issue 52:
# "against the seed C engine on the medium model: warm >= 3.5x"):
#
#   SEED_DIR=~/.cache/colibri-bench/seed MEDIUM=/work/medium scripts/bench_seed.sh [PAIRS]
#
# PAIRS alternated pairs (3), their order alternating; each pair prints both decode tok/s, the
# ratio (this engine / the seed) and `uptime`'s load; the medians close the run.
#
# Building the seed engine in SEED_DIR (outside the repository: upstream's code is never
# committed here), CPU only:
#   - glm.c: /work/shared/reference/seed-engine-glm.c.txt (3355 lines, "build: make glm");
#   - json.h and tier.h: JustVugg/colibri c/json.h and c/tier.h at commit 003a0b9b8edf;
#   - st.h: c/st.h of that commit cut down to the Linux path of the functions glm.c calls,
#     plus one shim: glm.c calls st_prefetch(S, name), which that commit renamed
#     st_prefetch_rep(S, name, rep) (st_prefetch is its rep 0);
#   - shims for what the bench does not reach: compat.h (Linux: COMPAT_O_RDONLY,
#     compat_aligned_free = free), tok.h (no tokenizer: the bench passes token ids; PROMPT= and
#     SERVE= refuse) and grammar.h (GRAMMAR= drafts refused);
#   gcc -O3 -march=native -fopenmp -o glm glm.c -lm -lpthread   (gcc 12.2: no error)
#
# How each side runs, warm:
#   seed:    OMP_NUM_THREADS=THREADS SNAP=MEDIUM AUTOPIN=0 PIN=<every routed expert> PIN_GB=PIN_GB
#            REF=<ids> REPLAY=1 glm 128 4 8   (cap 128 per layer, int4 experts as stored, int8
#            dense; every expert of every sparse layer pinned in RAM before the timed replay, so
#            its "expert hit" is 100%). REPLAY prefills the prompt but its last token, then
#            times one step per remaining id. It keeps its own OpenMP tuning (a re-exec with
#            OMP_WAIT_POLICY=active, GOMP_SPINCOUNT=200000, OMP_PROC_BIND=close):
#            SEED_ENV="COLI_NO_OMP_TUNE=1" turns it off.
#   colibri: colibri bench --snap MEDIUM --dense-bits 8 --expert-bits 4 --threads THREADS
#            --autopin false --warmup --ref <ids>: the same ids, prefill then one step per id,
#            timed after an untimed replay that makes every expert it routes to resident.
# The ids: 2 prompt ids (1 prefilled position) and GEN decode steps on fixed pseudo-random ids
# below 4084 (the medium model's plain-token range); both engines feed the same GEN ids (the
# seed's REPLAY stops one id before the end of full_ids, colibri's bench decodes them all, so
# the seed's file has one more id).
#
# env: SEED_DIR (~/.cache/colibri-bench/seed), MEDIUM (/work/medium), THREADS (2), GEN (64),
# PIN_GB (8), SEED_TIMEOUT (seconds per seed run, 1800), SEED_ENV (extra VAR=value for the
# seed), BIN (colibri; target/release/colibri).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/bench_lib.sh
. "$ROOT/scripts/bench_lib.sh"
SEED_DIR=${SEED_DIR:-$HOME/.cache/colibri-bench/seed}
MEDIUM=${MEDIUM:-/work/medium}
PAIRS=${1:-${PAIRS:-3}}
THREADS=${THREADS:-2}
GEN=${GEN:-64}
PIN_GB=${PIN_GB:-8}
SEED_TIMEOUT=${SEED_TIMEOUT:-1800}
SEED_ENV=${SEED_ENV:-}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/colibri}
log() { echo "[bench_seed] $*" >&2; }

[ -x "$SEED_DIR/glm" ] || { log "no $SEED_DIR/glm: build it as this script's header says"; exit 2; }
[ -f "$MEDIUM/config.json" ] || { log "no $MEDIUM/config.json"; exit 2; }
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p colibri)

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The ids (one file a side) and the pin list: every expert of every sparse layer, from config.json.
python3 - "$MEDIUM/config.json" "$GEN" "$WORK" <<'PY'
import json, sys
cfg_path, gen, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
x, ids = 12345, []
for _ in range(gen + 2):
    x = (x * 1103515245 + 12345) % (1 << 31)
    ids.append(x % 4084)
json.dump({"prompt_ids": ids[:2], "full_ids": ids}, open(f"{work}/seed_ref.json", "w"))
json.dump({"prompt_ids": ids[:2], "full_ids": ids[:gen + 1]}, open(f"{work}/colibri_ref.json", "w"))
cfg = json.load(open(cfg_path))
dense = cfg.get("first_k_dense_replace", 0)
with open(f"{work}/pin_all.txt", "w") as f:
    for layer in range(dense, cfg["num_hidden_layers"]):
        for e in range(cfg["n_routed_experts"]):
            f.write(f"{layer} {e} 1\n")
PY

# The seed's decode tok/s and hit rate ("REPLAY decode: N tokens in Xs | Y tok/s | expert hit Z%").
seed_run() {
  local out
  # shellcheck disable=SC2086
  out=$(cd "$WORK" && timeout "$SEED_TIMEOUT" env OMP_NUM_THREADS="$THREADS" SNAP="$MEDIUM" AUTOPIN=0 \
    PIN="$WORK/pin_all.txt" PIN_GB="$PIN_GB" REF="$WORK/seed_ref.json" REPLAY=1 $SEED_ENV \
    "$SEED_DIR/glm" 128 4 8 2>"$WORK/seed.err") || true
  echo "$out" >"$WORK/seed.out"
  sed -n 's/^REPLAY decode: .* | \([0-9.]*\) tok\/s | expert hit \([0-9.]*\)%.*/\1 \2/p' <<<"$out"
}

coli_run() {
  "$BIN" bench --snap "$MEDIUM" --dense-bits 8 --expert-bits 4 --threads "$THREADS" --autopin false \
    --warmup --ref "$WORK/colibri_ref.json" --no-disk-probe 2>"$WORK/coli.err" || true
}

echo "## warm decode, medium model ($MEDIUM), $THREADS threads, $GEN steps, $PAIRS pairs | $(load)"
ratios=() seeds=() colis=()
for i in $(seq 1 "$PAIRS"); do
  s="" c="" hit=""
  for side in $(if [ $((i % 2)) = 1 ]; then echo seed coli; else echo coli seed; fi); do
    if [ "$side" = seed ]; then
      read -r s hit <<<"$(seed_run)" || true
      [ -n "${s:-}" ] || { log "seed run $i gave no REPLAY line:"; tail -5 "$WORK/seed.err" "$WORK/seed.out" >&2; }
    else
      c=$(field decode_tok_s "$(coli_run)")
      [ -n "$c" ] || { log "colibri run $i gave no BENCH line:"; tail -5 "$WORK/coli.err" >&2; }
    fi
  done
  ratios+=("$(ratio "$c" "$s")") seeds+=("${s:--}") colis+=("${c:--}")
  echo "pair $i: colibri ${c:--} tok/s | seed ${s:--} tok/s (expert hit ${hit:--}%) | ratio ${ratios[-1]} | $(load)"
done
echo "median: colibri $(median "${colis[@]}") tok/s | seed $(median "${seeds[@]}") tok/s | ratio $(median "${ratios[@]}") | $(load)"
