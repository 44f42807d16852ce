#!/usr/bin/env bash
# The real-shape runs of `colibri plan --measure` (issue 50 item 2): each published config
# written as a random-weight model at its shapes, measured, and deleted before the next (they
# are 17-45 GB). Prints each run's text table and JSON with the machine's load and free disk.
#
#   scripts/plan_measure.sh [WORK_DIR] [RUN...]     runs: qwen8 qwen4 deepseek glm (default all)
#
# Environment: BIN (colibri binary, default target/release/colibri), TOKENS (decode steps, 256),
# DS_LAYERS (DeepSeek-V3's layers, 8), DS_BITS (2), GLM_LAYERS (46: all), GLM_BITS (3),
# KEEP_FREE_GB (10: a write that would leave less free is skipped), DS_RAM_GB and GLM_RAM_GB
# (a RAM budget for those runs, `--ram-gb`; unset: the plan's own, 88% of MemAvailable, which
# on a machine shared with other work can leave them too little). Each model is deleted after
# its run (KEEP=1 keeps the last one).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/colibri}
WORK=${1:-/tmp/colibri-plan-measure}
shift || true
RUNS=${*:-qwen8 qwen4 deepseek glm}
TOKENS=${TOKENS:-256}
KEEP_FREE_GB=${KEEP_FREE_GB:-10}
CONFIGS=$ROOT/tests/fixtures/configs

machine() {
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GB", $2/1e6}' /proc/meminfo) RAM, load $(cut -d' ' -f1-3 /proc/loadavg), free disk $(df -B1 --output=avail "$WORK" | tail -1 | awk '{printf "%.1f GB", $1/1e9}')"
}

# One run: name, config, then plan's options. The model's size is asked of `plan` first
# (--json, given speeds: nothing written) and the run skipped if it would leave less than
# KEEP_FREE_GB free.
one() {
  local name=$1 config=$2; shift 2
  local dir=$WORK/$name
  local bytes avail
  local sizing=() a skip=0
  for a in "$@"; do  # the sizing call takes no --measure options
    if [ $skip = 1 ]; then skip=0; continue; fi
    case $a in --cgroup-gb) skip=1 ;; *) sizing+=("$a") ;; esac
  done
  bytes=$("$BIN" plan --json --config "$config" --disk-gbs 1 --mem-gbs 1 --copy-gbs 1 --dense-gbs 1 --expert-decode-gbs 1 --prefill-gmacs 1 --expert-gmacs 1 --attention-gmacs 1 "${sizing[@]}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["disk_bytes"])')
  avail=$(df -B1 --output=avail "$WORK" | tail -1)
  echo
  echo "## $name: $(basename "$config") $*"
  machine
  if [ ! -f "$dir/colibri-measure.json" ] && [ $((avail - bytes)) -lt $((KEEP_FREE_GB * 1000000000)) ]; then
    echo "skipped: the model needs $((bytes / 1000000)) MB, $((avail / 1000000)) MB free, and $KEEP_FREE_GB GB must stay free"
    return
  fi
  "$BIN" plan --config "$config" --measure "$dir" --measure-tokens "$TOKENS" "$@" --json >"$WORK/$name.json" 2>"$WORK/$name.log"
  echo "exit $?"
  python3 - "$WORK/$name.json" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except Exception as e:
    print("no JSON:", e); sys.exit()
p, m = v["predicted"], v.get("measured", {})
print(json.dumps({"disk_bytes": v["disk_bytes"], "probes": v["probes"], "ram": v["ram"],
                  "predicted": p, "measure": v.get("measure"), "measured": m}, indent=1))
PY
  machine
}

mkdir -p "$WORK"
for r in $RUNS; do
  case $r in
    qwen8) one qwen3-30b "$CONFIGS/qwen3-30b-a3b.json" --expert-bits 4 --cgroup-gb 8 ;;
    # At ctx 4096 the 4 GB cgroup leaves no expert room beside int8 dense and the KV (plan says so).
    qwen4) one qwen3-30b "$CONFIGS/qwen3-30b-a3b.json" --expert-bits 4 --cgroup-gb 4 --ctx 1300 ;;
    deepseek) rm -rf "$WORK/qwen3-30b"
      one deepseek-v3 "$CONFIGS/deepseek-v3.json" --expert-bits "${DS_BITS:-2}" --layers "${DS_LAYERS:-8}" \
        ${DS_RAM_GB:+--ram-gb "$DS_RAM_GB"} ;;
    glm) rm -rf "$WORK/deepseek-v3"
      one glm-4.5-air "$CONFIGS/glm-4.5-air.json" --expert-bits "${GLM_BITS:-3}" --layers "${GLM_LAYERS:-46}" \
        ${GLM_RAM_GB:+--ram-gb "$GLM_RAM_GB"} ;;
    *) echo "unknown run $r (qwen8 qwen4 deepseek glm)" ;;
  esac
done
# The models are tens of GB: none stays behind unless asked.
[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK/qwen3-30b" "$WORK/deepseek-v3" "$WORK/glm-4.5-air"
