#!/usr/bin/env bash
# This engine beside llama.cpp on the same weights (issue 38), alternated in one run:
#
#   scripts/bench_llamacpp.sh [PAIRS]        # PAIRS alternated pairs per warm figure (3)
#   scripts/bench_llamacpp.sh prepare        # steps 1 and 2 only (build, checkpoint, convert)
#   FAMILIES="glm_moe_dsa deepseek_v3 qwen3_moe" scripts/bench_llamacpp.sh   # steps 2-4 per family
#
# 1. llama.cpp from the llama-cpp-python sdist on PyPI (its vendor/llama.cpp), llama-bench
#    and llama-quantize built with cmake, CPU only, once, in $COLI_BENCH_DIR; on a CPU with
#    AMX also llama-bench without AMX (build-noamx), since the AMX build crashes there (see
#    bench_lib.sh's llama_ts: each figure then takes the faster of its two working paths);
# 2. per family of FAMILIES, a BF16 checkpoint of issue 38's shape (scripts/bench_llamacpp_checkpoint.py:
#    LAYERS layers of EXPERTS experts of 768, top 8, hidden 2048, random weights; the
#    family's own attention), converted
#    to our int4 container (`colibri convert`, its defaults) and to GGUF Q4_0 (llama.cpp's
#    convert_hf_to_gguf.py, which knows every one of the five, then llama-quantize); the BF16
#    files are deleted once both conversions exist (KEEP_BF16=1 keeps them);
# 3. warm decode (llama-bench -p 0 -n 64 beside colibri bench --gen-tokens 64), pp64 and pp512,
#    THREADS threads each, PAIRS pairs whose order alternates, each pair printed and the
#    median of the ratios (this engine / llama.cpp);
# 4. decode under a memory cgroup at 0.5x and 0.75x of each model's size, page cache of the
#    model dropped first (cold): tok/s, and for this engine the hit rate, MB read per token,
#    the time compute waited for reads and the disk probe of the same run. llama.cpp gets
#    MEM_TIMEOUT seconds to decode MEM_GEN_LLAMA tokens.
# `uptime` is printed with each section: the machine is shared.
#
# env: COLI_BENCH_DIR (scratch, outside the repository; ~/.cache/colibri-bench), PYTHON (with
# torch, transformers, safetensors, numpy; python3), THREADS (2), LAYERS (12), EXPERTS (64),
# GEN (64), MEM_PAIRS (1), MEM_GEN (64), MEM_GEN_LLAMA (16), MEM_TIMEOUT (300), BIN (colibri).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${COLI_BENCH_DIR:-$HOME/.cache/colibri-bench}
PYTHON=${PYTHON:-python3}
PREPARE_ONLY=0
if [ "${1:-}" = prepare ]; then PREPARE_ONLY=1; shift; fi
PAIRS=${1:-${PAIRS:-3}}
THREADS=${THREADS:-2}
LAYERS=${LAYERS:-12}
EXPERTS=${EXPERTS:-64}
GEN=${GEN:-64}
MEM_PAIRS=${MEM_PAIRS:-1}
MEM_GEN=${MEM_GEN:-64}
MEM_GEN_LLAMA=${MEM_GEN_LLAMA:-16}
MEM_TIMEOUT=${MEM_TIMEOUT:-300}
FAMILIES=${FAMILIES:-glm_moe_dsa}
MEM=${MEM:-1}
KEEP_BF16=${KEEP_BF16:-0}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/colibri}
case "$DIR" in "$ROOT"|"$ROOT"/*) echo "COLI_BENCH_DIR must be outside the repository" >&2; exit 2;; esac
mkdir -p "$DIR"
log() { echo "[bench_llamacpp] $*" >&2; }
# shellcheck source=scripts/bench_lib.sh
. "$ROOT/scripts/bench_lib.sh"
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p colibri)

# --- 1. llama.cpp ---------------------------------------------------------------------------
LBIN=$DIR/build/bin
if [ ! -x "$LBIN/llama-bench" ] || [ ! -x "$LBIN/llama-quantize" ]; then
  if ! ls "$DIR"/sdist/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    # Only this package from source: `--no-binary :all:` would also build its build
    # dependencies (cmake itself) from source just to read the sdist's metadata.
    "$PYTHON" -m pip download -q --no-binary llama-cpp-python --no-deps llama-cpp-python -d "$DIR/sdist"
  fi
  SDIST=$(ls "$DIR"/sdist/llama_cpp_python-*.tar.gz | tail -1)
  SRC_TOP=$DIR/$(basename "$SDIST" .tar.gz)
  [ -d "$SRC_TOP" ] || tar xzf "$SDIST" -C "$DIR"
  log "building llama-bench and llama-quantize from $(basename "$SDIST") (once)"
  llama_cmake "$SRC_TOP/vendor/llama.cpp" "$DIR/build" "" llama-bench llama-quantize -- -DGGML_NATIVE=ON
fi
LLAMA_SRC=$(ls -d "$DIR"/llama_cpp_python-*/vendor/llama.cpp | tail -1)

# --- 2. the checkpoint, both ways ------------------------------------------------------------
# Sets NAME, HF, INT4 and GGUF for family $1, making what is missing.
prepare() {
  NAME=$1-${LAYERS}x${EXPERTS}
  HF=$DIR/$NAME
  INT4=$DIR/$NAME-int4
  GGUF=$DIR/$NAME-Q4_0.gguf
  if [ ! -f "$INT4/.done" ] || [ ! -f "$GGUF" ]; then
    if [ ! -f "$HF/.done" ]; then
      log "making the BF16 checkpoint $HF"
      "$PYTHON" "$ROOT/scripts/bench_llamacpp_checkpoint.py" "$HF" "$LAYERS" "$EXPERTS" "$1"
      touch "$HF/.done"
    fi
    if [ ! -f "$INT4/.done" ]; then
      log "colibri convert -> $INT4"
      "$BIN" convert --from "$HF" --to "$INT4" >&2
      touch "$INT4/.done"
    fi
    if [ ! -f "$GGUF" ]; then
      log "convert_hf_to_gguf.py + llama-quantize Q4_0 -> $GGUF"
      # The tokenizer is make_fixtures.py's byte-level BPE: the converter identifies a BPE
      # pre-tokenizer by the hash of a test string's ids, which only published tokenizers have;
      # its pre-tokenizer is GPT-2's byte-level split, so that is the name it is given.
      "$PYTHON" - "$LLAMA_SRC" "$HF" "$DIR/$NAME-BF16.gguf" <<'PY' >&2
import runpy, sys
src, hf, out = sys.argv[1:4]
sys.path[:0] = [src, src + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
# Its DeepSeek-V3.2 vocabulary step only asserts that the tokenizer adds a BOS token (DeepSeek's
# does; this test tokenizer has none) before taking the same GPT-2 path.
from conversion import deepseek
deepseek.DeepseekV32Model.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = [src + "/convert_hf_to_gguf.py", hf, "--outtype", "bf16", "--outfile", out]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
PY
      "$LBIN/llama-quantize" "$DIR/$NAME-BF16.gguf" "$GGUF.part" Q4_0 "$THREADS" >"$DIR/quantize.log" 2>&1
      mv "$GGUF.part" "$GGUF"
      rm -f "$DIR/$NAME-BF16.gguf"
    fi
  fi
  if [ "$KEEP_BF16" = 0 ] && [ -d "$HF" ]; then
    log "both conversions exist: deleting the BF16 checkpoint $HF (KEEP_BF16=1 keeps it)"
    rm -rf "$HF"
  fi
}


# --- llama-bench without AMX where the CPU has it (bench_lib.sh) ------------------------------
build_llama_noamx "$LLAMA_SRC"

# --- 3 and 4: warm pairs (decode, pp64, pp512), then decode under a memory cgroup ---------
# Steps 3 and 4 for the family prepare() set up.
bench_family() {
  COLI=("$BIN" bench --snap "$INT4" --threads "$THREADS" --no-membw --no-disk-probe)
  LLAMA=("$LBIN/llama-bench" -m "$GGUF" -t "$THREADS" -r 1)
  INT4_BYTES=$(du -cb "$INT4"/*.safetensors | tail -1 | cut -f1)
  GGUF_BYTES=$(stat -c %s "$GGUF")
  echo
  echo "# model: $NAME BF16 -> colibri int4 $(awk "BEGIN{printf \"%.2f\", $INT4_BYTES/1e9}") GB, GGUF Q4_0 $(awk "BEGIN{printf \"%.2f\", $GGUF_BYTES/1e9}") GB; llama.cpp from $(basename "$(dirname "$(dirname "$LLAMA_SRC")")")"
  warm_pairs
  [ "$MEM" = 1 ] || return 0
  for share in 0.5 0.75; do
    cb=$(python3 -c "print(int($INT4_BYTES * $share))")
    lb=$(python3 -c "print(int($GGUF_BYTES * $share))")
    echo "## decode under a memory cgroup at ${share}x the model ($(awk "BEGIN{printf \"%.2f\", $cb/1e9}") GB colibri, $(awk "BEGIN{printf \"%.2f\", $lb/1e9}") GB llama.cpp), cold page cache | $(load)"
    mem_pairs "$cb" "$lb" "$INT4" "$INT4"/*.safetensors "$GGUF"
  done
}

echo "# scripts/bench_llamacpp.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $THREADS threads each"
echo "# colibri $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?)"
for family in $FAMILIES; do
  prepare "$family"
  if [ "$PREPARE_ONLY" = 1 ]; then log "prepared: $INT4 and $GGUF"; continue; fi
  bench_family
done
