"""Windowed rates and ETAs: pure arithmetic on counters, no I/O, O(1) per event.

A :class:`RateWindow` keeps per-second buckets over a sliding window so ``req/s`` and ``tok/s``
are "recent" figures; the since-start figure is kept next to it and the two are always labelled
apart (a user-reported bug of other tools is an average that silently changes meaning).
"""

from __future__ import annotations

import math
from collections import deque


class RateWindow:
    """Sum of event amounts over the last ``window_s`` seconds, in one-second buckets.

    Args:
        window_s: window length in seconds (>= 1).
    """

    __slots__ = ("window_s", "_buckets", "_total", "_since_start", "_t0")

    def __init__(self, window_s: int = 60) -> None:
        if window_s < 1:
            raise ValueError("window_s must be >= 1")
        self.window_s = int(window_s)
        self._buckets: deque[list[float]] = deque()  # [second, amount]
        self._total = 0.0
        self._since_start = 0.0
        self._t0: float | None = None

    def add(self, now: float, amount: float = 1.0) -> None:
        """Record ``amount`` (events, tokens, USD...) at monotonic time ``now`` (seconds)."""
        if self._t0 is None:
            self._t0 = now
        sec = math.floor(now)
        if self._buckets and self._buckets[-1][0] == sec:
            self._buckets[-1][1] += amount
        else:
            self._buckets.append([sec, amount])
        self._total += amount
        self._since_start += amount
        self._expire(now)

    def start(self, now: float) -> None:
        """Mark the start of measurement (so an idle start counts in the denominator)."""
        if self._t0 is None:
            self._t0 = now

    def _expire(self, now: float) -> None:
        cutoff = math.floor(now) - self.window_s
        b = self._buckets
        while b and b[0][0] <= cutoff:
            self._total -= b.popleft()[1]

    def rate(self, now: float) -> float:
        """Amount per second over the recent window (per second; 0.0 before any data)."""
        self._expire(now)
        return window_rate(self._total, now, self._t0, self.window_s)

    @property
    def started(self) -> float | None:
        """Time of the first event or :meth:`start` (the clock of ``add``), None before either."""
        return self._t0

    def rate_since_start(self, now: float) -> float:
        """Amount per second since the first event or :meth:`start` (per second)."""
        if self._t0 is None:
            return 0.0
        return self._since_start / max(now - self._t0, 1.0)

    @property
    def since_start(self) -> float:
        """Total amount recorded since start."""
        return self._since_start


#: Window of the spend rate (s): "this engine's spend over the last 5 minutes" (the dashboard, the
#: metrics and ``datagen status`` all use it).
SPEND_WINDOW_S = 300


def window_rate(amount_in_window: float, now: float, t0: float | None, window_s: float) -> float:
    """:meth:`RateWindow.rate` from its parts: the amount of the last ``window_s`` seconds divided by
    the window, or by the time since ``t0`` (measurement start, same clock as ``now``) while that is
    shorter (at least 1 s). 0.0 when ``t0`` is None (nothing measured yet)."""
    if t0 is None:
        return 0.0
    return max(amount_in_window, 0.0) / min(float(window_s), max(now - t0, 1.0))


def eta_seconds(remaining: float, rate_per_s: float) -> float | None:
    """Seconds to finish ``remaining`` units at ``rate_per_s``; None when the rate is 0 or unknown."""
    if remaining <= 0:
        return 0.0
    if rate_per_s <= 0:
        return None
    return remaining / rate_per_s


def fmt_duration(seconds: float | None) -> str:
    """Human duration: ``"--"`` for unknown, else ``"45s"``, ``"12m05s"``, ``"3h12m"``, ``"2d04h"``."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def fmt_count(n: float) -> str:
    """Compact count: 950, 12.3k, 4.56M, 1.2G."""
    a = abs(n)
    if a < 1000:
        return f"{n:.0f}"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            v = n / div
            return f"{v:.3g}{suf}" if abs(v) < 100 else f"{v:.0f}{suf}"
    return f"{n:.0f}"
