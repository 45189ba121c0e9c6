"""Fake quantization of the rehearsal target, tuned to a per-token KL divergence.

A quantized provider is simulated by a copy of the target whose weights carry seeded Gaussian noise
scaled per row: ``W' = W + eps * std(W, last dim) * N(0, 1)`` for every weight tensor of two or more
dimensions (linear layers, embeddings, experts, the LM head; norms and biases are kept). This is the
shape of a per-row quantizer's rounding error (a step proportional to the row's scale) with one
continuous knob, ``eps``, so the copy's drift can be set to a chosen KL.

The drift measured is the mean per-token ``KL(target || copy)`` in nats, at temperature 1 and no
nucleus, over the completion positions of sample contexts (:func:`mean_kl`: the positions from which
each context's sampled continuation was drawn; the prompt's own positions are not counted). :func:`tune_noise`
finds ``eps`` for a KL target by the secant rule on ``log KL`` against ``log eps`` (KL grows about as
``eps**2``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class QuantResult:
    """A tuned copy: ``model`` (eval mode), ``eps`` (noise scale, relative to each row's std),
    ``kl`` (measured mean per-token KL, nats), ``target`` (the KL asked for, nats)."""

    model: Any
    eps: float
    kl: float
    target: float


def perturb(model: Any, eps: float, seed: int) -> Any:
    """A deep copy of ``model`` with per-row Gaussian weight noise of relative scale ``eps`` (see the
    module docstring); the noise is a function of ``seed`` and the parameter order only."""
    out = copy.deepcopy(model).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(out.named_parameters(), key=lambda kv: kv[0]):
            if p.dim() < 2 or eps == 0:
                continue
            scale = p.float().std(dim=-1, keepdim=True)
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.add_((eps * scale * noise).to(p.dtype))
    return out


def token_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Per-position ``KL(softmax(p) || softmax(q))`` in nats: ``[..., V]`` logits -> ``[...]``."""
    lp = torch.log_softmax(p_logits.float(), dim=-1)
    lq = torch.log_softmax(q_logits.float(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(dim=-1)


#: Sample contexts: ``(ids [B, T], start)`` pairs; the KL is counted at positions ``start .. T - 1`` (the
#: logits there predict tokens ``start + 1 .. T``).
Contexts = Sequence[tuple[torch.Tensor, int]]


def mean_kl(target: Any, other: Any, contexts: Contexts | torch.Tensor) -> float:
    """Mean per-token KL(target || other) in nats over the counted positions of ``contexts`` (a bare
    ``[B, T]`` tensor counts every position)."""
    groups = [(contexts, 0)] if isinstance(contexts, torch.Tensor) else list(contexts)
    total, n = 0.0, 0
    with torch.inference_mode():
        for ids, start in groups:
            kl = token_kl(target(input_ids=ids).logits[:, start:], other(input_ids=ids).logits[:, start:])
            total += float(kl.sum())
            n += kl.numel()
    return total / max(n, 1)


def tune_noise(target: Any, kl: float, contexts: Contexts | torch.Tensor, seed: int, *, rel_tol: float = 0.05,
               max_iter: int = 12) -> QuantResult:
    """The perturbed copy of ``target`` whose mean KL on ``contexts`` is within ``rel_tol`` of ``kl``
    (or the closest of ``max_iter`` tries).

    Args:
        target: the target model (eval mode).
        kl: the KL target, nats per token (> 0).
        contexts: what the KL is measured on (:func:`mean_kl`).
        seed: the noise seed (the same for every try: only ``eps`` changes).

    Raises:
        ValueError: ``kl <= 0``.
    """
    if not kl > 0:
        raise ValueError(f"the KL target must be > 0 nats, got {kl}")
    tries: list[tuple[float, float]] = []  # (eps, measured kl)
    eps = 0.01
    best: QuantResult | None = None
    for _ in range(max_iter):
        model = perturb(target, eps, seed)
        got = mean_kl(target, model, contexts)
        res = QuantResult(model, eps, got, kl)
        if best is None or abs(math.log(max(got, 1e-12) / kl)) < abs(math.log(max(best.kl, 1e-12) / kl)):
            best = res
        if abs(got - kl) <= rel_tol * kl:
            return res
        tries.append((eps, max(got, 1e-12)))
        if len(tries) >= 2 and tries[-1][1] != tries[-2][1]:
            (e0, k0), (e1, k1) = tries[-2], tries[-1]
            slope = (math.log(k1) - math.log(k0)) / (math.log(e1) - math.log(e0))
            slope = min(max(slope, 0.5), 4.0)
        else:
            slope = 2.0
        eps = eps * math.exp((math.log(kl) - math.log(tries[-1][1])) / slope)
    assert best is not None
    return best
