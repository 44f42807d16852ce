#!/usr/bin/env python3
"""A GGUF Q4_0 with Qwen3-30B-A3B's shapes and random values, for the llama.cpp side of the
real-shape pair (issue 50 item 4; the colibri side is `colibri plan --measure`'s int4 model).

    /work/venv-fixtures/bin/python scripts/gguf_real_shape.py OUT.gguf [--config FILE]
        [--layers N] [--seed S]

Written tensor by tensor (the largest, one layer's 128 experts of one projection, is 113 MB at
Q4_0), so the whole model is never in RAM. Every matrix is Q4_0 (random 4-bit codes, one f16
scale per 32), norms are 1.0, the router is f32.

The values follow `plan --measure`'s writer (daemon/src/cmd/plan/write.rs, `weight_std` and the
router's fill) so that both sides route alike: a weight's spread is 1/sqrt(fan_in), the
embedding's rows ~1, o_proj and down_proj smaller by 1/sqrt(2 layers), the router uniform in
+-0.02. Qwen3-MoE's softmax router has no correction bias, so, as in the writer, no further
skew is added: its routing is as random as its weights.

The tokenizer is a made-up SentencePiece vocabulary of the config's size (<unk>, <s>, </s>, the
256 byte pieces, then placeholders): llama-bench only feeds token ids.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import gguf

QK = 32  # Q4_0: 32 weights per block, an f16 scale and 16 bytes of 4-bit codes
BLOCK_BYTES = 2 + QK // 2
# The spread of a uniform 4-bit code around its middle (8): sqrt(16^2 / 12).
CODE_STD = math.sqrt(16 * 16 / 12)


def q4_0(rng, rows, cols, std, lead=()):
    """Random Q4_0 bytes of a [*lead, rows, cols] matrix whose weights spread `std`."""
    assert cols % QK == 0, f"{cols} columns is not a multiple of {QK}"
    blocks = int(np.prod(lead, dtype=np.int64)) * rows * (cols // QK)
    out = np.empty((blocks, BLOCK_BYTES), dtype=np.uint8)
    # Each block's scale gets a random sign: the codes average 7.5 against Q4_0's middle of 8,
    # and with one sign every matrix would add a common offset that grows layer after layer
    # until every token routes the same way (the bug `plan --measure`'s writer had).
    sign = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=blocks)
    scale = (sign * np.float32(std / CODE_STD)).astype(np.float16)
    out[:, :2] = scale.view(np.uint8).reshape(blocks, 2)
    out[:, 2:] = rng.integers(0, 256, size=(blocks, QK // 2), dtype=np.uint8)
    return out.reshape(*lead, rows, cols // QK * BLOCK_BYTES)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument(
        "--config",
        default=os.path.join(here, "..", "tests", "fixtures", "configs", "qwen3-30b-a3b.json"),
    )
    ap.add_argument("--layers", type=int, default=None, help="only the first N layers")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    c = json.load(open(a.config))
    if c.get("model_type") != "qwen3_moe":
        sys.exit(f"{a.config}: model_type {c.get('model_type')!r}, this writes qwen3_moe only")
    layers = c["num_hidden_layers"] if a.layers is None else a.layers
    if not 1 <= layers <= c["num_hidden_layers"]:
        sys.exit(f"--layers {layers}: the config has 1..={c['num_hidden_layers']}")
    h, vocab = c["hidden_size"], c["vocab_size"]
    heads, kv_heads, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    n_exp, top_k, inter = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    if os.path.exists(a.out):
        sys.exit(f"{a.out} exists: give a new file")

    arch = "qwen3moe"
    w = gguf.GGUFWriter(a.out, arch)
    w.add_name("random qwen3-30b-a3b shapes")
    w.add_block_count(layers)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_expert_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(n_exp)
    w.add_expert_used_count(top_k)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # A SentencePiece vocabulary of the config's size.
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [f"t{i}".encode() for i in range(len(tokens), vocab)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    # (name, numpy shape of the stored bytes or values, dtype, maker)
    rng = np.random.default_rng(a.seed)
    plan = []

    def quant(name, rows, cols, std, lead=()):
        nbytes = int(np.prod(lead, dtype=np.int64)) * rows * (cols // QK) * BLOCK_BYTES
        shape = (*lead, rows, cols // QK * BLOCK_BYTES)
        plan.append((name, shape, np.uint8, nbytes, gguf.GGMLQuantizationType.Q4_0,
                     lambda: q4_0(rng, rows, cols, std, lead)))

    def f32(name, shape, make):
        n = int(np.prod(shape))
        plan.append((name, shape, np.float32, 4 * n, None, make))

    resid = 1.0 / math.sqrt(2 * layers)  # o_proj and down_proj, as the writer's weight_std
    quant("token_embd.weight", vocab, h, 1.0)
    for l in range(layers):
        b = f"blk.{l}"
        f32(f"{b}.attn_norm.weight", (h,), lambda: np.ones(h, np.float32))
        quant(f"{b}.attn_q.weight", heads * hd, h, 1 / math.sqrt(h))
        quant(f"{b}.attn_k.weight", kv_heads * hd, h, 1 / math.sqrt(h))
        quant(f"{b}.attn_v.weight", kv_heads * hd, h, 1 / math.sqrt(h))
        quant(f"{b}.attn_output.weight", h, heads * hd, resid / math.sqrt(heads * hd))
        f32(f"{b}.attn_q_norm.weight", (hd,), lambda: np.ones(hd, np.float32))
        f32(f"{b}.attn_k_norm.weight", (hd,), lambda: np.ones(hd, np.float32))
        f32(f"{b}.ffn_norm.weight", (h,), lambda: np.ones(h, np.float32))
        f32(f"{b}.ffn_gate_inp.weight", (n_exp, h),
            lambda: rng.uniform(-0.02, 0.02, size=(n_exp, h)).astype(np.float32))
        quant(f"{b}.ffn_gate_exps.weight", inter, h, 1 / math.sqrt(h), (n_exp,))
        quant(f"{b}.ffn_up_exps.weight", inter, h, 1 / math.sqrt(h), (n_exp,))
        quant(f"{b}.ffn_down_exps.weight", h, inter, resid / math.sqrt(inter), (n_exp,))
    f32("output_norm.weight", (h,), lambda: np.ones(h, np.float32))
    quant("output.weight", vocab, h, 1 / math.sqrt(h))

    for name, shape, dtype, nbytes, raw, _ in plan:
        w.add_tensor_info(name, shape, np.dtype(dtype), nbytes, raw_dtype=raw)
    total = sum(p[3] for p in plan)
    print(f"{a.out}: {layers} layers, {len(plan)} tensors, {total / 1e9:.2f} GB", file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    done = 0
    for i, (name, _, _, nbytes, _, make) in enumerate(plan):
        w.write_tensor_data(make())
        done += nbytes
        if i % 20 == 0 or i == len(plan) - 1:
            print(f"  {done / 1e9:.2f} / {total / 1e9:.2f} GB ({name})", file=sys.stderr)
    w.close()


if __name__ == "__main__":
    main()
