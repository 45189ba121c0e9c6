"""Kaplan-Meier survival curve of completion lengths, and quantiles of a stream's final length
given what it has streamed so far. Pure logic (no I/O, no clocks).

Used by :class:`engine.money.budget.DatasetBudgets` to grow the reservation of a stream that has
already run past most completions: a stream with ``r`` tokens streamed will end at or below
``conditional_quantile(r, q)`` with probability ``q``, estimated from finished lengths (events)
and the lengths streamed so far by the requests in flight (right-censored observations).
Source: Kaplan & Meier (1958), product-limit estimator; censored values tie-broken after events.
"""

from __future__ import annotations

from bisect import bisect_right


class SurvivalCurve:
    """``S(t) = P(length > t)`` as a step function.

    Args:
        events: finished completion lengths (tokens), sorted ascending.
        censored: lower bounds of the lengths of requests still running (tokens), sorted ascending.
    """

    __slots__ = ("times", "surv")

    def __init__(self, events: list[float], censored: list[float]) -> None:
        self.times: list[float] = []  # distinct event lengths, ascending
        self.surv: list[float] = []  # S just after each of them
        at_risk = len(events) + len(censored)
        s = 1.0
        i = j = 0
        n = len(events)
        while i < n:
            t = events[i]
            while j < len(censored) and censored[j] < t:
                at_risk -= 1
                j += 1
            d = 0
            while i < n and events[i] == t:
                d += 1
                i += 1
            if at_risk <= 0:
                break
            s *= 1.0 - d / at_risk
            at_risk -= d
            self.times.append(t)
            self.surv.append(s)

    def survival(self, t: float) -> float:
        """``S(t)``: estimated share of lengths above ``t`` tokens (1.0 before the first event)."""
        k = bisect_right(self.times, t)
        return 1.0 if k == 0 else self.surv[k - 1]

    def conditional_quantile(self, received: float, q: float) -> float | None:
        """The smallest event length ``t > received`` with ``P(length <= t | length > received) >= q``
        (tokens), or None when the curve does not reach that far (unknown: callers use ``max_tokens``).

        Raises:
            ValueError: ``q`` outside ``(0, 1]``.
        """
        if not 0.0 < q <= 1.0:
            raise ValueError(f"q must be within (0, 1], got {q!r}")
        k = bisect_right(self.times, received)
        s_r = 1.0 if k == 0 else self.surv[k - 1]
        if s_r <= 0.0:
            return None
        target = (1.0 - q) * s_r + 1e-12
        # surv is non-increasing: binary search for the first index >= k with surv <= target
        lo, hi = k, len(self.surv)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.surv[mid] <= target:
                hi = mid
            else:
                lo = mid + 1
        return self.times[lo] if lo < len(self.surv) else None
