#!/usr/bin/env python3
"""Differential sweep of `colibri validate` against transformers over tiny configs per family.

For each family (glm_moe_dsa, deepseek_v3, deepseek_v32, glm4_moe, qwen3_moe, minimax_m2, gpt_oss,
qwen3_5_moe, deepseek_v4) a small base config is moved one knob at a time (every value a published
checkpoint or model card uses,
and a few more), then through random combinations of knobs. Each point is drawn at several
seeds: a random model in float32 with eager attention (the fixture machinery of
scripts/make_fixtures.py and scripts/make_family_fixtures.py: same tokenizer, weight draw,
cases and ref.json layout), written to a temporary directory, checked with
`colibri validate --snap DIR --ref DIR/ref.json --case C` on a short and a long case (and,
with --long-tokens N, on a prompt of N tokens), then deleted.

Unlike the fixtures no seed is skipped for small margins: a random tiny model can have
near-ties (top-1/top-2 logits, the router's or the indexer's top-k boundary). A mismatch at
one seed that vanishes at another is classed a tie, one that persists at every seed a BUG;
the smallest margin seen is printed beside each row. deepseek_v32 references keep the
earliest keys at an indexer tie (colibri's stated rule, `tie_rule: earliest`), so its ties
at exactly 0.0 are defined; validate's `INDEXER ... boundary_ties` count is printed too.

    ../venv-fixtures/bin/python scripts/sweep_families.py                      # every family, knobs
    ../venv-fixtures/bin/python scripts/sweep_families.py --family qwen3_moe --seeds 3
    ../venv-fixtures/bin/python scripts/sweep_families.py --random 10 --jobs 2 --out t.md
    ../venv-fixtures/bin/python scripts/sweep_families.py --long-tokens 2048 --knob yarn
    ../venv-fixtures/bin/python scripts/sweep_families.py --seeds 3 --random 30 --control \
        --jobs 2 --compact        # the first table of scripts/sweep_families.out.md

--knob NAME keeps the knobs whose name contains NAME (base always runs); --control adds a
point per family whose config.json is edited after the reference ran, which must come out
BUG (the sweep can see a difference); --compact prints one row per point. Exit status 1 when
a point other than a control is BUG or errs.

Verdicts per point: exact (every seed, every case), tie (a mismatch at some seed only),
BUG (a mismatch at every seed, except where every mismatching case of a reference made
by torch.topk had the indexer's cut inside a tie: `mismatch@index-tie`, a tie), refused (colibri would not load it: the reason), skip
(transformers itself rejects the config).
"""
import argparse
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import transformers
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_family_fixtures as mff  # noqa: E402
import make_fixture_minimax  # noqa: E402,F401  (adds minimax_m2 and its router probe to mff)
import make_fixture_gpt_oss as mgo  # noqa: E402
import make_fixture_qwen35 as mq35  # noqa: E402
import make_fixture_deepseek_v4 as mdv4  # noqa: E402
import make_fixtures as mf  # noqa: E402

ROOT = mf.ROOT
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

FAMILIES = dict(mff.FAMILIES)
FAMILIES["glm_moe_dsa"] = dict(config=GlmMoeDsaConfig, model=GlmMoeDsaForCausalLM,
                               specials=mf.SPECIALS, chat=mff.glm4_chat,
                               eos=("<|endoftext|>", "<|user|>", "<|observation|>"))
# gpt-oss: the saved (fused) experts are split per expert as `colibri convert` writes them
# (make_fixture_gpt_oss.write_split) before validate reads the folder.
FAMILIES["gpt_oss"] = dict(config=transformers.GptOssConfig, model=transformers.GptOssForCausalLM,
                           specials=mgo.SPECIALS, chat=mgo.harmony, eos=mgo.EOS)
FAMILIES["qwen3_5_moe"] = dict(config=mq35.Qwen3_5MoeTextConfig, model=mq35.Qwen3_5MoeForCausalLM,
                               specials=mq35.SPECIALS, chat=mq35.chatml,
                               eos=("<|im_end|>", "<|endoftext|>"))

FAMILIES["deepseek_v4"] = dict(config=transformers.DeepseekV4Config,
                               model=transformers.DeepseekV4ForCausalLM,
                               specials=mff.DEEPSEEK_SPECIALS, chat=mff.deepseek_chat,
                               eos=("<｜end▁of▁sentence｜>",))

STDS = {"default": 0.05, "mlp.gate.weight": 0.5, "router_bias": 0.1}
STDS_DSA = dict(STDS, **{"indexer.wq_b": 0.3, "indexer.wk": 0.3, "indexer.weights_proj": 0.5})

YARN_DS = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
           "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
           "mscale": 1.0, "mscale_all_dim": 1.0}
# YaRN whose original context (32) the long case runs past, so the ramp matters.
YARN_SHORT = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
              "original_max_position_embeddings": 32}

MLA = dict(hidden_size=48, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=3,
           first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
           q_lora_rank=24, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
           v_head_dim=16, n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3,
           n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6,
           attention_bias=False, tie_word_embeddings=False)

MINIMAX_ROPE = {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5}

GPT_OSS_STDS = {"default": 0.05, "q_proj": 0.1, "k_proj": 0.1, "router.weight": 0.5,
                "experts": 0.05}

# Qwen3.5-MoE's draws (scripts/make_fixture_qwen35.py): zero-centred norms, A_log, dt_bias.
STDS_Q35 = {"default": 0.05, "mlp.gate.weight": 0.3, "conv1d": 0.3}
Q35_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": [1, 1, 0], "mrope_interleaved": True}

# DeepSeek-V4's fixture layout (scripts/make_fixture_deepseek_v4.py): sliding, CSA, HCA, CSA
# layers, hash-routed then score-routed experts, 3 hyper-connection streams.
DSV4_TYPES = ["sliding_attention", "compressed_sparse_attention",
              "heavily_compressed_attention", "compressed_sparse_attention"]

BASES = {
    "deepseek_v4": dict(stds=mdv4.STDS, config=dict(mdv4.CONFIG)),
    # MiniMax-M2's layout: GQA with q/k norm over the whole projection, half of each head
    # rotated (rotary_dim 64 of 128), sigmoid router with correction bias, no shared expert.
    "minimax_m2": dict(stds=STDS, config=dict(
        hidden_size=32, intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=dict(MINIMAX_ROPE))),
    # gpt-oss-20b's layout: GQA with sinks and biases, sliding window on the even layers,
    # YaRN (untruncated, over an original context the long case runs past), a biased router
    # softmaxed over its top k, biased experts with the clamped SwiGLU.
    "gpt_oss": dict(stds=GPT_OSS_STDS, config=dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
        rms_norm_eps=1e-5, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2, swiglu_limit=7.0,
        attention_bias=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 32})),
    # Qwen3.5 / 3.6's layout, shrunk: DeltaNet, DeltaNet, gated attention (grouped values and
    # grouped queries), a quarter of each head rotated, a gated shared expert.
    "qwen3_5_moe": dict(stds=STDS_Q35, config=dict(
        hidden_size=32, num_hidden_layers=3,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-6, tie_word_embeddings=False,
        attention_bias=False, rope_parameters=dict(Q35_ROPE))),
    # Qwen3-30B-A3B's layout: GQA, q/k norm, softmax router, no shared expert.
    "qwen3_moe": dict(stds=STDS, config=dict(
        hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        attention_bias=False)),
    # GLM-4.5's layout: biased q/k/v, partial rotary 0.5, sigmoid router, a shared expert.
    "glm4_moe": dict(stds=STDS, config=dict(
        hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=2.5, n_group=1,
        topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, use_qk_norm=False,
        attention_bias=True, partial_rotary_factor=0.5, rms_norm_eps=1e-5,
        rope_theta=1000000.0, tie_word_embeddings=False)),
    # DeepSeek-V3 / R1 / V3.1 / Kimi K2: MLA, expert groups, YaRN as published.
    "deepseek_v3": dict(stds=STDS, config=dict(MLA, rope_interleave=True,
                                               rope_parameters=dict(YARN_DS))),
    # DeepSeek-V3.2: the same plus the DSA indexer.
    "deepseek_v32": dict(stds=STDS_DSA, tie_rule="earliest", config=dict(
        MLA, rope_interleave=True, rope_parameters=dict(YARN_DS), index_topk=16,
        index_head_dim=16, index_n_heads=8)),
    # GLM-5: MLA + DSA indexer, shared-indexer layers, the first layer dense.
    "glm_moe_dsa": dict(stds=STDS_DSA, config=dict(
        hidden_size=48, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=3,
        mlp_layer_types=["dense", "sparse", "sparse"], indexer_types=["full", "shared", "full"],
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, q_lora_rank=24, kv_lora_rank=24, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, index_topk=16, index_head_dim=16, index_n_heads=16,
        routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False)),
}

# Knobs: name -> overrides of the base config. "vocab" and "legacy_rope" are not config keys:
# the tokenizer's size and the spelling of RoPE in the saved config.json.
COMMON = {
    "tie_word_embeddings": dict(tie_word_embeddings=True),
    "vocab=1000": dict(vocab=1000),
    "vocab=300": dict(vocab=300),
    "norm_topk_prob=false": dict(norm_topk_prob=False),
}
GQA_ROPE = {
    "rope_theta=10000": dict(rope_theta=10000.0),
    "yarn(rope_parameters)": dict(rope_parameters=None, yarn=YARN_SHORT),
    "yarn(legacy rope_scaling)": dict(rope_parameters=None, yarn=YARN_SHORT, legacy_rope=True),
    # The ramp's ends fractional and inside the rotated dims (with original 32 they clamp to
    # 0 and 1 whatever the betas).
    "yarn(legacy,orig 2048,beta8/1,untruncated)": dict(yarn=dict(
        YARN_SHORT, original_max_position_embeddings=2048, beta_fast=8.0, beta_slow=1.0,
        truncate=False), legacy_rope=True),
    # Qwen3's model cards: factor 4 over 32768, in the legacy spelling.
    "yarn(model card: factor 4, orig 32768, legacy)": dict(yarn=dict(
        YARN_SHORT, original_max_position_embeddings=32768), legacy_rope=True),
}
MLA_KNOBS = {
    "heads=8": dict(num_attention_heads=8, num_key_value_heads=8),
    "heads=2": dict(num_attention_heads=2, num_key_value_heads=2),
    "q_lora_rank=null": dict(q_lora_rank=None),
    "q_lora_rank=48": dict(q_lora_rank=48),
    "kv_lora_rank=16": dict(kv_lora_rank=16),
    "kv_lora_rank=48": dict(kv_lora_rank=48),
    "qk_nope_head_dim=8": dict(qk_nope_head_dim=8),
    "qk_nope_head_dim=32": dict(qk_nope_head_dim=32),
    "qk_rope_head_dim=16": dict(qk_rope_head_dim=16),
    "qk_rope_head_dim=4": dict(qk_rope_head_dim=4),
    "v_head_dim=8": dict(v_head_dim=8),
    "v_head_dim=32": dict(v_head_dim=32),
    "shared=0": dict(n_shared_experts=0),
    "shared=2": dict(n_shared_experts=2),
    "routed_scaling_factor=1.0": dict(routed_scaling_factor=1.0),
    "routed_scaling_factor=2.827": dict(routed_scaling_factor=2.827),
    "attention_bias=true": dict(attention_bias=True),
}
DS_KNOBS = dict(MLA_KNOBS, **{
    "n_group=1": dict(n_group=1, topk_group=1),
    "n_group=8,topk_group=4": dict(n_group=8, topk_group=4, num_experts_per_tok=4),
    "n_group=4,topk_group=1": dict(n_group=4, topk_group=1, num_experts_per_tok=2),
    "first_k_dense_replace=0": dict(first_k_dense_replace=0),
    "first_k_dense_replace=2": dict(first_k_dense_replace=2),
    "rope=default": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "rope=default,theta=50000": dict(rope_parameters={"rope_type": "default",
                                                      "rope_theta": 50000.0}),
    "yarn(legacy rope_scaling)": dict(legacy_rope=True),
    "yarn(orig 32, factor 4)": dict(rope_parameters=dict(YARN_DS, factor=4.0,
                                                         original_max_position_embeddings=32)),
    "yarn(Kimi K2: factor 32)": dict(rope_parameters=dict(YARN_DS, factor=32.0)),
    "yarn(mscale 0.707)": dict(rope_parameters=dict(YARN_DS, factor=4.0,
                                                    original_max_position_embeddings=32,
                                                    mscale=0.707, mscale_all_dim=0.707)),
    "yarn(mscale_all_dim 0)": dict(rope_parameters=dict(YARN_DS, mscale=1.0, mscale_all_dim=0.0)),
    "rope_interleave=false": dict(rope_interleave=False),
    "experts=32,topk=8(K2: 384/8)": dict(n_routed_experts=32, num_experts_per_tok=8, n_group=1,
                                          topk_group=1),
    # Whole published shapes, shrunk.
    "Kimi-K2-like": dict(n_group=1, topk_group=1, n_routed_experts=32, num_experts_per_tok=8,
                         routed_scaling_factor=2.827, rope_parameters=dict(YARN_DS, factor=32.0)),
    "Moonlight-like": dict(q_lora_rank=None, n_group=1, topk_group=1, n_shared_experts=2,
                           routed_scaling_factor=2.446, vocab=1000,
                           rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
    "V2-Lite-like": dict(q_lora_rank=None, n_group=1, topk_group=1, n_shared_experts=2,
                         routed_scaling_factor=1.0, norm_topk_prob=False, legacy_rope=True,
                         rope_parameters=dict(YARN_DS, factor=4.0,
                                              original_max_position_embeddings=32,
                                              mscale=0.707, mscale_all_dim=0.707)),
}, **COMMON)

KNOBS = {
    "deepseek_v4": {
        "layer_types=all sliding": dict(layer_types=["sliding_attention"] * 4),
        "layer_types=all CSA": dict(layer_types=["compressed_sparse_attention"] * 4),
        "layer_types=all HCA": dict(layer_types=["heavily_compressed_attention"] * 4),
        "compress_rates csa=2,hca=4": dict(compress_rates={
            "compressed_sparse_attention": 2, "heavily_compressed_attention": 4}),
        "compress_rates csa=8,hca=16": dict(compress_rates={
            "compressed_sparse_attention": 8, "heavily_compressed_attention": 16}),
        "sliding_window=4": dict(sliding_window=4),
        "sliding_window=32(past every case)": dict(sliding_window=32),
        "index_topk=1": dict(index_topk=1),
        "index_topk=64(keeps all)": dict(index_topk=64),
        "hc_mult=1": dict(hc_mult=1),
        "hc_mult=4(Flash)": dict(hc_mult=4),
        "hc_sinkhorn_iters=1": dict(hc_sinkhorn_iters=1),
        "o_groups=1": dict(o_groups=1),
        "o_groups=4": dict(o_groups=4),
        "mlp_layer_types=all moe": dict(mlp_layer_types=["moe"] * 4),
        "mlp_layer_types=all hash": dict(mlp_layer_types=["hash_moe"] * 4),
        "scoring_func=sigmoid": dict(scoring_func="sigmoid"),
        "swiglu_limit=10(Flash)": dict(swiglu_limit=10.0),
        "head_dim=32(rope 16)": dict(head_dim=32),
        "rope=default(no yarn)": dict(rope_parameters=None),
        "experts=16,topk=4": dict(n_routed_experts=16, num_experts_per_tok=4),
        "tie_word_embeddings": dict(tie_word_embeddings=True),
    },
    "gpt_oss": dict({
        "sliding_window=4": dict(sliding_window=4),
        "sliding_window=128(20b/120b)": dict(sliding_window=128),
        "layer_types=all sliding": dict(layer_types=["sliding_attention"] * 4),
        "layer_types=all full": dict(layer_types=["full_attention"] * 4),
        "layer_types=[f,s,f,s]": dict(layer_types=["full_attention", "sliding_attention"] * 2),
        "swiglu_limit=0.5(clamps)": dict(swiglu_limit=0.5),
        "swiglu_alpha=1.0": dict(swiglu_alpha=1.0),
        "heads=8,kv=1(20b 64/8)": dict(num_attention_heads=8, num_key_value_heads=1, head_dim=8),
        "kv=4(MHA)": dict(num_key_value_heads=4),
        "experts=16,topk=4(20b 32/4)": dict(num_local_experts=16, num_experts_per_tok=4),
        "attention_bias=false": dict(attention_bias=False),
        "rope=default": dict(rope_parameters={"rope_type": "default", "rope_theta": 150000.0}),
        "yarn(20b: factor 32, orig 4096)": dict(rope_parameters={
            "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}),
        "yarn(legacy rope_scaling)": dict(legacy_rope=True),
        "tie_word_embeddings": dict(tie_word_embeddings=True),
        "vocab=1000": dict(vocab=1000),
    }),
    "qwen3_5_moe": {
        "layer_types=[full,linear,linear]": dict(
            layer_types=["full_attention", "linear_attention", "linear_attention"]),
        "layer_types=all linear": dict(layer_types=["linear_attention"] * 3),
        "layer_types=all full": dict(layer_types=["full_attention"] * 3),
        "full_attention_interval=2(no layer_types)": dict(layer_types=None,
                                                          full_attention_interval=2),
        "linear heads k=v=4(no grouping)": dict(linear_num_key_heads=4),
        "linear heads k=1,v=4": dict(linear_num_key_heads=1),
        "linear_key_head_dim=8": dict(linear_key_head_dim=8),
        "linear_value_head_dim=16": dict(linear_value_head_dim=16),
        "linear_conv_kernel_dim=2": dict(linear_conv_kernel_dim=2),
        "linear_conv_kernel_dim=6": dict(linear_conv_kernel_dim=6),
        "heads=8,kv=2": dict(num_attention_heads=8),
        "kv=1": dict(num_key_value_heads=1),
        "head_dim=32": dict(head_dim=32),
        "partial_rotary_factor=0.5": dict(rope_parameters=dict(Q35_ROPE,
                                                               partial_rotary_factor=0.5)),
        "partial_rotary_factor=1.0": dict(rope_parameters=dict(Q35_ROPE,
                                                               partial_rotary_factor=1.0)),
        "rope_theta=10000": dict(rope_parameters=dict(Q35_ROPE, rope_theta=10000.0)),
        "experts=16,topk=4": dict(num_experts=16, num_experts_per_tok=4),
        "shared_expert_intermediate_size=16": dict(shared_expert_intermediate_size=16),
        "attention_bias=true": dict(attention_bias=True),
        "tie_word_embeddings": dict(tie_word_embeddings=True),
        "vocab=1000": dict(vocab=1000),
    },
    "qwen3_moe": dict({
        "heads=8,kv=2": dict(num_attention_heads=8),
        "heads=16,kv=4(30B-A3B 32/4)": dict(num_attention_heads=16, num_key_value_heads=4,
                                            head_dim=8),
        "kv=1": dict(num_key_value_heads=1),
        "heads=16,kv=1(235B-A22B 64/4)": dict(num_attention_heads=16, num_key_value_heads=1,
                                              head_dim=8),
        "heads=12,kv=1(Coder-480B 96/8)": dict(num_attention_heads=12, num_key_value_heads=1,
                                               head_dim=8),
        "kv=4(MHA)": dict(num_key_value_heads=4),
        "head_dim=8": dict(head_dim=8),
        "head_dim=32": dict(head_dim=32),
        "experts=16,topk=4": dict(num_experts=16, num_experts_per_tok=4),
        "decoder_sparse_step=2": dict(decoder_sparse_step=2),
        "mlp_only_layers=[0]": dict(mlp_only_layers=[0]),
        "mlp_only_layers=[1]": dict(mlp_only_layers=[1]),
        "step=2,mlp_only=[0]": dict(decoder_sparse_step=2, mlp_only_layers=[0]),
        "attention_bias=true": dict(attention_bias=True),
    }, **GQA_ROPE, **COMMON),
    "glm4_moe": dict({
        "heads=12,kv=1": dict(num_attention_heads=12, num_key_value_heads=1, head_dim=8),
        "heads=8,kv=2": dict(num_attention_heads=8),
        "kv=4(MHA)": dict(num_key_value_heads=4),
        "head_dim=32": dict(head_dim=32),
        "head_dim=8": dict(head_dim=8),
        "shared=0": dict(n_shared_experts=0),
        "shared=2": dict(n_shared_experts=2),
        "n_group=4,topk_group=2": dict(n_routed_experts=16, n_group=4, topk_group=2,
                                       num_experts_per_tok=3),
        "routed_scaling_factor=1.0": dict(routed_scaling_factor=1.0),
        "first_k_dense_replace=0": dict(first_k_dense_replace=0),
        "first_k_dense_replace=2": dict(first_k_dense_replace=2),
        "use_qk_norm=true": dict(use_qk_norm=True),
        "attention_bias=false": dict(attention_bias=False),
        "partial_rotary_factor=1.0": dict(partial_rotary_factor=1.0),
        "head_dim=32(rope 16)": dict(head_dim=32),
        # Legacy spelling with partial_rotary_factor inside rope_scaling (transformers 5 reads
        # it there; GLM-4.5's own config.json has it at the top level).
        "partial_rotary_factor=0.25 in rope_scaling": dict(partial_rotary_factor=0.25,
                                                           legacy_rope="all"),
        "yarn+partial=1.0 in rope_scaling": dict(partial_rotary_factor=1.0, yarn=YARN_SHORT,
                                                 legacy_rope="all"),
    }, **GQA_ROPE, **COMMON),
    "minimax_m2": dict({
        "heads=12,kv=2,head_dim=8(M2 48/8)": dict(num_attention_heads=12, num_key_value_heads=2,
                                                   head_dim=8),
        "kv=1": dict(num_key_value_heads=1),
        "kv=4(MHA)": dict(num_key_value_heads=4),
        "head_dim=32": dict(head_dim=32),
        "head_dim=8": dict(head_dim=8),
        "partial_rotary_factor=1.0": dict(partial_rotary_factor=1.0),
        "head_dim=32(rope 16)": dict(head_dim=32),
        "experts=16,topk=4": dict(num_local_experts=16, num_experts_per_tok=4),
        "topk=1": dict(num_experts_per_tok=1),
        "rms_norm_eps=1e-5": dict(rms_norm_eps=1e-5),
        "rope_theta=10000": dict(rope_theta=10000.0),
        "yarn(rope_parameters, full rotary)": dict(yarn=YARN_SHORT),
        "tie_word_embeddings": dict(tie_word_embeddings=True),
        "vocab=1000": dict(vocab=1000),
        "vocab=300": dict(vocab=300),
    }),
    "deepseek_v3": DS_KNOBS,
    "deepseek_v32": dict({k: v for k, v in DS_KNOBS.items()  # transformers: q_lora_rank int
                          if k not in ("q_lora_rank=null", "Moonlight-like", "V2-Lite-like")}, **{
        "index_n_heads=4": dict(index_n_heads=4),
        "index_n_heads=16": dict(index_n_heads=16),
        # The reference as transformers makes it (torch.topk at the cut, arbitrary among
        # equal scores) instead of the earliest-key rule: ties at 0.0 may then differ.
        "index_n_heads=4,ref torch.topk": dict(index_n_heads=4, tie_rule=None),
        "index_n_heads=2,ref torch.topk": dict(index_n_heads=2, tie_rule=None),
        "index_head_dim=32": dict(index_head_dim=32),
        "index_head_dim=8": dict(index_head_dim=8),
        "index_topk=8": dict(index_topk=8),
        "index_topk=32": dict(index_topk=32),
        "mlp_layer_types=[s,d,s]": dict(mlp_layer_types=["sparse", "dense", "sparse"]),
        "mlp_layer_types=[d,d,s]": dict(mlp_layer_types=["dense", "dense", "sparse"]),
        "mlp_layer_types=[s,s,s]": dict(mlp_layer_types=["sparse", "sparse", "sparse"]),
    }),
    "glm_moe_dsa": dict({
        "heads=8": dict(num_attention_heads=8, num_key_value_heads=8),
        "q_lora_rank=48": dict(q_lora_rank=48),
        "kv_lora_rank=16": dict(kv_lora_rank=16),
        "qk_nope_head_dim=8": dict(qk_nope_head_dim=8),
        "qk_rope_head_dim=16": dict(qk_rope_head_dim=16),
        "v_head_dim=32": dict(v_head_dim=32),
        "shared=0": dict(n_shared_experts=0),
        "shared=2": dict(n_shared_experts=2),
        "routed_scaling_factor=1.0": dict(routed_scaling_factor=1.0),
        "attention_bias=true": dict(attention_bias=True),
        "index_n_heads=32": dict(index_n_heads=32),
        "index_n_heads=8": dict(index_n_heads=8),
        "index_head_dim=32": dict(index_head_dim=32),
        "index_topk=8": dict(index_topk=8),
        "indexer_types=[f,f,f]": dict(indexer_types=["full", "full", "full"]),
        "indexer_types=[f,s,s]": dict(indexer_types=["full", "shared", "shared"]),
        "mlp_layer_types=[s,s,s]": dict(mlp_layer_types=["sparse", "sparse", "sparse"]),
        "mlp_layer_types=[d,d,s]": dict(mlp_layer_types=["dense", "dense", "sparse"]),
        "n_group=4,topk_group=2": dict(n_group=4, topk_group=2),
        "rope_theta=1e6": dict(rope_theta=1000000.0),
        "first_k_dense_replace=2(no mlp_layer_types)": dict(mlp_layer_types=None,
                                                             first_k_dense_replace=2),
        "yarn(orig 32, factor 4)": dict(rope_theta=None, rope_parameters=dict(
            YARN_DS, factor=4.0, original_max_position_embeddings=32)),
    }, **COMMON),
}


def point_config(family, overrides):
    """The base config of `family` with `overrides`; returns (config kwargs, extras)."""
    base = BASES[family]
    cfg = copy.deepcopy(base["config"])
    extra = {"vocab": 400, "legacy_rope": False, "tamper": None, "stds": base["stds"],
             "tie_rule": base.get("tie_rule")}
    for k, v in overrides.items():
        if k in ("vocab", "legacy_rope", "tamper", "tie_rule"):
            extra[k] = v
        elif k == "yarn":
            # YaRN over the family's own theta (and rotary share), in rope_parameters.
            rp = dict(v)
            rp["rope_theta"] = cfg.pop("rope_theta", rp["rope_theta"])
            if "partial_rotary_factor" in cfg:
                rp["partial_rotary_factor"] = cfg.pop("partial_rotary_factor")
            cfg["rope_parameters"] = rp
        elif v is None and k in ("rope_parameters", "mlp_layer_types", "rope_theta",
                                 "layer_types"):
            cfg.pop(k, None)
        elif k == "rope_theta" and "rope_parameters" in cfg:
            cfg["rope_parameters"]["rope_theta"] = v
        elif k == "partial_rotary_factor" and "rope_parameters" in cfg:
            cfg["rope_parameters"]["partial_rotary_factor"] = v
        else:
            cfg[k] = v
    n = cfg["num_hidden_layers"]
    for key in ("mlp_layer_types", "indexer_types"):
        if key in cfg and len(cfg[key]) != n:
            cfg[key] = (cfg[key] * n)[:n]
    return cfg, extra


_TOKS = {}


def tokenizer(family, vocab):
    key = (family, vocab)
    if key not in _TOKS:
        _TOKS[key] = mf.make_tokenizer(vocab, FAMILIES[family]["specials"])
    return _TOKS[key]


def run_case(family, model, pids, n_new, tie_rule, index_topk):
    """(case, logits, min margin, reference boundary ties) by the fixture scripts' run_case."""
    if family == "glm_moe_dsa":
        case, logits, gaps = mf.run_case(model, pids, n_new, index_topk)
        ties = None
    elif family == "gpt_oss":
        case, logits, gaps = mgo.run_case(model, pids, n_new)
    elif family == "qwen3_5_moe":
        case, logits, gaps = mq35.run_case(model, pids, n_new)
        ties = None
    elif family == "deepseek_v4":
        case, logits, gaps = mdv4.run_case(model, pids, n_new)
        ties = None
    else:
        case, logits, gaps = mff.run_case(model, pids, n_new, tie_rule)
        ties = case.get("index_boundary_ties")
    margins = [g for k, g in gaps.items() if k in ("logit", "router", "indexer") and g is not None]
    return case, logits, (min(margins) if margins else None), ties


def legacy_rope(path, config_class, config, keep_partial=True):
    """make_family_fixtures.legacy_rope, except that partial_rotary_factor stays at the top
    level as transformers 4 wrote it (GLM-4.5's config.json), unless keep_partial is false
    (then it goes into `rope_scaling` with the rest, which transformers 5 reads too)."""
    cfg = json.loads(path.read_text())
    params = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = params.pop("rope_theta")
    if keep_partial and "partial_rotary_factor" in params:
        cfg["partial_rotary_factor"] = params.pop("partial_rotary_factor")
    cfg["rope_scaling"] = params
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    back = config_class.from_pretrained(path.parent)
    assert back.rope_parameters == config.rope_parameters, (back.rope_parameters,
                                                            config.rope_parameters)


def build_and_check(task):
    """One (family, point, seed): draw, run transformers, write, validate, delete."""
    family, name, overrides, seed, colibri, long_tokens = task
    t0 = time.time()
    row = dict(family=family, point=name, seed=seed, cases={}, verdict=None, note="")
    fam = FAMILIES[family]
    cfg, extra = point_config(family, overrides)
    tmp = Path(tempfile.mkdtemp(prefix="sweep-"))
    try:
        tok = tokenizer(family, extra["vocab"])
        vocab = tok.get_vocab_size()
        eos = [tok.token_to_id(s) for s in fam["eos"]]
        cfg.update(vocab_size=vocab, eos_token_id=eos, bos_token_id=None, pad_token_id=None)
        cfg.setdefault("max_position_embeddings", max(4096, (long_tokens or 0) + 64))
        short_ids = tok.encode(fam["chat"]("Hello! How are you today?")).ids
        long_ids = tok.encode(fam["chat"](mf.LONG_TEXT)).ids[:48]
        plan = [("short", short_ids, 10), ("long", long_ids, 16)]
        if long_tokens:
            body = tok.encode(mf.LONG_TEXT + " ").ids
            ids = tok.encode(fam["chat"]("")).ids[:4]
            while len(ids) < long_tokens:
                ids += body
            plan.append((f"long{long_tokens}", ids[:long_tokens], 4))
        try:
            torch.manual_seed(seed)
            config = fam["config"](**cfg)
            config._attn_implementation = "eager"
            model = fam["model"](config).float().eval()
        except Exception as e:  # noqa: BLE001
            row["verdict"] = "skip"
            row["note"] = f"transformers: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            return row
        if family == "qwen3_5_moe":
            mq35.redraw(model, seed, extra["stds"])
        elif family == "deepseek_v4":
            mdv4.redraw(model, seed, extra["stds"])
        else:
            mf.redraw(model, seed, extra["stds"])
        if family == "gpt_oss":
            mgo.draw_sinks(model, seed)
        if config.tie_word_embeddings:
            model.tie_weights()
        ref = {"meta": {"seed": seed, "family": family, "point": name}}
        margins = []
        for cname, pids, n_new in plan:
            try:
                case, logits, margin, ties = run_case(family, model, pids, n_new,
                                                      extra["tie_rule"], cfg.get("index_topk"))
            except Exception as e:  # noqa: BLE001
                row["verdict"] = "skip"
                row["note"] = (f"transformers forward: {type(e).__name__}: "
                               f"{str(e).splitlines()[0][:160]}")
                return row
            if margin is not None:
                margins.append(margin)
            fname = f"logits_{cname}.f32"
            logits.tofile(tmp / fname)
            case["logits_file"] = fname
            ref[cname] = case
            row["cases"][cname] = {"ref_ties": ties}
        row["margin"] = min(margins) if margins else None
        model.save_pretrained(tmp, safe_serialization=True)
        (tmp / "generation_config.json").unlink(missing_ok=True)
        if family == "gpt_oss":
            mgo.write_split(tmp, tmp)
        if extra["legacy_rope"]:
            try:
                legacy_rope(tmp / "config.json", fam["config"], config,
                            keep_partial=extra["legacy_rope"] != "all")
            except AssertionError as e:
                row["verdict"] = "skip"
                row["note"] = f"legacy spelling reads back differently: {str(e)[:160]}"
                return row
        if extra["tamper"]:
            # The control: config.json says something the reference model did not do.
            saved = json.loads((tmp / "config.json").read_text())
            saved.update(extra["tamper"])
            (tmp / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "ref.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
        for cname, _, _ in plan:
            p = subprocess.run([colibri, "validate", "--snap", str(tmp), "--ref",
                                str(tmp / "ref.json"), "--case", cname],
                               capture_output=True, text=True, timeout=1800)
            lines = p.stdout.strip().splitlines()
            last = lines[-1] if lines else ""
            c = row["cases"][cname]
            if not last.startswith("VALIDATE ") or p.returncode not in (0, 1):
                err = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("[")]
                err = err or p.stderr.strip().splitlines() or [f"exit {p.returncode}"]
                row["verdict"] = "refused"
                row["note"] = err[-1][:240]
                return row
            f = dict(kv.split("=", 1) for kv in last.split()[1:])
            c["tf"], c["gen"] = f["tf"], f["gen"]
            for ln in lines:
                if ln.startswith("INDEXER "):
                    g = dict(kv.split("=", 1) for kv in ln.split()[1:])
                    c["ties"] = int(g["boundary_ties"])
                if ln.startswith("LOGITS "):
                    g = dict(kv.split("=", 1) for kv in ln.split()[1:])
                    c["max_abs"] = float(g["max_abs"])
            c["exact"] = all(a == b for a, b in (c["tf"].split("/"), c["gen"].split("/")))
        row["verdict"] = "exact" if all(c["exact"] for c in row["cases"].values()) else "mismatch"
        # A reference made by torch.topk (no stated tie rule) is undefined where colibri saw
        # the indexer's cut fall inside a tie: a mismatch in such a case is that tie.
        if row["verdict"] == "mismatch" and extra["tie_rule"] is None and all(
                c["exact"] or c.get("ties", 0) > 0 for c in row["cases"].values()):
            row["verdict"] = "mismatch@index-tie"
        return row
    except Exception as e:  # noqa: BLE001
        row["verdict"] = "error"
        row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        traceback.print_exc()
        return row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        row["secs"] = round(time.time() - t0, 1)


def init_worker(threads):
    torch.set_num_threads(threads)


def classify(rows):
    """A point's verdict over its seeds."""
    vs = [r["verdict"] for r in rows]
    if "skip" in vs:
        return "skip"
    if "refused" in vs:
        return "refused"
    if "error" in vs:
        return "error"
    if all(v == "exact" for v in vs):
        return "exact"
    if any(v == "exact" for v in vs):
        return "tie"
    if all(v in ("exact", "mismatch@index-tie") for v in vs):
        return "tie"
    return "BUG"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", choices=sorted(BASES),
                    help="only this family (repeatable; default all)")
    ap.add_argument("--knob", action="append", help="only knobs whose name contains this")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per point (default 2)")
    ap.add_argument("--no-knobs", action="store_true", help="skip the one-knob points")
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="N random combinations of 2-4 knobs per family")
    ap.add_argument("--control", action="store_true",
                    help="add a negative control per family (config.json edited after the "
                         "reference ran: must come out BUG)")
    ap.add_argument("--random-seed", type=int, default=46)
    ap.add_argument("--long-tokens", type=int, default=0, metavar="N",
                    help="also a prompt of N tokens (4 generated)")
    ap.add_argument("--colibri", default=str(ROOT / "target" / "release" / "colibri"))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", help="write the markdown table here too")
    ap.add_argument("--compact", action="store_true",
                    help="one table row per point (teacher-forced and generated matches "
                         "summed over the cases, per seed) instead of one per seed")
    args = ap.parse_args()

    families = args.family or ["glm_moe_dsa", "deepseek_v3", "deepseek_v32", "glm4_moe",
                               "qwen3_moe", "minimax_m2", "gpt_oss", "qwen3_5_moe",
                               "deepseek_v4"]
    rng = random.Random(args.random_seed)
    t0 = time.time()
    results = []
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    ex = ProcessPoolExecutor(args.jobs, initializer=init_worker, initargs=(threads,))

    def run_points(pts):
        tasks = [(fam, name, ov, seed, args.colibri, args.long_tokens)
                 for fam, name, ov in pts for seed in range(1, args.seeds + 1)]
        print(f"# {len(pts)} points x {args.seeds} seeds = {len(tasks)} runs, jobs {args.jobs}",
              file=sys.stderr)
        for i, row in enumerate(ex.map(build_and_check, tasks)):
            results.append(row)
            cs = " ".join(f"{k}:{c.get('tf', '-')},{c.get('gen', '-')}"
                          for k, c in row["cases"].items())
            print(f"[{i + 1}/{len(tasks)} {time.time() - t0:.0f}s] {row['family']} "
                  f"{row['point']} s{row['seed']}: {row['verdict']} {cs} {row['note']}",
                  file=sys.stderr, flush=True)

    # One knob at a time (and the controls) first; the random combinations then draw from
    # the knobs that were neither refused nor rejected by transformers on their own.
    points = []
    for fam in families:
        if not args.no_knobs:
            points.append((fam, "base", {}))
            for name, ov in KNOBS[fam].items():
                if not args.knob or any(k in name for k in args.knob):
                    points.append((fam, name, ov))
        if args.control:
            points.append((fam, "CONTROL: config.json edited after the reference", {
                "tamper": {"norm_topk_prob": False} if fam == "qwen3_moe"
                # MiniMax-M2 reads no routed_scaling_factor: its rotary share changes instead.
                else {"rope_parameters": dict(MINIMAX_ROPE, partial_rotary_factor=0.25)}
                if fam == "minimax_m2"
                else {"sliding_window": 4} if fam == "gpt_oss"
                else {"rope_parameters": dict(Q35_ROPE, rope_theta=100.0)}
                if fam == "qwen3_5_moe"
                else {"routed_scaling_factor": 1.0}}))
    run_points(points)
    unusable = {(r["family"], r["point"]) for r in results if r["verdict"] in ("refused", "skip", "error")}
    combos = []
    for fam in families:
        names = sorted(n for n in KNOBS[fam] if (fam, n) not in unusable)
        for _ in range(args.random):
            pick = rng.sample(names, rng.randint(2, 4))
            ov = {}
            for n in pick:
                ov.update(KNOBS[fam][n])
            combos.append((fam, " + ".join(pick), ov))
    if combos:
        run_points(combos)
    ex.shutdown()
    points += combos

    by_point = {}
    overrides = {(fam, name): ov for fam, name, ov in points}
    for r in results:
        by_point.setdefault((r["family"], r["point"]), []).append(r)
    case_names = ["short", "long"] + ([f"long{args.long_tokens}"] if args.long_tokens else [])
    head = ("| family | knob / combination | seed | " +
            " | ".join(f"{c} tf | {c} gen" for c in case_names) +
            " | min margin | idx ties (ref/colibri) | seed verdict | point verdict | note |",
            "|" + "---|" * (8 + 2 * len(case_names)))
    if args.compact:
        head = ("| family | knob / combination | seeds | tf matched (all cases, per seed) | "
                "gen matched | min margin | colibri idx ties | verdict | note |",
                "|---|---|---|---|---|---|---|---|---|")
    out = [f"Sweep of colibri validate against transformers "
           f"{__import__('transformers').__version__} / torch {torch.__version__}, f32 eager; "
           f"{len(points)} points x {args.seeds} seeds, {time.time() - t0:.0f} s.",
           "Cases: short (a chat prompt, 10 generated), long (a 48-token prompt, 16 generated)"
           + (f", long{args.long_tokens} (a {args.long_tokens}-token prompt, 4 generated)"
              if args.long_tokens else "")
           + "; tf counts teacher-forced argmax matches over prompt + continuation, gen the "
           "greedy continuation. Margin: the smallest top-1/top-2 logit, router top-k or "
           "indexer top-k gap seen in the reference.", "", *head]
    summary = {}
    for (fam, name), rows in by_point.items():
        v = classify(rows)
        s = summary.setdefault(fam, {"points": 0, "exact": 0, "tie": 0, "BUG": 0, "refused": 0,
                                     "skip": 0, "error": 0, "control": "-"})
        if name.startswith("CONTROL"):
            s["control"] = "caught" if v == "BUG" else f"MISSED ({v})"
        else:
            s["points"] += 1
            s[v] += 1
        if args.compact:
            def tot(r, key):
                a = b = 0
                for c in r["cases"].values():
                    if key in c:
                        x, y = c[key].split("/")
                        a, b = a + int(x), b + int(y)
                return f"{a}/{b}" if b else "-"
            ms = [r["margin"] for r in rows if r.get("margin") is not None]
            ties = sum(c.get("ties", 0) for r in rows for c in r["cases"].values())
            out.append(f"| {fam} | {name} | {','.join(str(r['seed']) for r in rows)} | "
                       f"{' '.join(tot(r, 'tf') for r in rows)} | "
                       f"{' '.join(tot(r, 'gen') for r in rows)} | "
                       f"{f'{min(ms):.1e}' if ms else '-'} | {ties} | {v} | "
                       f"{next((r['note'] for r in rows if r['note']), '').replace('|', '/')} |")
            continue
        for r in rows:
            cells = []
            ties = []
            for c in case_names:
                cc = r["cases"].get(c, {})
                cells += [cc.get("tf", "-"), cc.get("gen", "-")]
                if cc.get("ref_ties") is not None or cc.get("ties") is not None:
                    rt = cc.get("ref_ties")
                    ties.append(f"{'-' if rt is None else rt}/{cc.get('ties', '-')}")
            m = r.get("margin")
            out.append(f"| {fam} | {name} | {r['seed']} | " + " | ".join(cells) +
                       f" | {'-' if m is None else f'{m:.1e}'} | {' '.join(ties) or '-'} | "
                       f"{r['verdict']} | {v} | {r['note'].replace('|', '/')} |")
    out += ["", "| family | points | exact | tie | BUG | refused | skip | error | control |",
            "|---|---|---|---|---|---|---|---|---|"]
    for fam, s in summary.items():
        out.append(f"| {fam} | {s['points']} | {s['exact']} | {s['tie']} | {s['BUG']} | "
                   f"{s['refused']} | {s['skip']} | {s['error']} | {s['control']} |")
    bad = [(k, classify(rows), rows) for k, rows in by_point.items()
           if classify(rows) in ("BUG", "refused", "error", "tie", "skip")
           and not k[1].startswith("CONTROL")]
    if bad:
        out += ["", "Points not exact at every seed (overrides of the family's base below):", ""]
        for (fam, name), v, rows in bad:
            note = next((r["note"] for r in rows if r["note"]), "")
            per_seed = "; ".join(
                f"seed {r['seed']}: " + " ".join(f"{k} tf={c.get('tf', '-')} gen={c.get('gen', '-')}"
                                                 for k, c in r["cases"].items())
                + (f" margin {r['margin']:.1e}" if r.get("margin") is not None else "")
                for r in rows) if v in ("BUG", "tie") else note
            out.append(f"- **{v}** {fam} `{name}` {json.dumps(overrides[(fam, name)])}: "
                       f"{per_seed}")
    out += ["", "Bases:", ""]
    for fam in families:
        out.append(f"- {fam}: {json.dumps(BASES[fam]['config'])}")
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if any(classify(rows) in ("BUG", "error") and not name.startswith("CONTROL")
                    for (_, name), rows in by_point.items()) else 0


if __name__ == "__main__":
    sys.exit(main())
