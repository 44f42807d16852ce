#!/usr/bin/env bash
# Makes the GGUF fixtures of `--snap FILE.gguf` (tests/fixtures/gguf/tiny-*.gguf) from the
# tiny safetensors fixtures with llama.cpp's own converter, convert_hf_to_gguf.py, taken from
# the llama-cpp-python sdist on PyPI (the converter and its gguf-py; nothing is built). CI
# never runs this: the outputs are committed.
#
#   scripts/make_gguf_fixtures.sh [PYTHON]     (PYTHON: one with torch + transformers)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${1:-/work/venv-fixtures/bin/python}
DIR=${GGUF_WORK:-/tmp/colibri-gguf-fixtures}
OUT=$ROOT/tests/fixtures/gguf
mkdir -p "$DIR/sdist" "$OUT"
if ! ls "$DIR"/sdist/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
  "$PYTHON" -m pip download -q --no-binary llama-cpp-python --no-deps llama-cpp-python -d "$DIR/sdist"
fi
SDIST=$(ls "$DIR"/sdist/llama_cpp_python-*.tar.gz | tail -1)
TOP=$DIR/$(basename "$SDIST" .tar.gz)
[ -d "$TOP/vendor/llama.cpp/ggml" ] || tar xzf "$SDIST" -C "$DIR" --wildcards \
  '*/vendor/llama.cpp/convert_hf_to_gguf.py' '*/vendor/llama.cpp/gguf-py/*' \
  '*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/ggml/*'
SRC=$TOP/vendor/llama.cpp

# convert FIXTURE OUTTYPE [FROM]: tests/fixtures/FIXTURE (or folder FROM) ->
# tests/fixtures/gguf/FIXTURE-OUTTYPE.gguf
convert() {
  "$PYTHON" - "$SRC" "${3:-$ROOT/tests/fixtures/$1}" "$OUT/$1-$2.gguf" "$2" <<'PY'
import runpy, sys
src, hf, out, outtype = sys.argv[1:5]
# OUTTYPE-split: the same model as a split set of at most 40 tensors a part (what llama.cpp's
# gguf-split writes: NAME-00001-of-0000N.gguf).
split = outtype.endswith("-split")
outtype = outtype.removesuffix("-split")
sys.path[:0] = [src, src + "/gguf-py"]
from conversion import base
# The fixtures' tokenizer is make_fixtures.py's byte-level BPE: the converter names a BPE
# pre-tokenizer by the hash of a test string's ids, which only published tokenizers have; its
# pre-tokenizer is GPT-2's byte-level split, so that is the name it is given.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
# DeepSeek-V3's published config.json says `scoring_func: sigmoid` (the converter writes it as
# expert_gating_func 2); transformers' tiny config has no such key, so it is added here.
load = base.ModelBase.load_hparams
def load_hparams(dir_model, is_mistral_format):
    c = load(dir_model, is_mistral_format)
    if c.get("model_type") in ("deepseek_v3", "deepseek_v32"):
        c.setdefault("scoring_func", "sigmoid")
    # MiniMax-M2's published config.json says `scoring_func: sigmoid` and `rotary_dim` (llama.cpp
    # reads the router from the one and has no default for it; the converter requires the
    # other); transformers' tiny configs give the rotary width as partial_rotary_factor only.
    if c.get("model_type") == "minimax_m2":
        c.setdefault("scoring_func", "sigmoid")
        rope = c.get("rope_parameters") or {}
        if "rotary_dim" not in c and "partial_rotary_factor" in rope:
            c["rotary_dim"] = int(c["head_dim"] * rope["partial_rotary_factor"])
    # GLM-5's and DeepSeek-V3.2's transformers configs place the dense layers by
    # `mlp_layer_types`, which the converter does not read: it writes `first_k_dense_replace`
    # (llama.cpp's leading_dense_block_count), which a tiny config may leave contradicting the
    # list (tiny-dense-shared: 3 against one leading "dense"). The published configs agree;
    # here the key is made to say what the list says, as long as the dense layers lead.
    types = c.get("mlp_layer_types")
    if c.get("model_type") in ("glm_moe_dsa", "deepseek_v32") and types:
        lead = next((i for i, t in enumerate(types) if t != "dense"), len(types))
        assert all(t == "sparse" for t in types[lead:]), types
        c["first_k_dense_replace"] = lead
    # DeepSeek-V4's converter reads the keys of DeepSeek's published config.json, which the
    # tiny published-layout fixture gives the transformers 5 way: `num_hash_layers` (there
    # `mlp_layer_types`, hash layers first), `compress_ratios` (one per layer: 0, or the rate
    # of its `layer_types` entry in `compress_rates`) and the compressed layers' YaRN as a
    # top-level `rope_scaling` over `rope_theta` (there nested in `rope_parameters.compress`
    # and `.main`, which the converter does not read: it would write plain RoPE for them).
    if c.get("model_type") == "deepseek_v4":
        types = c["mlp_layer_types"]
        hashed = next((i for i, t in enumerate(types) if t != "hash_moe"), len(types))
        assert all(t == "moe" for t in types[hashed:]), types
        c["num_hash_layers"] = hashed
        rates = {"sliding_attention": 0, **c["compress_rates"]}
        c["compress_ratios"] = [rates[t] for t in c["layer_types"]]
        rope = c.pop("rope_parameters")
        comp = rope["compress"]
        c["rope_theta"] = rope["main"]["rope_theta"]
        c["compress_rope_theta"] = comp["rope_theta"]
        c["rope_scaling"] = {k: comp[k] for k in ("factor", "original_max_position_embeddings",
                                                  "beta_fast", "beta_slow")} | {"type": comp["rope_type"]}
    return c
base.ModelBase.load_hparams = staticmethod(load_hparams)
# gpt-oss's and MiniMax-M2's published config.json give one eos_token_id (gpt-oss <|return|>,
# MiniMax-M2 [e~[); transformers' tiny configs give a list, which gguf-py's SpecialVocab skips
# (it takes an int), so the list's first id is what it is given for these two.
import json
from pathlib import Path
import gguf
load_config = gguf.SpecialVocab._try_load_from_config_json
def try_load_from_config_json(self, path):
    c = json.loads((Path(path) / "config.json").read_text())
    eos = c.get("eos_token_id")
    if c.get("model_type") in ("gpt_oss", "minimax_m2") and isinstance(eos, list) and eos:
        self._set_special_token("eos", eos[0])
    return load_config(self, path)
gguf.SpecialVocab._try_load_from_config_json = try_load_from_config_json
# DeepSeek-V3.2's converter asserts the published tokenizer_config's `add_bos_token: true`;
# the fixtures' tokenizer has no BOS (what the oracle was run with), so the assert is skipped.
from conversion import deepseek
deepseek.DeepseekV32Model.set_vocab = lambda self: self._set_vocab_gpt2()
# DeepSeek-V4: the converter knows the attention's kv norm as `attn.kv_norm`; the published
# fixture (and transformers' conversion mapping, which reads `.norm.` as kv_norm) has
# `attn.norm`. It writes the FP8 matrices, dequantized, as Q8_0 whatever the outtype (a
# requantization); the f32 fixture keeps them in F32 (e4m3 x a power of two is exact there),
# so it holds the published weights bit for bit; the q8_0 one is what the converter writes.
V4 = deepseek.DeepseekV4Model
v4_map = V4._map_dsv4_tensor_name
def map_dsv4(self, name, bid):
    if name.endswith(".attn.norm.weight"):
        name = name.removesuffix(".attn.norm.weight") + ".attn.kv_norm.weight"
    return v4_map(self, name, bid)
V4._map_dsv4_tensor_name = map_dsv4
v4_quant = V4.tensor_force_quant
def force_quant(self, name, new_name, bid, n_dims):
    if outtype == "f32" and name in self._dsv4_fp8_dequantized:
        return gguf.GGMLQuantizationType.F32
    return v4_quant(self, name, new_name, bid, n_dims)
V4.tensor_force_quant = force_quant
sys.argv = [src + "/convert_hf_to_gguf.py", hf, "--outtype", outtype, "--outfile", out]
if split:
    sys.argv += ["--split-max-tensors", "40"]
# Qwen3.5's converter counts the MTP block into its blocks and asserts it has one when the
# config has no mtp_num_hidden_layers; the tiny fixture has none, so it is converted as the
# text model without the draft head (`--no-mtp`, what a published GGUF without it is).
import json
c = json.load(open(hf + "/config.json"))
if c.get("model_type", "").startswith("qwen3_5") and not c.get("mtp_num_hidden_layers"):
    sys.argv.append("--no-mtp")
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
PY
}

# FIXTURE:OUTTYPE pairs. llama.cpp's qwen3moe has no dense layers, hence the all-sparse Qwen3
# fixture; the Q8_0 one is what colibri refuses until it computes GGUF's quantized types.
# DeepSeek-V3 is llama.cpp's deepseek2, kv_b_proj split into attn_k_b / attn_v_b; GLM-5
# (glm-dsa: tiny-moe-bias with attention biases, tiny-dense-shared with a dense layer and shared
# indexers) and DeepSeek-V3.2 (deepseek32) are the same MLA plus the DSA indexer. gpt-oss's
# converter de-interleaves the fused gate_up into ffn_gate_exps / ffn_up_exps; of the MXFP4
# fixture it repacks the published experts into ggml's MXFP4 blocks (the rest stays F32:
# tiny-gpt-oss-mxfp4-f32.gguf holds MXFP4 experts). Qwen3.5-MoE is qwen35moe (its DeltaNet's
# tensors transformed: daemon/src/gguf/qwen35.rs), in Q8_0 too. DeepSeek-V4 is deepseek4, of
# the published-layout fixture (the one its converter reads): FP4 experts repacked to MXFP4,
# FP8 matrices F32 (exact) in the f32 file and Q8_0 (the converter's default) in the other.
for pair in ${PAIRS-tiny-glm4-moe:f32 tiny-glm4-moe:q8_0 tiny-glm4-moe:f32-split tiny-qwen3-moe-sparse:f32 tiny-deepseek-v3:f32 tiny-moe-bias:f32 tiny-dense-shared:f32 tiny-deepseek-v32:f32 kq-qwen3-moe:f32 tiny-gpt-oss:f32 tiny-gpt-oss-mxfp4:f32 tiny-minimax-m2:f32 tiny-minimax-m2-gqa:f32 tiny-qwen35-moe:f32 tiny-qwen35-moe:q8_0 tiny-deepseek-v4-published:f32 tiny-deepseek-v4-published:q8_0}; do
  convert "${pair%%:*}" "${pair##*:}"
done
# GLM-5 with an MTP block, which llama.cpp's glm-dsa keeps (blk.N past the trunk, its nextn.*
# beside a whole layer): tiny-moe-bias plus a layer 3 holding layer 2's weights and the head's
# own (eh_proj, enorm, hnorm, shared_head.norm; seeded). Greedy output is the trunk's whatever
# the head drafts, so the oracle is tiny-moe-bias's. MTP= (empty) skips it.
if [ -n "${MTP-tiny-moe-bias}" ]; then
  "$PYTHON" - "$ROOT/tests/fixtures/tiny-moe-bias" "$DIR/tiny-moe-bias-mtp" <<'PY'
import json, shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
c = json.loads((src / "config.json").read_text())
n = c["num_hidden_layers"]
c["num_nextn_predict_layers"] = 1
(dst / "config.json").write_text(json.dumps(c, indent=2))
shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
w = {}
for f in sorted(src.glob("*.safetensors")):
    w.update(load_file(f))
last = f"model.layers.{n - 1}."
for k in [k for k in w if k.startswith(last)]:
    w[f"model.layers.{n}." + k[len(last):]] = w[k].clone()
g = torch.Generator().manual_seed(49)
h = c["hidden_size"]
w[f"model.layers.{n}.eh_proj.weight"] = torch.randn(h, 2 * h, generator=g) * 0.05
for k in ("enorm", "hnorm", "shared_head.norm"):
    w[f"model.layers.{n}.{k}.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
save_file(w, dst / "model.safetensors")
PY
  convert tiny-moe-bias-mtp f32 "$DIR/tiny-moe-bias-mtp"
fi
# Qwen3.5-MoE with its MTP block, as a published checkpoint has it (`mtp.fc`, the two
# pre-fc norms, `mtp.norm`, `mtp.layers.0` a full-attention layer: here layer 1's weights;
# seeded) and the converter writes it without `--no-mtp` (blk.3, nextn_predict_layers 1).
# colibri has no Qwen3.5 draft head, so the block must be left unread; the trunk is
# tiny-qwen35-moe's, and so is the oracle. QWEN_MTP= (empty) skips it.
if [ -n "${QWEN_MTP-tiny-qwen35-moe}" ]; then
  "$PYTHON" - "$ROOT/tests/fixtures/tiny-qwen35-moe" "$DIR/tiny-qwen35-moe-mtp" <<'PY'
import json, shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
c = json.loads((src / "config.json").read_text())
c["mtp_num_hidden_layers"] = 1
(dst / "config.json").write_text(json.dumps(c, indent=2))
shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
w = load_file(src / "model.safetensors")
full = c["layer_types"].index("full_attention")
lead = f"model.layers.{full}."
for k in [k for k in w if k.startswith(lead)]:
    w["mtp.layers.0." + k[len(lead):]] = w[k].clone()
g = torch.Generator().manual_seed(52)
h = c["hidden_size"]
w["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=g) * 0.05
for k in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
    w[f"mtp.{k}.weight"] = 0.1 * torch.randn(h, generator=g)
save_file(w, dst / "model.safetensors")
PY
  convert tiny-qwen35-moe-mtp f32 "$DIR/tiny-qwen35-moe-mtp"
fi
# Quantized types the converter does not write, made from the F32 GGUF with llama.cpp's own
# quantizers (scripts/ggml_dot/requantize.py: llama-quantize's --pure, without building it).
# The tiny GLM's rows are 32 and 64 wide: the 32-element block types.
for pair in ${QPAIRS-tiny-glm4-moe:Q4_0 tiny-glm4-moe:Q5_1 tiny-glm4-moe:IQ4_NL tiny-glm4-moe:MXFP4}; do
  m=${pair%%:*} t=${pair##*:}
  "$PYTHON" "$ROOT/scripts/ggml_dot/requantize.py" "$SRC" "$OUT/$m-f32.gguf" \
    "$OUT/$m-$(echo "$t" | tr 'A-Z' 'a-z').gguf" "$t"
done
# The K-quant and IQ types (256-value super-blocks) by llama.cpp's own llama-quantize, of the
# Qwen3 fixture whose every quantized matrix is a multiple of 256 wide (make_family_fixtures.py
# kq-qwen3-moe; its safetensors are not committed, the F32 GGUF holds the same weights):
# every type --pure (each matrix in it) except the real mixed recipes Q4_K_M, Q5_K_M and Q3_K_M
# (Q4_K/Q5_K/Q3_K with Q6_K/Q5_K/Q4_K on attn_v and ffn_down as llama.cpp picks them). The
# importance matrix is llama-imatrix's over make_fixtures.py's CORPUS, output included
# (--process-output; --pure's low-bit output needs it); it has no entry for token_embd (a row
# lookup, not a product), so the types that refuse a matrix without one (IQ2_*, IQ1_S) keep
# token_embd in Q4_K. llama-quantize's IQ2_S recipe is IQ2_XS tensors; its IQ2_M --pure is the
# IQ2_S tensors, so that is the file for IQ2_S (kq-qwen3-moe-iq2_m.gguf). Then what gguf-py
# dequantizes each of their tensors to (scripts/kq_dequant_reference.py). LLAMA_BIN: a folder
# holding llama-quantize and llama-imatrix; without it they are built (CPU, Release) from the
# same sdist into $DIR/llama-build. KQ= skips this; PAIRS= or QPAIRS= (empty) skip theirs.
KQ=${KQ-kq-qwen3-moe}
if [ -n "$KQ" ]; then
  LLAMA_BIN=${LLAMA_BIN:-$DIR/llama-build/bin}
  if [ ! -x "$LLAMA_BIN/llama-quantize" ] || [ ! -x "$LLAMA_BIN/llama-imatrix" ]; then
    [ -f "$SRC/CMakeLists.txt" ] || tar xzf "$SDIST" -C "$DIR"
    cmake -S "$SRC" -B "$DIR/llama-build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
      -DBUILD_SHARED_LIBS=OFF >/dev/null
    cmake --build "$DIR/llama-build" -j"$(nproc)" --target llama-quantize llama-imatrix llama
    LLAMA_BIN=$DIR/llama-build/bin
  fi
  F32=$OUT/$KQ-f32.gguf
  [ -f "$F32" ] || convert "$KQ" f32
  "$PYTHON" -c "import sys; sys.path.insert(0, '$ROOT/scripts'); from make_fixtures import CORPUS
open('$DIR/corpus.txt', 'w').write(CORPUS)"
  "$LLAMA_BIN/llama-imatrix" -m "$F32" -f "$DIR/corpus.txt" -o "$DIR/$KQ-imatrix.gguf" -c 64 \
    -t 2 --process-output >"$DIR/$KQ-imatrix.log" 2>&1
  for t in Q4_K_M Q5_K_M Q3_K_M Q6_K Q2_K IQ4_XS IQ3_XXS IQ3_S IQ2_XXS IQ2_XS IQ2_M IQ1_S IQ1_M; do
    case $t in
      *_K_M) flags=() ;;
      IQ2_*|IQ1_S) flags=(--pure --token-embedding-type q4_k) ;;
      *) flags=(--pure) ;;
    esac
    "$LLAMA_BIN/llama-quantize" "${flags[@]}" --imatrix "$DIR/$KQ-imatrix.gguf" "$F32" \
      "$OUT/$KQ-$(echo "$t" | tr 'A-Z' 'a-z').gguf" "$t" 2 >"$DIR/$KQ-$t.log" 2>&1
  done
  "$PYTHON" "$ROOT/scripts/kq_dequant_reference.py"
fi
# llama.cpp's portable dot products on every type (the unit tests' bit-exact reference);
# REF=0 skips it (only some fixtures remade).
if [ "${REF:-1}" != 0 ]; then
  "$PYTHON" "$ROOT/scripts/ggml_dot/make_reference.py" "$SRC"
fi
ls -la "$OUT"/tiny-*.gguf
