#!/usr/bin/env bash
# llama.cpp's teacher-forced top-1 agreement with the transformers oracle on the committed
# K-quant / IQ GGUFs (tests/fixtures/gguf/kq-qwen3-moe-*.gguf, scripts/make_gguf_fixtures.sh),
# beside colibri's on the same files and cases: the bar of issue 49 ("quantized GGUFs agree with
# the f32 oracle at least as well as llama.cpp does on the same file"). llama.cpp computes its
# figure itself: scripts/gguf_agreement/tf_agree.cpp, one llama_decode over the case's
# full_ids with every position's logits, linked against a llama.cpp CPU build's static
# libraries. Writes scripts/gguf_agreement.out.md.
#
#   scripts/gguf_agreement.sh
#     LLAMA_BUILD: a llama.cpp CMake build folder (static, CPU) holding libllama.a and
#                  libggml*.a, of the same sdist as make_gguf_fixtures.sh; without it the
#                  sdist's `llama` target is built into $GGUF_WORK/llama-build.
#     COLIBRI: the colibri binary (default target/release/colibri).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/work/venv-fixtures/bin/python}
DIR=${GGUF_WORK:-/tmp/colibri-gguf-fixtures}
COLIBRI=${COLIBRI:-$ROOT/target/release/colibri}
MODEL=kq-qwen3-moe
REF=$ROOT/tests/fixtures/$MODEL/ref.json
OUTMD=$ROOT/scripts/gguf_agreement.out.md
SDIST=$(ls "$DIR"/sdist/llama_cpp_python-*.tar.gz | tail -1)
SRC=$DIR/$(basename "$SDIST" .tar.gz)/vendor/llama.cpp
BUILD=${LLAMA_BUILD:-$DIR/llama-build}
# make_gguf_fixtures.sh extracts only the converter: the headers (and sources) are wanted here.
[ -f "$SRC/include/llama.h" ] || tar xzf "$SDIST" -C "$DIR"
if [ -z "$(find "$BUILD" -name libllama.a 2>/dev/null)" ]; then
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target llama
fi
lib() { find "$BUILD" -name "$1" | head -1; }
TF=$DIR/tf_agree
g++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" \
  "$ROOT/scripts/gguf_agreement/tf_agree.cpp" -o "$TF" "$(lib libllama.a)" "$(lib libggml.a)" \
  "$(lib libggml-cpu.a)" "$(lib libggml-base.a)" -lpthread -fopenmp -ldl
"$PYTHON" -c "
import json
r = json.load(open('$REF'))
for c in ('short', 'long'):
    print(' '.join(map(str, r[c]['full_ids'])), '|', ' '.join(map(str, r[c]['tf_pred'])))
" >"$DIR/$MODEL-ids.txt"

# The transformers oracle on each file's dequantized weights (gguf_agreement/dequantized_oracle.py):
# the figure of a computation exactly as stored. It needs the fixture's safetensors, which are
# not committed (make_family_fixtures.py kq-qwen3-moe remakes them) and torch.
EXACT=$DIR/$MODEL-exact.txt
: >"$EXACT"
if [ -f "$ROOT/tests/fixtures/$MODEL/model.safetensors" ]; then
  "$PYTHON" "$ROOT/scripts/gguf_agreement/dequantized_oracle.py" "$ROOT/tests/fixtures/$MODEL" \
    "$ROOT"/tests/fixtures/gguf/$MODEL-*.gguf 2>/dev/null >"$EXACT"
fi
exact() { awk -v f="$1" -v c="$2" '$1 == f { print $(c + 1) }' "$EXACT"; }

# colibri's tf=a/b for FILE CASE ACT (validate exits 1 when not exact: only its line counts).
ours() {
  "$COLIBRI" validate --snap "$1" --ref "$REF" --case "$2" --act "$3" 2>/dev/null \
    | tail -1 | sed -n 's/^VALIDATE \(tf=[0-9]*\/[0-9]*\).*/\1/p' | cut -d= -f2
}
{
  echo "# Teacher-forced top-1 agreement with the transformers oracle, llama.cpp vs colibri"
  echo
  echo "Made by scripts/gguf_agreement.sh on $(date -u +%Y-%m-%d) from tests/fixtures/gguf/$MODEL-*.gguf"
  echo "(llama.cpp of $(basename "$(dirname "$(dirname "$SRC")")"), on the cases of tests/fixtures/$MODEL/ref.json)."
  echo "Each cell: positions whose argmax is the oracle's, over the case's full_ids (short, long)."
  echo "colibri int8: llama.cpp-style 8-bit activation blocks (the default); f32: --act f32."
  echo "exact: transformers in float32 on the file's weights as the gguf package dequantizes them."
  echo
  echo "| file | tensor types | exact short | exact long | llama.cpp short | llama.cpp long | colibri int8 short | colibri int8 long | colibri f32 short | colibri f32 long |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for f in "$ROOT"/tests/fixtures/gguf/$MODEL-*.gguf; do
    name=$(basename "$f" .gguf); name=${name#$MODEL-}
    types=$("$PYTHON" -c "
import collections, sys
sys.path.insert(0, '$SRC/gguf-py')
import gguf
c = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader('$f').tensors)
print(' '.join(f'{k}x{v}' for k, v in sorted(c.items())))")
    mapfile -t ll < <("$TF" "$f" <"$DIR/$MODEL-ids.txt")
    echo "| $name | $types | $(exact "$(basename "$f")" 1) | $(exact "$(basename "$f")" 2) | ${ll[0]} | ${ll[1]} | $(ours "$f" short int8) | $(ours "$f" long int8) | $(ours "$f" short f32) | $(ours "$f" long f32) |"
  done
  # The 32-element block types of the 64-wide GLM-4.5 fixture (the converter's Q8_0 and
  # requantize.py's pure files, tests/tests/gguf.rs's older test), llama.cpp's glm4moe beside ours.
  GLM=tiny-glm4-moe
  "$PYTHON" -c "
import json
r = json.load(open('$ROOT/tests/fixtures/$GLM/ref.json'))
for c in ('short', 'long'):
    print(' '.join(map(str, r[c]['full_ids'])), '|', ' '.join(map(str, r[c]['tf_pred'])))
" >"$DIR/$GLM-ids.txt"
  echo
  echo "The 64-wide $GLM fixture's files, on the cases of tests/fixtures/$GLM/ref.json:"
  echo
  echo "| file | llama.cpp short | llama.cpp long | colibri int8 short | colibri int8 long | colibri f32 short | colibri f32 long |"
  echo "|---|---|---|---|---|---|---|"
  for t in q8_0 q5_1 q4_0 iq4_nl mxfp4; do
    f=$ROOT/tests/fixtures/gguf/$GLM-$t.gguf
    mapfile -t ll < <("$TF" "$f" <"$DIR/$GLM-ids.txt")
    echo "| $t | ${ll[0]} | ${ll[1]} | $(REF=$ROOT/tests/fixtures/$GLM/ref.json ours "$f" short int8) | $(REF=$ROOT/tests/fixtures/$GLM/ref.json ours "$f" long int8) | $(REF=$ROOT/tests/fixtures/$GLM/ref.json ours "$f" short f32) | $(REF=$ROOT/tests/fixtures/$GLM/ref.json ours "$f" long f32) |"
  done
} | tee "$OUTMD"
