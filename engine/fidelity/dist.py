"""The distribution a provider is asked to sample from: the target's logits at a temperature and top_p.

One definition, shared by the simulator's model-backed providers (:mod:`engine.sim`) and by phase-two
scoring (:mod:`engine.fidelity.score`), so that an honest rehearsal provider samples exactly the
distribution the scorer tests against.

Definition (the one vLLM and SGLang apply, docs/fidelity.md): ``p = softmax(logits / temperature)``;
then the nucleus: tokens sorted by ``p`` descending, the smallest prefix whose cumulative mass reaches
``top_p`` is kept (the token that crosses ``top_p`` is kept; ties broken by token id ascending), the
rest set to 0, and the kept mass renormalised to 1. ``temperature == 0`` is greedy: all mass on the
argmax (lowest id among ties). ``top_p`` of ``None`` or ``>= 1`` keeps every token.
"""

from __future__ import annotations

import torch


def sampling_distribution(logits: torch.Tensor, temperature: float | None, top_p: float | None) -> torch.Tensor:
    """Probabilities ``[..., V]`` (float32) the target samples from, per the module's definition.

    Args:
        logits: ``[..., V]`` raw logits of the target (any float dtype; computed in float32).
        temperature: >= 0; ``None`` means 1.0.
        top_p: in (0, 1]; ``None`` means 1.0 (no nucleus).

    Raises:
        ValueError: a negative temperature or a top_p outside (0, 1].
    """
    t = 1.0 if temperature is None else float(temperature)
    p_top = 1.0 if top_p is None else float(top_p)
    if t < 0:
        raise ValueError(f"temperature must be >= 0, got {t}")
    if not 0.0 < p_top <= 1.0:
        raise ValueError(f"top_p must be within (0, 1], got {p_top}")
    x = logits.float()
    if t == 0.0:
        out = torch.zeros_like(x)
        out.scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
        return out
    probs = torch.softmax(x / t, dim=-1)
    if p_top >= 1.0:
        return probs
    # stable sort on (-p, id): sort ids ascending is the identity, so a stable descending sort keeps ties by id
    sp, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sp, dim=-1) - sp  # mass strictly before each token in the sorted order
    keep_sorted = before < p_top  # the crossing token has before < top_p, the ones after it do not
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)
