"""A pure, clock-free simulation of dispatch under a token budget (no I/O, no engine, no network).

It drives :class:`engine.money.budget.DatasetBudgets` the way :class:`engine.run.scheduler.Scheduler`
does, on simulated time: ``concurrency`` slots; each request's completion length is the
simulator's (``8 + int(Exp(mean - 8))``, capped at ``max_tokens``), it streams at
``tokens_per_s`` per stream after ``latency_s``; the in-flight streams' tokens so far are given
to the estimator as censored lengths every ``censor_every_s`` simulated seconds (the scheduler's
``CENSOR_EVERY_S``); a refused reservation stops the dataset for good when
:meth:`~engine.money.budget.DatasetBudgets.budget_met` says so, else dispatch waits for the next
completion. Used by ``tests/engine/money/test_budget.py`` (the overshoot sweep) and ``bench/b9_hard_cap.py``.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from engine.money.budget import DatasetBudgets


class _Progress:
    """A stream's progress as the scheduler's ``StreamProgress`` shows it (updated at each censoring)."""

    __slots__ = ("tokens_received",)

    def __init__(self) -> None:
        self.tokens_received = 0.0


@dataclass(frozen=True)
class SimOutcome:
    """One simulated run.

    Attributes:
        used: completion tokens used in the end (tokens).
        budget: the token budget (tokens).
        completed: requests completed (all of them: none is aborted).
        closed_at: simulated time (s) at which the budget closed (no further dispatch).
        ended_at: simulated time (s) at which the last request finished.
        in_flight_mean: requests in flight on average (time-weighted) from the first calibrated
            completion until the budget closed: how much of ``concurrency`` the budget let run.
    """

    used: int
    budget: int
    completed: int
    closed_at: float
    ended_at: float
    in_flight_mean: float = 0.0
    in_flight_peak: int = 0

    @property
    def ratio(self) -> float:
        """``used / budget``."""
        return self.used / self.budget


def simulate(*, concurrency: int, budget: int, seed: int, mean: int = 2000, max_tokens: int = 8000,
             tokens_per_s: float = 4000.0, latency_s: float = 0.05, censor_every_s: float = 0.25,
             hard_cap: bool = False, calibrate_after: int = 50, percentile: float = 0.90) -> SimOutcome:
    """Run one simulated dataset until its budget closes and every request finished.

    Args:
        concurrency: request slots (requests in flight at most).
        budget: completion-token budget (tokens).
        seed: seeds the completion lengths.
        mean / max_tokens: completion length mean and cap (tokens).
        tokens_per_s / latency_s: per-stream generation speed (tokens/s) and time to first token (s).
        censor_every_s: period of the censored-length updates (s).
        hard_cap: ``[spend] hard_cap``.
        calibrate_after / percentile: ``[spend]`` settings.

    Returns:
        The :class:`SimOutcome`.
    """
    rng = random.Random(seed)
    db = DatasetBudgets({"c": max_tokens}, token_budget=budget, calibrate_after=calibrate_after,
                        percentile=percentile, hard_cap=hard_cap)
    heap: list[tuple[float, int, int, float, object]] = []  # (finish, seq, length, start, reservation)
    now = 0.0
    seq = 0
    censored_at = -1e9
    closed_at: float | None = None
    completed = 0
    progress: dict[int, _Progress] = {}
    area = 0.0  # integral of in-flight requests over time, from calibration until the budget closed
    area_from: float | None = None
    peak = 0

    def length() -> int:
        n = 8 + int(rng.expovariate(1.0 / (mean - 8)))
        return min(n, max_tokens)

    def censor() -> None:
        for (_f, sq, ln, st, _r) in heap:
            progress[sq].tokens_received = min(ln, max(0.0, (now - st - latency_s) * tokens_per_s))
        db.estimators["c"].set_censored([p.tokens_received for p in progress.values()])
        db.refresh()

    while True:
        if closed_at is None:
            if now - censored_at >= censor_every_s:
                censored_at = now
                censor()
            while len(heap) < concurrency:
                r = db.try_reserve("c", 0, None)
                if r is None:
                    if db.budget_met("c"):
                        closed_at = now
                    break
                ln = length()
                seq += 1
                heapq.heappush(heap, (now + latency_s + ln / tokens_per_s, seq, ln, now, r))
                progress[seq] = _Progress()
                db.track(r, progress[seq])
        if area_from is not None:
            peak = max(peak, len(heap))
        if not heap:
            break
        finish, sq, ln, _st, r = heapq.heappop(heap)
        if area_from is not None and closed_at is None:
            area += len(heap) * (finish - now) + (finish - now)
        del progress[sq]
        now = finish
        if area_from is None and completed + 1 >= calibrate_after:
            area_from = now
        db.settle(r, 0, ln, None, None)  # type: ignore[arg-type]
        completed += 1
    assert db.tokens.reserved == 0
    end = closed_at if closed_at is not None else now
    span = end - area_from if area_from is not None else 0.0
    return SimOutcome(int(db.tokens.used), budget, completed, end, now, area / span if span > 0 else 0.0, peak)
