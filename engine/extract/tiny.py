"""A tiny random-weight DeepSeek-V3-family model (Kimi-K2.5's architecture: MLA attention, MoE with a
shared expert and grouped top-k routing) and synthetic token records, for tests, benchmarks and a
no-download rehearsal of ``datagen extract``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from engine.tokens.records import TokenRecord


def tiny_deepseek_config(layers: int = 6, hidden: int = 64, vocab: int = 1000, **over: Any) -> Any:
    """A ``DeepseekV3Config`` with ``layers`` decoder layers (the first dense, the rest MoE with 4
    routed experts, 2 per token, 1 shared), hidden size ``hidden``, MLA with small ranks."""
    from transformers import DeepseekV3Config

    kw: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
        q_lora_rank=hidden // 2, kv_lora_rank=hidden // 4, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
        max_position_embeddings=16384, tie_word_embeddings=False,
    )
    kw.update(over)
    return DeepseekV3Config(**kw)


def tiny_family_config(family: str, layers: int = 4, vocab: int = 1000) -> Any:
    """A tiny config of ``family`` that vLLM's CPU backend also runs (its attention needs head_dim 64,
    its MLA a 576-wide latent): ``llama`` (dense, GQA), ``qwen3_moe`` (MoE: 4 experts, 2 per token,
    the first layer dense) or ``deepseek_mla`` (DeepSeek-V3: MLA + MoE, Kimi-K2.5's architecture).
    Hidden size 128."""
    common: dict[str, Any] = dict(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                                  max_position_embeddings=4096, tie_word_embeddings=False)
    if family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(num_attention_heads=2, num_key_value_heads=1, **common)
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        # head_dim: the config keeps it (extra keyword) and the model reads it, though transformers' typed
        # __init__ does not declare it
        return Qwen3MoeConfig(num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_experts=4,  # type: ignore[call-arg]
                              num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1,
                              mlp_only_layers=[0], **common)
    if family == "deepseek_mla":
        return tiny_deepseek_config(layers=layers, hidden=128, vocab=vocab, num_attention_heads=2, num_key_value_heads=2,
                                    moe_intermediate_size=64, q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64,
                                    qk_nope_head_dim=32, v_head_dim=64, max_position_embeddings=4096,
                                    topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True)
    raise ValueError(f"unknown tiny family {family!r} (llama, qwen3_moe, deepseek_mla)")


def build_tiny_model(path: str | Path, seed: int = 0, family: str | None = None, **config: Any) -> Path:
    """Create a tiny model with seeded random weights and ``save_pretrained`` it to ``path`` (fp32):
    the DeepSeek-V3 one of :func:`tiny_deepseek_config` (``config`` overrides its arguments), or
    ``family`` from :func:`tiny_family_config` (``config``: its ``layers``/``vocab``)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_family_config(family, **config) if family else tiny_deepseek_config(**config)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(path)
    return Path(path)


def synth_records(n: int, min_len: int, max_len: int, vocab: int = 1000, seed: int = 0,
                  datasets: tuple[str, ...] = ("a", "b")) -> list[TokenRecord]:
    """``n`` token records with lengths uniform in ``[min_len, max_len]``, prompt = first ~third."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = rng.randint(min_len, max_len)
        p = max(1, t // 3) if t > 1 else 0
        ds = datasets[i % len(datasets)]
        out.append(TokenRecord(
            id=f"{ds}:{i:06d}-{rng.getrandbits(32):08x}", dataset=ds,
            input_ids=[rng.randrange(vocab) for _ in range(t)], loss_mask=[0] * p + [1] * (t - p),
            prompt_len=p, completion_len=t - p, provider="sim", finish_reason="stop"))
    return out
