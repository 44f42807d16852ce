#!/usr/bin/env python3
"""The BF16 checkpoints that scripts/bench_llamacpp.sh converts both ways.

    PYTHON scripts/bench_llamacpp_checkpoint.py OUT_DIR [LAYERS EXPERTS [FAMILY]]

FAMILY: glm_moe_dsa (the default), deepseek_v3, deepseek_v32, qwen3_moe or glm4_moe. Every
family gets the same experts (EXPERTS of 768, top 8), hidden 2048, 16 heads and vocabulary;
the attention is the family's own: MLA of the same ranks for the DeepSeek ones (V3.2 with the
same indexer as GLM-5), grouped-query with 4 KV heads of 128 for Qwen3-MoE (every layer
sparse, no shared expert, as Qwen3-MoE has) and GLM-4.5 (half-rotary, q/k norm, one dense
layer first and a shared expert). What follows describes the GLM-5 one.

Issue 38's shape: 12 layers, 64 routed experts of moe_intermediate 768, top 8, hidden 2048,
the medium model's attention (MLA with q_lora 256 / kv_lora 128, 16 heads) with a DSA indexer
of 4 heads of 128 (GLM-5's head size: llama.cpp's indexer rotates keys by a Hadamard matrix of
at least 64 and refuses a smaller head), one dense layer first, BF16 (3.5B parameters, 7 GB). The weights are transformers' own random
initialisation under a fixed seed: speed does not depend on them, only the shapes do. The
tokenizer is make_fixtures.py's byte-level BPE with GLM's specials (793 ids: its corpus is small)
in a vocabulary of 16384 (the medium model's), so the embedding and lm_head cost what they
cost there.
"""
import sys
from pathlib import Path

import torch
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, DeepseekV32Config,
                          DeepseekV32ForCausalLM, Glm4MoeConfig, Glm4MoeForCausalLM,
                          GlmMoeDsaConfig, GlmMoeDsaForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import make_tokenizer  # noqa: E402

VOCAB = 16384


def main():
    out = Path(sys.argv[1])
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    experts = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(VOCAB)
    eos = [tok.token_to_id(s) for s in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    family = sys.argv[4] if len(sys.argv) > 4 else "glm_moe_dsa"
    common = dict(vocab_size=VOCAB, hidden_size=2048, num_hidden_layers=layers,
                  num_attention_heads=16, moe_intermediate_size=768, num_experts_per_tok=8,
                  norm_topk_prob=True, max_position_embeddings=4096, attention_bias=False,
                  tie_word_embeddings=False, eos_token_id=eos, bos_token_id=None,
                  pad_token_id=None)
    mla = dict(intermediate_size=1536, num_key_value_heads=16, n_shared_experts=1,
               n_routed_experts=experts, n_group=1, topk_group=1, routed_scaling_factor=2.5,
               first_k_dense_replace=1, q_lora_rank=256, kv_lora_rank=128,
               qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, head_dim=16)
    indexer = dict(index_n_heads=4, index_head_dim=128, index_topk=2048)
    # DeepSeek's published configs name their router; llama.cpp's V3.2 reads it.
    deepseek = dict(scoring_func="sigmoid", topk_method="noaux_tc")
    if family == "glm_moe_dsa":
        cls = GlmMoeDsaForCausalLM
        cfg = GlmMoeDsaConfig(**common, **mla, **indexer,
                              indexer_types=["full"] + ["shared"] * (layers - 1),
                              num_nextn_predict_layers=0)
    elif family == "deepseek_v3":
        cls = DeepseekV3ForCausalLM
        cfg = DeepseekV3Config(**common, **mla, **deepseek, num_nextn_predict_layers=0)
    elif family == "deepseek_v32":
        cls = DeepseekV32ForCausalLM
        cfg = DeepseekV32Config(**common, **mla, **indexer, **deepseek)
    elif family == "qwen3_moe":
        cls = Qwen3MoeForCausalLM
        cfg = Qwen3MoeConfig(**common, intermediate_size=1536, num_key_value_heads=4,
                             head_dim=128, num_experts=experts, decoder_sparse_step=1,
                             mlp_only_layers=[])
    elif family == "glm4_moe":
        cls = Glm4MoeForCausalLM
        cfg = Glm4MoeConfig(**common, intermediate_size=1536, num_key_value_heads=4,
                            head_dim=128, partial_rotary_factor=0.5, use_qk_norm=True,
                            n_shared_experts=1, n_routed_experts=experts, n_group=1,
                            topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1,
                            num_mtp_layers=0)
    else:
        sys.exit(f"unknown family {family!r}: glm_moe_dsa, deepseek_v3, deepseek_v32, "
                 "qwen3_moe or glm4_moe")
    torch.manual_seed(38)
    # BF16 from the start: 7 GB instead of float32's 14 while it is initialised and saved.
    torch.set_default_dtype(torch.bfloat16)
    model = cls(cfg).eval()
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True, max_shard_size="2GB")
    (out / "generation_config.json").unlink(missing_ok=True)
    tok.save(str(out / "tokenizer.json"))
    # llama.cpp's converter loads the tokenizer through transformers' AutoTokenizer.
    (out / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": false}\n')
    print(f"{out}: {family}, {n / 1e9:.2f}B parameters, {layers} layers x {experts} experts, "
          f"vocab {VOCAB} ({tok.get_vocab_size()} of them in the tokenizer)")


if __name__ == "__main__":
    main()
