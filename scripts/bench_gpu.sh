#!/usr/bin/env bash
# The GPU tier's figures (issue 39): decode on the medium model with the CPU only, with the dense
# weights on the GPU, and with the dense weights plus K experts per layer in VRAM, each beside
# the device's read bandwidth measured in the same run.
#
#   scripts/bench_gpu.sh                 # medium model, --gpu auto (a hardware adapter)
#   GPU=vulkan K="8 32" scripts/bench_gpu.sh
#
# For each configuration `colibri bench --prompt-tokens 1 --gen-tokens GEN` prints BENCH and
# the `[bench] gpu:` line (the probe: a kernel reading a 256 MB buffer, best of 5; the whole
# token's weight bytes per second and their ratio to it). The runs alternate configurations
# ROUNDS times, so a busy machine weighs on each alike.
#
# env: MODEL (the medium model; made with make_synthetic in $COLI_BENCH_DIR/medium when absent),
# GPU (auto), K ("8 32": experts per layer in VRAM), GEN (64), ROUNDS (2), THREADS (all cores),
# DENSE_BITS (8), BIN (target/release/colibri), COLI_BENCH_DIR (~/.cache/colibri-bench).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${COLI_BENCH_DIR:-$HOME/.cache/colibri-bench}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/colibri}
GPU=${GPU:-auto}
K=${K:-8 32}
GEN=${GEN:-64}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-$(nproc)}
DENSE_BITS=${DENSE_BITS:-8}
log() { echo "[bench_gpu] $*" >&2; }
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p colibri)

MODEL=${MODEL:-$DIR/medium}
if [ ! -f "$MODEL/config.json" ]; then
  log "making the medium model in $MODEL (8 GB)"
  (cd "$ROOT" && cargo build --release -p colibri --example make_synthetic)
  "$TARGET/release/examples/make_synthetic" --out "$MODEL" --layers 24 --dense-layers 1 \
    --heads 16 --inter 768 --expert-format i4row --vocab 16384 >&2
fi

bench() {
  "$BIN" bench --snap "$MODEL" --threads "$THREADS" --dense-bits "$DENSE_BITS" --no-disk-probe \
    --warmup --prompt-tokens 1 --gen-tokens "$GEN" "$@" 2>&1
}
field() { sed -n "s/^BENCH .*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }

# The sizes the budgets are made of, from a CPU run's weights line.
first=$(bench --gpu off)
read -r dense_gb layers expert_gb < <(sed -n \
  's/^\[bench\] weights: dense \([0-9.]*\) GB, \([0-9]*\) layers of routed experts of \([0-9.]*\) GB each/\1 \2 \3/p' \
  <<<"$first")
[ -n "${dense_gb:-}" ] || { log "no weights line in colibri bench's output"; exit 1; }
configs=("off:0")
configs+=("dense:$(python3 -c "print(f'{$dense_gb * 1.02 + 0.01:.3f}')")")
for k in $K; do
  configs+=("dense+${k}/layer:$(python3 -c "print(f'{$dense_gb * 1.02 + 0.01 + $k * $layers * $expert_gb:.3f}')")")
done

echo "# scripts/bench_gpu.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $THREADS threads, --gpu $GPU"
echo "# model $MODEL: dense $dense_gb GB, $layers layers of routed experts of $expert_gb GB; colibri $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?)"
for round in $(seq 1 "$ROUNDS"); do
  echo "## round $round | $(uptime | sed 's/.*load average/load average/')"
  for c in "${configs[@]}"; do
    name=${c%%:*}; gb=${c#*:}
    if [ "$name" = off ]; then out=$(bench --gpu off); else out=$(bench --gpu "$GPU" --vram-gb "$gb"); fi
    echo "$name (--vram-gb $gb): decode $(field decode_tok_s "$out") tok/s, prefill $(field prefill_pos_s "$out") pos/s"
    grep -E '^\[GPU\]|^\[bench\] gpu:|^\[bench\] weights read per token' <<<"$out" | sed 's/^/  /' || true
  done
done
