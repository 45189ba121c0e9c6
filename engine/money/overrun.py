"""Reservations that grow with a stream's progress. Pure logic (no I/O, no clocks).

A request reserves the estimator's percentile of completion lengths at dispatch. A stream that
has already streamed more than most completions will, on average, run well past that fixed
reservation (completion lengths are long-tailed: the tokens still to come do not shrink as a
stream grows), and a budget closed on fixed reservations is overshot by those streams. The
:class:`OverrunTracker` keeps, per open reservation, the *overrun*: how far the stream's
conditional quantile (``P(final length <= x | streamed r so far) =`` :data:`OVERRUN_PERCENTILE`, from the
:class:`engine.metrics.survival.SurvivalCurve`) exceeds what it reserved. :class:`engine.money.budget.DatasetBudgets`
counts the sum of overruns as reserved when it decides whether a new request fits.

Overruns are recomputed by :meth:`OverrunTracker.refresh` (the scheduler calls it with the censored
lengths, every ``CENSOR_EVERY_S``), not on every dispatch: O(streams x log(observations)) each.
"""

from __future__ import annotations

import math
from typing import Any, Callable

OVERRUN_PERCENTILE = 0.75
"""A stream overruns by how far its conditional upper quartile (``P(final <= x | streamed r) = 0.75``)
exceeds its reservation (near the end of a budget the reservation percentile is used instead, see
:data:`engine.money.budget.END_SPAN`). Chosen on the pure sweep of ``tests/engine/money/test_budget.py`` (500 and 2,000
streams, budgets 0.1-2x concurrency x mean): the conditional median overshot 1.036x; the upper
quartile alone 1.022x (a 200,000 budget, where one long stream is 2%); the reservation's own p90
everywhere held within 1.015x but cost 10-30% of the prompts per second of the budget-bound phase
(each in-flight stream's p90, summed, is far above the p90 of their sum)."""


class OverrunTracker:
    """Open reservations with the progress of their streams, and their summed overrun (tokens).

    A progress object is anything with a ``tokens_received`` attribute (completion tokens streamed
    so far), e.g. :class:`engine.client.StreamProgress`.
    """

    def __init__(self) -> None:
        self._open: dict[int, tuple[str, int, Any]] = {}  # rid -> (class, tokens reserved, progress)
        self._over: dict[int, int] = {}
        self.total = 0  #: sum of the overruns (tokens)

    def track(self, rid: int, cls: str, reserved_tokens: int, progress: Any) -> None:
        """Follow the stream of reservation ``rid`` (class ``cls``, ``reserved_tokens`` completion
        tokens reserved); its overrun is 0 until the next :meth:`refresh`."""
        self._open[rid] = (cls, int(reserved_tokens), progress)

    def close(self, rid: int) -> None:
        """Forget reservation ``rid`` (settled or released); unknown ids are ignored."""
        if self._open.pop(rid, None) is not None:
            self.total -= self._over.pop(rid, 0)

    def refresh(self, needed: Callable[[str, float], int]) -> int:
        """Recompute every overrun with ``needed(cls, tokens_received) -> tokens`` (the conditional
        percentile, capped at ``max_tokens``). Returns the new total (tokens)."""
        self._over.clear()
        total = 0
        for rid, (cls, reserved, prog) in self._open.items():
            got = float(getattr(prog, "tokens_received", 0) or 0)
            over = needed(cls, got) - reserved
            if over > 0:
                self._over[rid] = over
                total += over
        self.total = total
        return total

    def __len__(self) -> int:
        return len(self._open)


def ceil_tokens(x: float, max_tokens: int) -> int:
    """``ceil(x)`` clamped to ``[1, max_tokens]`` (tokens)."""
    return max(1, min(int(max_tokens), int(math.ceil(x))))
