"""The dollars in flight of each dataset, kept between reads while they cannot have moved materially.

Pricing every stream in flight (:func:`engine.money.inflight.streams_total`) is O(streams): at 2,000
streams it was about half of the engine process's CPU (measured ~10 ms a figure, asked ~5 times a
second by the snapshot, the live row's per-dataset figures, the run-directory guard and the credits
floor). :class:`FlightCache` keeps one figure per dataset and gives it back while all of these hold:

- the same ``key``: the caller's version of what moves the figure at once (the prices to 4
  significant digits, :func:`price_key`; the abort billing learned so far, an abort, which classes
  have a completion); a new key recomputes;
- at most ``max_age_s`` seconds of the RUN's clock old (:data:`MAX_AGE_S`): the tokens streamed and
  the length model move continuously, and a displayed figure follows them within that age; a
  clock read earlier than the figure (a test's clock set back) recomputes;
- the streams in flight are the same but for an immaterial turnover: with ``n`` streams, ``k``
  started or ended since the figure was taken (counted exactly, as the symmetric difference of the
  stream keys) is immaterial while ``k <= (material_share x n)**2``. Swapping ``k`` of ``n`` streams
  of similar expected cost moves their sum by about ``sqrt(k) / n`` of it (the streams' costs vary
  about as much as they average, exponential lengths), so this keeps that drift within
  ``material_share`` (:data:`MATERIAL_SHARE`, 1%): 400 of 2,000 streams, 1 of 100, none below 100
  streams (every change of a small run recomputes, so its figures are always exact but for the age).

So a cached figure is at most :data:`MAX_AGE_S` seconds of the run's clock old and, within that, off
by the streams' progress in that time (the tokens they streamed: ``generated_usd`` grows by them),
about 1% for the turnover, and up to 0.05% of a price refitted in that time. It is for display and
guards (the dashboard, ``status``, the credits floor, the run-directory guard, the drain and quit
confirmations: each reads a figure that was exact at most a second earlier, and none acts on a 1%
difference: the credits floor's margin is dollars of credits, re-read every poll); what is billed or
accounted (an abort's costs, the cut streams' costs) is priced fresh by the caller, never from here.
Pure bookkeeping: no I/O, no clocks (the caller passes ``now``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, KeysView
from dataclasses import dataclass
from typing import Any

from engine.money.inflight import InFlightCost

MAX_AGE_S = 1.0
"""Seconds of the run's clock a cached figure is given back for at most (the live row's age too)."""

MATERIAL_SHARE = 0.01
"""Share of a dataset's in-flight dollars the turnover of its streams may move a cached figure by
(see the module docstring): ``k`` streams started or ended out of ``n`` are immaterial while
``k <= (MATERIAL_SHARE x n)**2``."""


PRICE_DIGITS = 4
"""Significant digits of a price a figure is keyed on (:func:`price_key`): observed prices are refitted
at every result (:class:`engine.money.prices.PriceObserver`) and move in the 5th digit and beyond
after the first results, which moves no displayed dollar figure."""


def price_key(prices: Any) -> tuple | None:
    """What of ``prices`` (:class:`engine.money.prices.Prices` or None) keys a cached figure: each
    per-token price to :data:`PRICE_DIGITS` significant digits (a change beyond 0.05% of a price
    recomputes at once) and its source; None without prices."""
    if prices is None:
        return None
    return (float(f"{prices.prompt_usd_per_token:.{PRICE_DIGITS}g}"),
            float(f"{prices.completion_usd_per_token:.{PRICE_DIGITS}g}"), prices.source)


def material_turnover(changed: int, streams: int, share: float = MATERIAL_SHARE) -> bool:
    """True when ``changed`` streams started or ended since a figure over ``streams`` streams moves it
    by more than ``share`` of itself: ``changed > (share x streams)**2`` (see the module docstring)."""
    return changed > (share * streams) ** 2


@dataclass(frozen=True)
class _Entry:
    at: float
    key: Hashable
    ids: frozenset
    cost: InFlightCost


class FlightCache:
    """One :class:`~engine.money.inflight.InFlightCost` per dataset, given back while it is fresh
    (see the module docstring).

    Args:
        max_age_s: seconds of the run's clock an entry is fresh for (>= 0; 0: never reused).
        material_share: see :func:`material_turnover` (>= 0; 0: any turnover recomputes).

    Raises:
        ValueError: a negative argument.
    """

    def __init__(self, max_age_s: float = MAX_AGE_S, material_share: float = MATERIAL_SHARE) -> None:
        if max_age_s < 0 or material_share < 0:
            raise ValueError("need max_age_s >= 0 and material_share >= 0")
        self.max_age_s = float(max_age_s)
        self.material_share = float(material_share)
        self._entries: dict[str, _Entry] = {}
        #: reads answered from an entry / recomputed (for measurements and tests)
        self.hits = 0
        self.misses = 0

    def get(self, dataset: str, now: float, key: Hashable, ids: KeysView[Any] | Iterable[Any]) -> InFlightCost | None:
        """The cached figure of ``dataset`` when it is still fresh at ``now`` (run-clock seconds) for
        ``key`` and the streams ``ids`` now in flight (their keys, e.g. ``dict.keys()``); else None
        (the caller prices the streams and :meth:`put` s the figure)."""
        e = self._entries.get(dataset)
        if (e is None or e.key != key or not 0.0 <= now - e.at < self.max_age_s
                or material_turnover(len(e.ids.symmetric_difference(ids)), len(e.ids), self.material_share)):
            self.misses += 1
            return None
        self.hits += 1
        return e.cost

    def put(self, dataset: str, now: float, key: Hashable, ids: Iterable[Any], cost: InFlightCost) -> InFlightCost:
        """Keep ``cost``, the figure of ``dataset``'s streams ``ids`` priced at ``now`` under ``key``;
        returns it."""
        self._entries[dataset] = _Entry(float(now), key, frozenset(ids), cost)
        return cost

    def forget(self, dataset: str | None = None) -> None:
        """Drop the entry of ``dataset`` (None: every entry): its next read recomputes."""
        if dataset is None:
            self._entries.clear()
        else:
            self._entries.pop(dataset, None)
