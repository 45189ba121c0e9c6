"""Windowed quantiles, error rates, the anomaly guard and provider figures. Hand-computed values."""

from __future__ import annotations

import pytest

from engine.metrics.stats import ErrorRateWindow, ProviderStats, QuantileWindow
from engine.run.anomaly import AnomalyGuard


def test_quantile_window_nearest_rank_and_eviction():
    w = QuantileWindow(5)
    assert w.quantile(0.5) is None and w.mean is None and w.count == 0
    for x in (5, 1, 4, 2, 3):
        w.add(x)
    assert w.quantile(0.5) == 3  # ceil(2.5) = 3rd of 1..5
    assert w.quantile(0.0) == 1 and w.quantile(1.0) == 5 and w.quantile(0.9) == 5
    assert w.quantile(0.2) == 1 and w.quantile(0.21) == 2
    assert w.mean == 3.0
    w.add(10)  # evicts the oldest (5): window 1, 4, 2, 3, 10
    assert w.count == 5 and w.mean == 4.0
    assert w.quantile(1.0) == 10 and w.quantile(0.8) == 4
    dup = QuantileWindow(2)
    for x in (7, 7, 1):
        dup.add(x)
    assert (dup.quantile(0.0), dup.quantile(1.0)) == (1, 7)


def test_quantile_window_rejects_bad_input():
    with pytest.raises(ValueError):
        QuantileWindow(0)
    w = QuantileWindow(3)
    with pytest.raises(ValueError):
        w.add(float("nan"))
    w.add(1)
    with pytest.raises(ValueError):
        w.quantile(1.5)


def test_error_rate_window():
    w = ErrorRateWindow(4)
    assert w.rate == 0.0 and w.count == 0 and not w.full
    for e in (True, False, False):
        w.add(e)
    assert w.rate == pytest.approx(1 / 3) and not w.full
    w.add(False)
    assert w.rate == 0.25 and w.count == 4 and w.full
    w.add(False)  # evicts the error
    assert w.rate == 0.0 and w.count == 4


def test_anomaly_guard_fires_once_per_key_until_reset():
    g = AnomalyGuard(threshold=0.2, window=200, min_requests=200)
    outcomes = [False] * 132 + [True] * 68
    got = [g.record("ds", e) for e in outcomes]
    assert got[:-1] == [None] * 199  # fewer than min_requests seen
    assert got[-1] == "error rate 34% over the last 200 attempts in dispatch order exceeds 20%"
    assert g.record("ds", True) is None  # quiet after firing
    assert g.record("other", True) is None  # keys are independent
    g.reset("ds")
    assert g.rate("ds") == 0.0
    got = [g.record("ds", True) for _ in range(200)]
    assert got[-1] == "error rate 100% over the last 200 attempts in dispatch order exceeds 20%"


def test_anomaly_guard_threshold_is_exclusive_and_rounding_is_honest():
    g = AnomalyGuard(threshold=0.2, window=10, min_requests=5)
    assert [g.record("k", e) for e in (True, False, False, False, False)] == [None] * 5  # 20%
    assert g.record("k", True) == "error rate 33% over the last 6 attempts in dispatch order exceeds 20%"
    h = AnomalyGuard(threshold=0.2, window=1000, min_requests=1000)
    res = [h.record("k", e) for e in [True] * 201 + [False] * 799]
    assert res[-1] == "error rate 20.1% over the last 1000 attempts in dispatch order exceeds 20%"
    with pytest.raises(ValueError):
        AnomalyGuard(min_requests=300, window=200)


def test_provider_stats_snapshot():
    s = ProviderStats()
    s.record_success("A", 2.0, 0.5, 300, 0.01)  # 300 / 1.5 = 200 tok/s
    s.record_success("A", 4.0, 1.0, 300, 0.02)  # 300 / 3.0 = 100 tok/s
    s.record_success("A", 1.0, None, 50, None)  # no TTFT: 50 / 1.0 = 50 tok/s, no cost
    s.record_error("A", "429")
    s.record_error("B", "5xx")
    s.record_error("B", "5xx")
    s.record_error(None, "timeout")
    s.exclude("B")
    a, b, u = s.snapshot()
    assert (a.name, b.name, u.name) == ("A", "B", "(unknown)")
    assert a.requests == 4 and a.errors == {"429": 1} and a.error_rate == 0.25
    assert (a.latency_p50_s, a.latency_p95_s) == (2.0, 4.0)
    assert (a.ttft_p50_s, a.ttft_p95_s) == (0.5, 1.0)
    assert a.tok_per_s_per_stream == 100.0
    assert a.mean_completion_tokens == pytest.approx(650 / 3)
    assert a.cost_usd == pytest.approx(0.03)
    assert not a.excluded
    assert b.requests == 2 and b.errors == {"5xx": 2} and b.error_rate == 1.0 and b.excluded
    assert b.latency_p50_s is None and b.tok_per_s_per_stream is None
    assert b.mean_completion_tokens is None and b.cost_usd == 0.0
    assert u.errors == {"timeout": 1}
    assert s.excluded == frozenset({"B"})
    s.include("B")
    assert s.excluded == frozenset()


def test_provider_stats_stream_duration_and_ties():
    s = ProviderStats()
    s.record_success("C", 10.0, 1.0, 100, 0.0, stream_s=4.0)
    s.record_success("D", 1.0, 1.0, 100, 0.0)  # zero streaming time: no tok/s sample
    c, d = s.snapshot()  # equal requests: by name
    assert (c.name, d.name) == ("C", "D")
    assert c.tok_per_s_per_stream == 25.0
    assert d.tok_per_s_per_stream is None
    with pytest.raises(ValueError):
        s.record_success("C", -1.0, None, 1, None)
