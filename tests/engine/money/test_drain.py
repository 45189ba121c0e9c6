"""The drain outlook (:mod:`engine.money.drain`): when the streams in flight are expected to end and
what the abort at a drain's deadline would cut and bill. Hand-computed values (issue 33)."""

from __future__ import annotations

import math

import pytest

from engine.money.drain import DrainStream, drain_outlook


def test_one_stream_ends_at_its_median_and_a_deadline_after_it_cuts_its_tail():
    s = DrainStream(remaining_tokens=100, cap_tokens=1000, tok_per_s=10, generated_usd=0.01,
                    completion_usd_per_token=1e-4, abort_share=1.0)
    o = drain_outlook([s], deadline_s=20)
    assert o.streams == 1 and o.bound_s == pytest.approx(100)
    assert o.expected_s == pytest.approx(10 * math.log(2), abs=0.5)  # p(t) = exp(-t/10) falls below 0.5
    assert o.cut_streams == pytest.approx(math.exp(-2))
    # cut at 20 s: 0.01 + 1e-4 x (200 streamed + the 100 still expected, billed in full)
    assert o.abort_usd == pytest.approx(math.exp(-2) * 0.04)
    assert o.ends_before_deadline
    stops = drain_outlook([DrainStream(100, 1000, 10, 0.01, 1e-4, abort_share=0.0)], deadline_s=20)
    assert stops.abort_usd == pytest.approx(math.exp(-2) * 0.03)  # its provider stops billing at the cut


def test_many_long_streams_end_at_max_tokens_after_the_countdown():
    """The trial's shape: 2,000 streams at 4 tok/s, ~2,000 tokens still expected each, 6,000 tokens
    to max_tokens: the last ends at the max_tokens bound (25 min), after a 15-minute countdown, which
    cuts exp(-3,600/2,000) of them."""
    streams = [DrainStream(2000, 6000, 4.0, 0.001, 2.5e-6) for _ in range(2000)]
    o = drain_outlook(streams, deadline_s=900)
    assert o.bound_s == pytest.approx(1500)
    assert o.expected_s == pytest.approx(1500, abs=0.5)  # 2,000 x exp(-t/500) >= 0.5 until the bound
    assert not o.ends_before_deadline
    p = math.exp(-3600 / 2000)
    assert o.cut_streams == pytest.approx(2000 * p)
    assert o.abort_usd == pytest.approx(2000 * p * (0.001 + 2.5e-6 * (3600 + 2000)))


def test_no_rate_no_time_and_no_streams_nothing():
    o = drain_outlook([DrainStream(100, 1000, None)], deadline_s=60)
    assert (o.streams, o.expected_s, o.bound_s) == (1, None, None)
    empty = drain_outlook([], deadline_s=None)
    assert (empty.streams, empty.expected_s, empty.cut_streams, empty.abort_usd) == (0, 0.0, 0.0, 0.0)
