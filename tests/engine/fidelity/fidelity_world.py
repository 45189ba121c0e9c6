"""A synthetic target for the fidelity statistics: a bank of contexts (random logits), honest and drifting
providers sampling from it, scored with numpy lookups (fast enough for hundreds of seeded trials).

Each context ``k`` has logits ``N(0, sd_k^2)`` over ``V`` tokens, ``sd_k ~ U(2, 4.5)``, so the target's
entropies span ~0.5-4 nats. A provider draws each token's context uniformly from the bank (the martingale
argument makes the statistics indifferent to how contexts follow each other) and samples the token from
its own distribution ``q``: the target's (honest), noisy logits (fake-quantized; or, 10x smaller, an honest
engine's other numerics), a hotter temperature.
Scores come from per-(context, token) tables of the target's distribution, through
:func:`engine.fidelity.score.records_from_tokens`, the aggregation :func:`score_record` uses.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.fidelity.dist import sampling_distribution
from engine.fidelity.score import RecordScore, records_from_tokens


def _cdf_flat(q: np.ndarray) -> np.ndarray:
    """Row offset + cumulative distribution, flattened: ``searchsorted(k + u)`` samples row k."""
    c = np.cumsum(q, axis=1)
    c /= c[:, -1:]
    return (c + np.arange(len(q))[:, None]).ravel()


class World:
    """The target's tables at one temperature / top_p (module docstring)."""

    def __init__(self, contexts: int = 2000, vocab: int = 500, temperature: float = 1.0, top_p: float = 0.95,
                 seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        sd = 2.0 + 2.5 * torch.rand(contexts, 1, generator=g, dtype=torch.float64)
        self.logits = (torch.randn(contexts, vocab, generator=g, dtype=torch.float64) * sd).float()
        self.noise = torch.randn(contexts, vocab, generator=g).float()
        self.temperature, self.top_p, self.vocab, self.seed = temperature, top_p, vocab, seed
        p = sampling_distribution(self.logits, temperature, top_p).double().numpy()
        self.p = p
        logp = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)
        self.logp = logp
        self.entropy = -(p * logp).sum(1)
        self.variance = (p * (logp + self.entropy[:, None]) ** 2).sum(1)
        self.pmax = p.max(1)
        self.argmax = p.argmax(1)
        order = np.argsort(-p, axis=1, kind="stable")  # probability descending, ties by id
        sp = np.take_along_axis(p, order, axis=1)
        before = np.empty_like(p)
        np.put_along_axis(before, order, np.cumsum(sp, axis=1) - sp, axis=1)
        self.before = before
        t_ll = temperature if temperature > 0 else 1.0
        self.loglik = torch.log_softmax(self.logits.double() / t_ll, dim=1).numpy()
        self.honest = _cdf_flat(p)
        self._cdfs: dict[str, np.ndarray] = {"honest": self.honest}

    def kl_quant(self, sigma: float) -> tuple[float, float]:
        """Mean per-token KL(target || quantized) in nats: of the model (T=1, no nucleus) and at T / no nucleus."""
        out = []
        for t in (1.0, self.temperature):
            lp = torch.log_softmax(self.logits.double() / t, 1)
            lq = torch.log_softmax((self.logits + sigma * self.noise).double() / t, 1)
            out.append(float((lp.exp() * (lp - lq)).sum(1).mean()))
        return out[0], out[1]

    def probs(self, kind: str, sigma: float = 0.25, hotter: float = 1.4) -> np.ndarray:
        """``[contexts, vocab]`` sampling distribution of a provider: ``quant`` (logits + sigma * fixed N(0,1)
        noise per context), ``numerics`` (the same with another, independent noise: an honest engine whose
        kernels differ from the target's) or ``temp`` (temperature x ``hotter``).

        Raises:
            ValueError: an unknown ``kind``.
        """
        if kind == "quant":
            q = sampling_distribution(self.logits + sigma * self.noise, self.temperature, self.top_p)
        elif kind == "numerics":
            g = torch.Generator().manual_seed(self.seed + 1000)
            noise = torch.randn(self.logits.shape, generator=g).float()
            q = sampling_distribution(self.logits + sigma * noise, self.temperature, self.top_p)
        elif kind == "temp":
            q = sampling_distribution(self.logits, self.temperature * hotter, self.top_p)
        else:
            raise ValueError(kind)
        return q.double().numpy()

    def drift(self, kind: str, sigma: float = 0.25, hotter: float = 1.4) -> np.ndarray:
        """The flattened sampler of a provider (:meth:`probs`)."""
        key = f"{kind}:{sigma}:{hotter}"
        if key not in self._cdfs:
            self._cdfs[key] = _cdf_flat(self.probs(kind, sigma, hotter))
        return self._cdfs[key]

    def outside_rate(self, q: np.ndarray) -> float:
        """Chance that a token of a provider sampling from ``q`` (``[contexts, vocab]``) is outside the target's
        nucleus. Contexts are drawn uniformly and independently per token, so a provider's outside count over
        ``n`` tokens is exactly Binomial(n, this rate)."""
        return float((q * (self.p == 0)).sum(1).mean())

    def sample(self, cdf: np.ndarray, ctx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One token per context in ``ctx`` from the sampler ``cdf``."""
        keys = ctx + rng.random(len(ctx))
        order = np.argsort(keys)  # sorted keys: searchsorted walks the table once
        idx = np.empty(len(ctx), dtype=np.int64)
        idx[order] = np.searchsorted(cdf, keys[order], side="right")
        return np.minimum(idx - ctx * self.vocab, self.vocab - 1)

    def records(self, n_records: int, rng: np.random.Generator, drifted: np.ndarray | None = None,
                sampler: np.ndarray | None = None, lengths: tuple[int, int] = (50, 300)) -> list[RecordScore]:
        """``n_records`` scored records of ``lengths`` tokens (uniform); records flagged in ``drifted``
        (``[n_records]`` bool) sample from ``sampler``, the rest from the target."""
        lens = rng.integers(lengths[0], lengths[1] + 1, n_records)
        rid = np.repeat(np.arange(n_records), lens)
        ctx = rng.integers(0, len(self.p), len(rid))
        y = self.sample(self.honest, ctx, rng)
        if drifted is not None and sampler is not None and drifted.any():
            d = drifted[rid]
            y[d] = self.sample(sampler, ctx[d], rng)
        flat = ctx * self.vocab + y
        py = self.p.ravel()[flat]
        u = self.before.ravel()[flat] + rng.random(len(y)) * py
        if self.temperature == 0:
            u[:] = np.nan
        return records_from_tokens(rid, n_records, py > 0, -self.logp.ravel()[flat], self.entropy[ctx],
                                   self.variance[ctx], self.argmax[ctx] == y, self.pmax[ctx],
                                   self.loglik.ravel()[flat], u)
