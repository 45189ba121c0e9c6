"""The anomaly guard judges attempts in dispatch order, counting only a fully resolved prefix:
fast errors and slow successes must not read as a high error rate (survivorship by duration)."""

from __future__ import annotations

import heapq
import random

import pytest

from engine.metrics.stats import ErrorRateWindow
from engine.run.anomaly import AnomalyGuard


def simulate(error_rate: float, prompts: int = 128, seed: int = 7, window: int = 200, min_requests: int = 50):
    """All ``prompts`` dispatched at t=0 (concurrency above the prompt count); an attempt fails
    with probability ``error_rate`` after 0.3 s (retried 0.5 s later as a new attempt), else
    succeeds after 3-20 s (streaming). Outcomes are fed to the guard in completion order.

    Returns (first reason or None, the error rate a completion-order window of ``min_requests``
    outcomes showed when it first held that many, attempts, errors)."""
    rng = random.Random(seed)
    g = AnomalyGuard(threshold=0.2, window=window, min_requests=min_requests)
    naive = ErrorRateWindow(min_requests)
    naive_rate = None
    events: list[tuple[float, int, int, bool]] = []  # (time, tie, seq, is_error)
    tie = 0

    def dispatch(t: float) -> None:
        nonlocal tie
        seq = g.dispatch("ds")
        err = rng.random() < error_rate
        heapq.heappush(events, (t + (0.3 if err else rng.uniform(3.0, 20.0)), tie, seq, err))
        tie += 1

    for _ in range(prompts):
        dispatch(0.0)
    reason, attempts, errors = None, 0, 0
    while events:
        t, _, seq, err = heapq.heappop(events)
        attempts += 1
        errors += err
        naive.add(err)
        if naive_rate is None and naive.full:
            naive_rate = naive.rate
        got = g.resolve("ds", seq, err)
        reason = reason or got
        if err:
            dispatch(t + 0.5)
    return reason, naive_rate, attempts, errors


def test_fast_errors_and_slow_successes_at_12_percent_do_not_fire():
    for seed in range(20):
        reason, naive_rate, attempts, errors = simulate(0.12, seed=seed)
        assert errors / attempts < 0.2
        assert reason is None, (seed, reason, errors, attempts)
    # the completion-order window the guard used to read is biased far above the true rate
    reason, naive_rate, attempts, errors = simulate(0.12, seed=3)
    assert naive_rate is not None and naive_rate > 0.2 > errors / attempts


def test_a_true_40_percent_rate_fires():
    for seed in range(10):
        reason, _, attempts, errors = simulate(0.40, seed=seed)
        assert reason is not None and reason.startswith("error rate "), (seed, errors, attempts)
        assert "attempts in dispatch order exceeds 20%" in reason
        rate = int(reason.split()[2].rstrip("%"))
        assert 25 <= rate <= 60, reason  # an unbiased estimate of 40% over >= 50 attempts


def test_nothing_is_judged_while_an_earlier_attempt_is_in_flight():
    g = AnomalyGuard(threshold=0.2, window=10, min_requests=5)
    slow = g.dispatch("k")  # seq 0, still streaming
    errs = [g.dispatch("k") for _ in range(6)]
    assert [g.resolve("k", s, True) for s in errs] == [None] * 6  # all behind seq 0
    assert g.rate("k") == 0.0 and g.pending("k") == 7
    assert g.resolve("k", slow, False) == "error rate 86% over the last 7 attempts in dispatch order exceeds 20%"
    assert g.pending("k") == 0


def test_uncounted_and_repeated_resolutions():
    g = AnomalyGuard(threshold=0.2, window=10, min_requests=2)
    a, b, c = g.dispatch("k"), g.dispatch("k"), g.dispatch("k")
    assert g.resolve("k", a, None) is None  # a rate limit / abort: closes its place, not counted
    assert g.resolve("k", b, False) is None
    assert g.resolve("k", b, True) is None  # first resolution wins
    assert g.resolve("k", 99, True) is None  # never dispatched
    assert g.resolve("k", c, True) == "error rate 50% over the last 2 attempts in dispatch order exceeds 20%"


def test_reset_forgets_attempts_dispatched_before_it():
    g = AnomalyGuard(threshold=0.2, window=10, min_requests=2)
    old = [g.dispatch("k") for _ in range(3)]
    g.reset("k")
    new = [g.dispatch("k") for _ in range(2)]
    assert [g.resolve("k", s, True) for s in old] == [None] * 3  # measured afresh
    assert g.rate("k") == 0.0
    assert g.resolve("k", new[0], False) is None
    assert g.resolve("k", new[1], False) is None and g.rate("k") == 0.0


def test_window_keeps_the_last_attempts():
    g = AnomalyGuard(threshold=0.2, window=4, min_requests=4)
    assert [g.record("k", e) for e in (True, True, False, False)] == [None, None, None,
                                                                       "error rate 50% over the last 4 attempts in "
                                                                       "dispatch order exceeds 20%"]
    with pytest.raises(ValueError):
        AnomalyGuard(window=4, min_requests=5)
