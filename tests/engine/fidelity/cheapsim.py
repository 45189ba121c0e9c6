"""A seeded model of a run's records for the cheap signals (tests/engine/fidelity/test_cheap.py).

Prompts come from three datasets (strata) with per-prompt heterogeneity: each prompt has its own typical
completion length (log-normal around its dataset's, sd 0.8), reasoning share, tool-call propensity, wire-flag,
invalid-call and reconstruction-mismatch propensities, and our prompt count may differ from the billed one for
some prompts (the same for every provider: a template difference of ours). Each prompt is bought once, from a
provider drawn at random (optionally with another dataset mix for one provider: up only part of the run);
a sample's length varies around its prompt's (sd 0.5). A drifting provider changes one thing (:class:`Drift`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.fidelity.cheap import CheapRecord

DATASETS = ("chat", "math", "agent")
MIX = (0.5, 0.3, 0.2)
LOG_MEAN = (6.3, 7.6, 6.6)  # medians ~550, ~2000, ~740 tokens
MAX_TOKENS = (4096, 16384, 8192)
REASONING = (0.35, 0.75, 0.5)


@dataclass(frozen=True)
class Drift:
    """What a provider does differently: ``log_shift`` on completion lengths (log(0.8): 20% shorter),
    ``extra_length`` the probability that a record is cut at max_tokens anyway, ``bill`` tokens added to the
    billed prompt, ``flag_mult`` times the wire-flag propensity, ``reasoning_mult`` times the reasoning share."""

    log_shift: float = 0.0
    extra_length: float = 0.0
    bill: int = 0
    flag_mult: float = 1.0
    reasoning_mult: float = 1.0


def world(rng: np.random.Generator, providers: dict[str, tuple[int, Drift]],
          mix: dict[str, tuple[float, float, float]] | None = None) -> dict[str, list[CheapRecord]]:
    """``{provider: records}``: ``providers`` maps a name to (records it serves, its drift); ``mix`` a provider's
    own dataset mix (default :data:`MIX`)."""
    out: dict[str, list[CheapRecord]] = {}
    for name, (n, d) in providers.items():
        ds = rng.choice(3, size=n, p=(mix or {}).get(name, MIX))
        mu = np.array(LOG_MEAN)[ds] + rng.normal(0, 0.8, n)  # the prompt's typical length
        cap = np.array(MAX_TOKENS)[ds]
        length = np.exp(mu + rng.normal(0, 0.5, n) + d.log_shift)
        cut = (length >= cap) | (rng.random(n) < d.extra_length)
        length = np.where(cut, cap, np.maximum(1, np.round(length))).astype(int)
        share = np.clip(rng.beta(4, 4, n) * 2 * np.array(REASONING)[ds] * d.reasoning_mult, 0, 1)
        reasoning = np.round(length * share).astype(int)
        tool_p = np.where(ds == 2, rng.beta(2, 2, n), 0.0)
        tools = rng.random(n) < tool_p
        other = rng.random(n) < 0.002
        finish = np.where(cut, "length", np.where(other, "content_filter", np.where(tools, "tool_calls", "stop")))
        flagged = rng.random(n) < np.minimum(1.0, rng.beta(0.5, 49.5, n) * d.flag_mult)
        invalid = rng.random(n) < rng.beta(0.5, 24.5, n)
        ours = np.where(rng.random(n) < 0.1, rng.choice([-3, -2, -1, 1, 2, 3], n), 0)
        recon_bad = rng.random(n) < rng.beta(0.5, 99.5, n)
        valid = np.where(finish == "tool_calls", ~invalid, None)
        out[name] = [
            CheapRecord(name, *row) for row in zip(
                length.tolist(), reasoning.tolist(), finish.tolist(), flagged.tolist(), (ds == 2).tolist(),
                valid.tolist(), (ours + d.bill).tolist(), (~recon_bad).tolist(), [DATASETS[k] for k in ds.tolist()],
                strict=True)]
    return out
