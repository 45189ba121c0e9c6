"""What the streams in flight will still take of a budget, beyond what they reserved. Pure logic (no I/O,
no clocks).

A request reserves a high percentile of completion lengths at dispatch (the estimator's). What a
budget must hold for the streams in flight is not the sum of those percentiles (each stream's p90,
summed, is far above the p90 of their sum: a token budget then caps concurrency far below the
configured one, e.g. 899 streams of 8,000 tokens for an 8M budget where 1,900 were configured) but
the expected total of their final lengths plus a margin for the noise of that sum. The
:class:`OverrunTracker` keeps, over the open reservations, the *hold* (tokens, may be negative):

    hold = sum_i (E[final_i | streamed r_i] - reserved_i) + Z * sqrt(sum_i Var[remaining_i] + sum_c (rho_c * sum_{i in c} E[remaining_i])^2)

where the expectations come from the class's length distribution (censoring accounted for,
:class:`engine.metrics.lengths.LengthDistribution`), and ``rho_c`` is :data:`HOLD_ERROR_FACTOR` x the
relative standard error of class ``c``'s estimated mean (the in-flight streams of a class err together
when the mean is off).
:class:`engine.money.budget.DatasetBudgets` counts ``reserved + hold`` as committed when it decides
whether a new request fits: ``used + sum E + Z sd`` stays within the limit, so the final spend
exceeds it with probability about ``1 - Phi(Z)`` (1% at :data:`HOLD_Z`) and then by a fraction of
one standard deviation of the sum. A negative hold gives back what the dispatch-time percentiles
reserved beyond the expectation.

The hold is recomputed by :meth:`OverrunTracker.refresh` (the scheduler calls it with the censored
lengths, every ``CENSOR_EVERY_S``), not on every dispatch: O(streams x log(observations)) each;
between refreshes a new request holds its dispatch-time percentile (conservative).
"""

from __future__ import annotations

import math
from typing import Any, Callable

HOLD_Z = 2.326
"""z of the one-sided 99% bound on the summed final lengths of the streams in flight (see the module
docstring). Chosen on the pure sweep of ``tests/engine/money/test_budget.py`` (500 and 2,000 streams,
budgets 0.05-4x concurrency x mean, 40 seeds, 4,000 and 4 tokens/s per stream); the figures are in
docs/spend-control.md."""


HOLD_ERROR_FACTOR = 2.0
"""The hold takes the error of a class's estimated mean at this multiple of the projection's figure
(:meth:`engine.metrics.lengths.LengthDistribution.mean_standard_error`): the streams in flight err
together when the mean is off, and early in a run (few completions, heavy censoring) it is off by more
than its standard error says. Measured on the pure sweep (40 seeds, 100 tokens/s per stream, the two
worst budgets: 500 streams / 500,000 tokens and 2,000 / 800,000): worst used/budget 1.074 and 1.057 at
1, 1.035 and 1.031 at 1.5, 1.0022 and 1.0015 at 2; at the real shape (2,000 streams of 4 tokens/s,
8M tokens) all 2,000 still run at 2."""


class OverrunTracker:
    """Open reservations with the progress of their streams, and their hold (tokens, see the module docstring).

    A progress object is anything with a ``tokens_received`` attribute (completion tokens streamed
    so far), e.g. :class:`engine.client.StreamProgress`.
    """

    def __init__(self) -> None:
        self._open: dict[int, tuple[str, int, Any]] = {}  # rid -> (class, tokens reserved, progress)
        self._over: dict[int, float] = {}  # rid -> E[final] - reserved at the last refresh
        self.margin = 0.0  #: the noise margin of the last refresh (tokens, >= 0)
        self.total = 0  #: the hold: sum of (E[final] - reserved) + margin (tokens, may be negative)

    def track(self, rid: int, cls: str, reserved_tokens: int, progress: Any) -> None:
        """Follow the stream of reservation ``rid`` (class ``cls``, ``reserved_tokens`` completion
        tokens reserved); it adds nothing to the hold until the next :meth:`refresh`."""
        self._open[rid] = (cls, int(reserved_tokens), progress)

    def close(self, rid: int, actual: float | None = None) -> None:
        """Forget reservation ``rid`` (settled or released); unknown ids are ignored.

        ``actual``: the tokens the request took (its completion length, or what a failed stream
        streamed). A stream that ended below its expected final length is good news for the budget,
        but the bad news that comes with it (the streams still running are the longer ones: their
        expected final lengths rise) is only seen at the next :meth:`refresh`; so until then the
        difference stays in the hold and the budget frees nothing early (measured without it at
        4,000 tokens/s per stream and a refresh every 0.25 s: 1.07-1.11x budgets). A stream that
        ended above its expectation adds to the budget's use at once. Its share of the margin
        also stays until the next :meth:`refresh` (conservative)."""
        got = self._open.pop(rid, None)
        if got is None:
            return
        over = self._over.pop(rid, 0.0)
        keep = 0.0
        if actual is not None:
            keep = max(0.0, got[1] + over - float(actual))  # expected final (reserved + over) - actual
        self.total = int(math.ceil(self.total - over + keep))
        if not self._open:  # nothing in flight: nothing is held
            self.total, self.margin = 0, 0.0

    def refresh(self, moments: Callable[[str, float], tuple[float, float]], rel_error: Callable[[str], float],
                z: float = HOLD_Z) -> int:
        """Recompute the hold with ``moments(cls, tokens_received) -> (E[final length], Var[remaining])``
        (tokens, tokens squared; capped at ``max_tokens``) and ``rel_error(cls)``, the relative standard
        error of the class's mean length. Returns the new hold (tokens, may be negative)."""
        self._over.clear()
        excess = 0.0
        var = 0.0
        rem: dict[str, float] = {}
        for rid, (cls, reserved, prog) in self._open.items():
            got = float(getattr(prog, "tokens_received", 0) or 0)
            final, v = moments(cls, got)
            over = final - reserved
            self._over[rid] = over
            excess += over
            var += v
            rem[cls] = rem.get(cls, 0.0) + max(0.0, final - got)
        var += sum((rel_error(c) * r) ** 2 for c, r in rem.items())
        self.margin = z * math.sqrt(var)
        self.total = int(math.ceil(excess + self.margin))
        return self.total

    def __len__(self) -> int:
        return len(self._open)


def ceil_tokens(x: float, max_tokens: int) -> int:
    """``ceil(x)`` clamped to ``[1, max_tokens]`` (tokens)."""
    return max(1, min(int(max_tokens), int(math.ceil(x))))
