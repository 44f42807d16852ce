#!/usr/bin/env python3
"""The BF16 `glm_moe_dsa` checkpoint that scripts/bench_llamacpp.sh converts both ways.

    PYTHON scripts/bench_llamacpp_checkpoint.py OUT_DIR [LAYERS EXPERTS]

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
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

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
    cfg = GlmMoeDsaConfig(
        vocab_size=VOCAB, hidden_size=2048, intermediate_size=1536,
        moe_intermediate_size=768, num_hidden_layers=layers, num_attention_heads=16,
        num_key_value_heads=16, n_shared_experts=1, n_routed_experts=experts,
        num_experts_per_tok=8, n_group=1, topk_group=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, first_k_dense_replace=1, q_lora_rank=256, kv_lora_rank=128,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, head_dim=16,
        index_n_heads=4, index_head_dim=128, index_topk=2048,
        indexer_types=["full"] + ["shared"] * (layers - 1),
        max_position_embeddings=4096, attention_bias=False, tie_word_embeddings=False,
        eos_token_id=eos, bos_token_id=None, pad_token_id=None, num_nextn_predict_layers=0,
    )
    torch.manual_seed(38)
    # BF16 from the start: 7 GB instead of float32's 14 while it is initialised and saved.
    torch.set_default_dtype(torch.bfloat16)
    model = GlmMoeDsaForCausalLM(cfg).eval()
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True, max_shard_size="2GB")
    (out / "generation_config.json").unlink(missing_ok=True)
    tok.save(str(out / "tokenizer.json"))
    # llama.cpp's converter loads the tokenizer through transformers' AutoTokenizer.
    (out / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": false}\n')
    print(f"{out}: {n / 1e9:.2f}B parameters, {layers} layers x {experts} experts, "
          f"vocab {VOCAB} ({tok.get_vocab_size()} of them in the tokenizer)")


if __name__ == "__main__":
    main()
