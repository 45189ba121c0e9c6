"""Pure helpers of ``datagen report``: time bins, binned sums, histograms (no I/O, no clocks).

Times are epoch seconds; a binned series is a list of per-bin sums over ``[t0 + i * bin_s,
t0 + (i + 1) * bin_s)``, the last bin closed on the right so the final event is counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

#: Bin widths (seconds) :func:`bin_width` chooses from: round numbers on a clock.
NICE_BINS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def bin_width(span_s: float, target_bins: int = 60) -> float:
    """The smallest of :data:`NICE_BINS_S` giving at most ``target_bins`` bins over ``span_s``
    seconds (whole days past the table). ``span_s <= 0`` gives 1 s.

    Raises:
        ValueError: ``target_bins < 1``.
    """
    if target_bins < 1:
        raise ValueError(f"target_bins must be >= 1, got {target_bins}")
    need = max(span_s, 0.0) / target_bins
    for b in NICE_BINS_S:
        if b >= need:
            return float(b)
    return 86400.0 * math.ceil(need / 86400.0)


def bin_count(t0: float, t1: float, bin_s: float) -> int:
    """Bins of ``bin_s`` seconds that cover ``[t0, t1]`` (at least 1)."""
    return max(1, math.ceil((t1 - t0) / bin_s - 1e-9))


def binned_sum(events: Iterable[tuple[float, float]], t0: float, bin_s: float, n: int) -> list[float]:
    """Per-bin sums of ``(time, value)`` events; events before ``t0`` go to the first bin, those
    past the last bin to the last one (so a sum over the bins is the sum over the events)."""
    out = [0.0] * n
    for t, v in events:
        i = min(n - 1, max(0, int((t - t0) // bin_s)))
        out[i] += v
    return out


def cumulative(values: Iterable[float]) -> list[float]:
    """Running sums: ``[v0, v0 + v1, ...]``."""
    out, s = [], 0.0
    for v in values:
        s += v
        out.append(s)
    return out


def histogram(values: list[float], bins: int = 30, lo: float = 0.0, hi: float | None = None) -> dict[str, list[Any]]:
    """Equal-width histogram of ``values`` over ``[lo, hi]`` (``hi`` default: the largest value;
    the last bin closed on the right).

    Returns:
        ``{"edges": [bins + 1 floats], "counts": [bins ints]}``; empty lists for no values.
    """
    if not values:
        return {"edges": [], "counts": []}
    hi = max(values) if hi is None else hi
    if hi <= lo:
        hi = lo + 1.0
    w = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int((v - lo) // w)))] += 1
    return {"edges": [lo + i * w for i in range(bins + 1)], "counts": counts}


def time_unit(span_s: float) -> tuple[str, float]:
    """``(label, seconds per unit)`` for an axis spanning ``span_s`` seconds: s, min or h."""
    if span_s <= 300:
        return "s", 1.0
    if span_s <= 5 * 3600:
        return "min", 60.0
    return "h", 3600.0
