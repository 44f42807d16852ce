#!/usr/bin/env bash
# colibri beside llama.cpp on the same GGUF file (issue 49), alternated in one run:
#
#   scripts/bench_gguf.sh [PAIRS]                 # PAIRS alternated pairs per warm figure (3)
#   scripts/bench_gguf.sh prepare                 # steps 1 and 2 only
#   FAMILIES="qwen3_moe glm4_moe deepseek_v3" TYPES="Q4_K_M Q8_0" scripts/bench_gguf.sh
#
# 1. llama.cpp as scripts/bench_llamacpp.sh builds it (the llama-cpp-python sdist's
#    vendor/llama.cpp from PyPI, CPU only, once, in $COLI_BENCH_DIR): llama-bench,
#    llama-quantize and llama-imatrix, and on a CPU with AMX llama-bench without AMX too
#    (bench_lib.sh's llama_ts);
# 2. per family of FAMILIES, a BF16 checkpoint of issue 38's shape
#    (scripts/bench_llamacpp_checkpoint.py: LAYERS layers of EXPERTS experts of 768, top 8,
#    hidden 2048, random weights, the family's own attention), converted to a BF16 GGUF by
#    llama.cpp's convert_hf_to_gguf.py, then to each type of TYPES by llama-quantize: Q4_K_M,
#    Q8_0, IQ2_XXS (which llama-quantize refuses without an importance matrix: one is made
#    by llama-imatrix from a generated text) and MXFP4 (llama-quantize's MXFP4_MOE: the experts
#    in MXFP4, the rest Q8_0); the BF16 files are deleted once every type exists (KEEP_BF16=1);
# 3. per file, both engines on it: warm decode (llama-bench -p 0 -n GEN beside colibri bench
#    --snap FILE.gguf --gen-tokens GEN), pp64 and pp512, THREADS threads each, PAIRS pairs whose
#    order alternates, each pair printed and the median of the ratios (colibri / llama.cpp);
# 4. decode under a memory cgroup at 0.5x and 0.75x of the file, its pages dropped from the
#    page cache first (cold): tok/s, and for colibri the hit rate, reads per token and the disk
#    probe. llama.cpp gets MEM_TIMEOUT seconds to decode MEM_GEN_LLAMA tokens.
# `uptime` is printed with each section: the machine is shared.
#
# env: COLI_BENCH_DIR (scratch, outside the repository; ~/.cache/colibri-bench, shared with
# bench_llamacpp.sh's llama.cpp build), PYTHON (with torch, transformers, safetensors, numpy),
# THREADS (2), LAYERS (12), EXPERTS (64), GEN (64), MEM (1: step 4), MEM_PAIRS (1), MEM_GEN
# (64), MEM_GEN_LLAMA (16), MEM_TIMEOUT (300), BIN (colibri), FAMILIES (qwen3_moe),
# TYPES (Q4_K_M Q8_0 IQ2_XXS MXFP4), LBIN (a llama.cpp build's bin/ instead of building one),
# COLI_MEM_ARGS (more colibri bench options in the cgroups, e.g. "--ram-reserve-gb 0.1"),
# LLAMA_MEM_ARGS (llama-bench options there; "--repack 0" unless set).
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
MEM=${MEM:-1}
MEM_PAIRS=${MEM_PAIRS:-1}
MEM_GEN=${MEM_GEN:-64}
MEM_GEN_LLAMA=${MEM_GEN_LLAMA:-16}
MEM_TIMEOUT=${MEM_TIMEOUT:-300}
FAMILIES=${FAMILIES:-qwen3_moe}
TYPES=${TYPES:-Q4_K_M Q8_0 IQ2_XXS MXFP4}
KEEP_BF16=${KEEP_BF16:-0}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/colibri}
case "$DIR" in "$ROOT"|"$ROOT"/*) echo "COLI_BENCH_DIR must be outside the repository" >&2; exit 2;; esac
mkdir -p "$DIR"
log() { echo "[bench_gguf] $*" >&2; }
# shellcheck source=scripts/bench_lib.sh
. "$ROOT/scripts/bench_lib.sh"
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p colibri)

# --- 1. llama.cpp (bench_llamacpp.sh's build, plus llama-imatrix) ----------------------------
LBIN=${LBIN:-$DIR/build/bin}
if [ ! -x "$LBIN/llama-bench" ] || [ ! -x "$LBIN/llama-quantize" ] || [ ! -x "$LBIN/llama-imatrix" ]; then
  if ! ls "$DIR"/sdist/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    "$PYTHON" -m pip download -q --no-binary llama-cpp-python --no-deps llama-cpp-python -d "$DIR/sdist"
  fi
  SDIST=$(ls "$DIR"/sdist/llama_cpp_python-*.tar.gz | tail -1)
  SRC_TOP=$DIR/$(basename "$SDIST" .tar.gz)
  [ -d "$SRC_TOP" ] || tar xzf "$SDIST" -C "$DIR"
  log "building llama-bench, llama-quantize and llama-imatrix from $(basename "$SDIST") (once)"
  llama_cmake "$SRC_TOP/vendor/llama.cpp" "$DIR/build" "" llama-bench llama-quantize llama-imatrix -- -DGGML_NATIVE=ON
  LBIN=$DIR/build/bin
fi
LLAMA_SRC=$(ls -d "$DIR"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | tail -1)

# --- 2. the GGUFs ----------------------------------------------------------------------------
# Sets NAME and FILES (one GGUF per type) for family $1, making what is missing.
prepare() {
  NAME=$1-${LAYERS}x${EXPERTS}
  local hf=$DIR/$NAME bf16=$DIR/$NAME-BF16.gguf t missing=0
  FILES=()
  for t in $TYPES; do
    FILES+=("$DIR/$NAME-$t.gguf")
    [ -f "$DIR/$NAME-$t.gguf" ] || missing=1
  done
  [ "$missing" = 1 ] || return 0
  if [ ! -f "$bf16" ]; then
    if [ ! -f "$hf/.done" ]; then
      log "making the BF16 checkpoint $hf"
      "$PYTHON" "$ROOT/scripts/bench_llamacpp_checkpoint.py" "$hf" "$LAYERS" "$EXPERTS" "$1"
      touch "$hf/.done"
    fi
    log "convert_hf_to_gguf.py -> $bf16"
    # The tokenizer is make_fixtures.py's byte-level BPE, whose pre-tokenizer the converter
    # cannot identify by hash: it is GPT-2's (as in bench_llamacpp.sh); DeepSeek-V3's router is
    # a sigmoid, which transformers' config does not say (as in make_gguf_fixtures.sh).
    "$PYTHON" - "$LLAMA_SRC" "$hf" "$bf16.part" <<'PY' >&2
import runpy, sys
src, hf, out = sys.argv[1:4]
sys.path[:0] = [src, src + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
load = base.ModelBase.load_hparams
def load_hparams(dir_model, is_mistral_format):
    c = load(dir_model, is_mistral_format)
    if c.get("model_type") == "deepseek_v3":
        c.setdefault("scoring_func", "sigmoid")
    return c
base.ModelBase.load_hparams = staticmethod(load_hparams)
sys.argv = [src + "/convert_hf_to_gguf.py", hf, "--outtype", "bf16", "--outfile", out]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
PY
    mv "$bf16.part" "$bf16"
  fi
  for t in $TYPES; do
    local out=$DIR/$NAME-$t.gguf qt=$t extra=()
    [ -f "$out" ] && continue
    [ "$t" = MXFP4 ] && qt=MXFP4_MOE
    if [ "$t" = IQ2_XXS ]; then
      # llama-quantize refuses the 2-bit IQ types without an importance matrix: one from a
      # generated text (random weights: any text weighs the columns as well as another).
      local imat=$DIR/$NAME.imatrix
      if [ ! -f "$imat" ]; then
        "$PYTHON" -c 'import random; random.seed(1); w="the sea wind sails over deep blue water and sings of far islands".split(); print(" ".join(random.choice(w) for _ in range(20000)))' >"$DIR/imatrix.txt"
        "$LBIN/llama-imatrix" -m "$bf16" -f "$DIR/imatrix.txt" -o "$imat" -c 128 --chunks 8 \
          -t "$THREADS" >"$DIR/imatrix.log" 2>&1
      fi
      extra=(--imatrix "$imat")
    fi
    log "llama-quantize $qt -> $out"
    "$LBIN/llama-quantize" "${extra[@]}" "$bf16" "$out.part" "$qt" "$THREADS" >"$DIR/quantize-$t.log" 2>&1
    mv "$out.part" "$out"
  done
  if [ "$KEEP_BF16" = 0 ]; then
    log "every type exists: deleting $bf16 and $hf (KEEP_BF16=1 keeps them)"
    rm -rf "$bf16" "$hf"
  fi
}

# --- llama-bench without AMX where the CPU has it (bench_lib.sh) ------------------------------
build_llama_noamx "$LLAMA_SRC"

# --- 3. warm: decode, pp64, pp512 ------------------------------------------------------------

# --- 4. under a memory cgroup ----------------------------------------------------------------
bench_file() {
  local file=$1 bytes share b
  COLI=("$BIN" bench --snap "$file" --threads "$THREADS" --no-membw --no-disk-probe)
  LLAMA=("$LBIN/llama-bench" -m "$file" -t "$THREADS" -r 1)
  bytes=$(stat -c %s "$file")
  echo
  echo "# $(basename "$file"): $(awk "BEGIN{printf \"%.2f\", $bytes/1e9}") GB, the same file for both"
  warm_pairs
  [ "$MEM" = 1 ] || return 0
  for share in 0.5 0.75; do
    b=$(python3 -c "print(int($bytes * $share))")
    echo "## decode under a memory cgroup at ${share}x the file ($(awk "BEGIN{printf \"%.2f\", $b/1e9}") GB), cold page cache | $(load)"
    mem_pairs "$b" "$b" "$file" "$file"
  done
}

echo "# scripts/bench_gguf.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $THREADS threads each"
echo "# colibri $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?)"
for family in $FAMILIES; do
  prepare "$family"
  if [ "$PREPARE_ONLY" = 1 ]; then log "prepared: ${FILES[*]}"; continue; fi
  for f in "${FILES[@]}"; do bench_file "$f"; done
done
