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


def build_tiny_model(path: str | Path, seed: int = 0, **config: Any) -> Path:
    """Create the tiny model with seeded random weights and ``save_pretrained`` it to ``path`` (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_deepseek_config(**config), dtype=torch.float32)
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
