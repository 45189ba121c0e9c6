"""Reservations that grow with a stream's progress. Pure logic (no I/O, no clocks).

A request reserves the estimator's percentile of completion lengths at dispatch. A stream that
has already streamed more than most completions will, on average, run well past that fixed
reservation (completion lengths are long-tailed: the tokens still to come do not shrink as a
stream grows), and a budget closed on fixed reservations is overshot by those streams. The
:class:`OverrunTracker` keeps, per open reservation, the *overrun*: how far the stream's
conditional percentile (``P(final length <= x | streamed r so far) = percentile``, from the
:class:`engine.survival.SurvivalCurve`) exceeds what it reserved. :class:`engine.budget.DatasetBudgets`
counts the sum of overruns as reserved when it decides whether a new request fits.

Overruns are recomputed by :meth:`OverrunTracker.refresh` (the scheduler calls it with the censored
lengths, every ``CENSOR_EVERY_S``), not on every dispatch: O(streams x log(observations)) each.
"""

from __future__ import annotations

import math
from typing import Any, Callable


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
