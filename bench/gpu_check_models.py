"""Random-weight DeepSeek-V3 models of Kimi-K2.5's width for ``bench/gpu_check.sh``, and their FLOPs.

Kimi-K2.5's text backbone (docs/kimi-k2.5.md): hidden 7168, 61 layers (1 dense + 60 MoE), MLA with 64
heads, q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, a
dense MLP of 18432, 384 routed experts of 2048 with 8 active + 1 shared, vocabulary 163,840. The check
keeps every width and the per-token work of a layer (8 active + 1 shared experts) and cuts the depth
(a few layers) and the number of routed experts (16: memory, not per-token work).

Uses transformers and torch only (nothing of ``engine``), so it imports on the GPU machine as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Kimi-K2.5's widths (text backbone); the yarn rope of ``tests/engine/extract/test_mla_reference.KIMI_ROPE``
KIMI = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_attention_heads=64,
            num_key_value_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
            v_head_dim=128, num_experts_per_tok=8, n_shared_experts=1, vocab_size=163840)
#: The same model family at a width a CPU runs in seconds (``--small``): every ratio kept loosely.
SMALL = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_attention_heads=4,
             num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32,
             v_head_dim=32, num_experts_per_tok=4, n_shared_experts=1, vocab_size=1000)
#: Kimi-K2.5's depth and expert count (for :func:`flops_per_token` of the real model)
KIMI_LAYERS, KIMI_EXPERTS = 61, 384


def wide_config(layers: int, dense_layers: int, small: bool = False, experts: int = 16, vocab: int | None = None,
                **over: Any) -> Any:
    """A ``DeepseekV3Config`` of Kimi-K2.5's widths (:data:`KIMI`, or :data:`SMALL` with ``small``).

    Args:
        layers: decoder layers; dense_layers: how many of them (the first) are dense, the rest MoE.
        experts: routed experts per MoE layer (Kimi-K2.5: 384; ``num_experts_per_tok`` of them active).
        vocab: vocabulary size (default: the width set's).
        over: any other config field (e.g. ``rope_scaling``).
    """
    from transformers import DeepseekV3Config

    kw: dict[str, Any] = dict(SMALL if small else KIMI)
    kw.update(num_hidden_layers=layers, first_k_dense_replace=dense_layers, n_routed_experts=experts,
              n_group=1, topk_group=1, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
              max_position_embeddings=16384, tie_word_embeddings=False, rms_norm_eps=1e-6)
    kw["num_experts_per_tok"] = min(kw["num_experts_per_tok"], experts)
    if vocab is not None:
        kw["vocab_size"] = vocab
    kw.update(over)
    return DeepseekV3Config(**kw)


def build_random_model(path: str | Path, cfg: Any, device: str = "cpu", dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Initialise ``cfg``'s ``*ForCausalLM`` with seeded random weights on ``device`` (a GPU initialises
    billions of parameters in seconds) and ``save_pretrained`` it to ``path`` in ``dtype``.

    Returns:
        ``path``. Raises whatever transformers or torch raise (out of memory, disk full).
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(path)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return Path(path)


def flops_per_token(cfg: Any, context: float, scored: float = 0.0) -> float:
    """Forward FLOPs per token (2 per multiply-add) of a DeepSeek-V3 ``cfg``: the projections, the
    dense or MoE MLP (active experts + shared), causal attention over ``context`` tokens on average
    (``T / 2`` for a sequence of ``T``) and the LM head on a ``scored`` fraction of the tokens (the
    fidelity scoring; the forward's own logits are one position per sample: neglected).

    Args:
        cfg: a config object or dict with DeepSeek-V3's fields.
    """
    g = cfg if isinstance(cfg, dict) else cfg.to_dict()
    h, n = g["hidden_size"], g["num_attention_heads"]
    dn, dr, dv = g["qk_nope_head_dim"], g["qk_rope_head_dim"], g["v_head_dim"]
    ql, kl = g.get("q_lora_rank") or 0, g["kv_lora_rank"]
    q = h * ql + ql * n * (dn + dr) if ql else h * n * (dn + dr)
    attn_proj = q + h * (kl + dr) + kl * n * (dn + dv) + n * dv * h
    attn_core = context * n * (dn + dr + dv)  # QK^T and PV, multiply-adds per token
    dense = 3 * h * g["intermediate_size"]
    moe = 3 * h * g["moe_intermediate_size"] * (g["num_experts_per_tok"] + g.get("n_shared_experts", 0)) \
        + h * g["n_routed_experts"]
    k = int(g.get("first_k_dense_replace", 0))
    layers = int(g["num_hidden_layers"])
    macs = layers * (attn_proj + attn_core) + min(k, layers) * dense + max(layers - k, 0) * moe
    return 2.0 * (macs + scored * h * g["vocab_size"])


def param_count(cfg: Any) -> int:
    """Parameters of a DeepSeek-V3 ``cfg`` (all experts, embeddings and LM head; norms neglected)."""
    g = cfg if isinstance(cfg, dict) else cfg.to_dict()
    h, n = g["hidden_size"], g["num_attention_heads"]
    dn, dr, dv = g["qk_nope_head_dim"], g["qk_rope_head_dim"], g["v_head_dim"]
    ql, kl = g.get("q_lora_rank") or 0, g["kv_lora_rank"]
    attn = (h * ql + ql * n * (dn + dr) if ql else h * n * (dn + dr)) + h * (kl + dr) + kl * n * (dn + dv) + n * dv * h
    k, layers = int(g.get("first_k_dense_replace", 0)), int(g["num_hidden_layers"])
    moe = 3 * h * g["moe_intermediate_size"] * (g["n_routed_experts"] + g.get("n_shared_experts", 0)) \
        + h * g["n_routed_experts"]
    return int(layers * attn + min(k, layers) * 3 * h * g["intermediate_size"] + max(layers - k, 0) * moe
               + 2 * g["vocab_size"] * h)
