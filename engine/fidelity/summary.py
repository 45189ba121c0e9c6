"""Phase-two figures of a group of scored records (a provider within one dataset), for ``status --json`` (pure)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from engine.fidelity.score import RecordScore


def summarize(scores: Sequence[RecordScore]) -> dict[str, Any]:
    """``{"records", "tokens", "surprisal_excess" (nats/token over the target's expectation), "surprisal_z",
    "top1_rate", "top1_expected", "outside_share"}`` of ``scores`` (None where nothing was scored).

    The z is the surprisal test of :mod:`engine.fidelity.verdict` without its thresholds: figures to compare
    datasets and providers, not a verdict (the verdict is per provider, all datasets together).
    """
    tokens = sum(s.tokens for s in scores)
    inside = sum(s.tokens - s.outside for s in scores)
    excess = sum(s.surprisal - s.entropy for s in scores)
    var = sum(s.variance for s in scores)
    return {
        "records": len(scores), "tokens": tokens,
        "surprisal_excess": round(excess / inside, 5) if inside else None,
        "surprisal_z": round(excess / math.sqrt(var), 3) if var > 0 else None,
        "top1_rate": round(sum(s.top1 for s in scores) / inside, 5) if inside else None,
        "top1_expected": round(sum(s.top1_expected for s in scores) / inside, 5) if inside else None,
        "outside_share": round(sum(s.outside for s in scores) / tokens, 6) if tokens else None,
    }
