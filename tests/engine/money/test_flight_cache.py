"""The dollars in flight kept between reads (engine.money.flightcache) and their one-pass sum
(engine.money.inflight.streams_total): issue 37, B1 CPU per request."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from engine.money.flightcache import MATERIAL_SHARE, MAX_AGE_S, FlightCache, material_turnover
from engine.money.inflight import InFlightCost, LengthModel, streams_cost, streams_total


def _streams(n: int, seed: int = 1):
    rng = random.Random(seed)
    return [(rng.choice(["short", "long"]),
             SimpleNamespace(tokens_received=int(rng.expovariate(1 / 1500)), provider=rng.choice(["SimA", "SimC", ""])),
             float(rng.randint(50, 900)))
            for _ in range(n)]


def test_streams_total_is_the_sum_of_streams_cost_to_the_last_bit():
    streams = _streams(300)
    lengths = {"short": [float(x) for x in range(100, 3000, 7)], "long": []}  # "long": nothing completed yet
    args = (lambda c: lengths[c], lambda c: {"short": 4000, "long": 8000}[c], 0.6e-6, 2.5e-6,
            lambda p: {"SimA": 0.1, "SimC": 0.9}.get(p))
    each = streams_cost(streams, *args)
    want = InFlightCost()
    for _p, c in each:
        want = want + c
    got = streams_total(streams, *args)
    assert got == want  # bitwise: the same operations in the same order
    assert got.streams == 300 and 0 < got.abort_observed < 300
    assert got.generated_usd < got.abort_usd < got.expected_usd
    # a stream of the class without completions is priced at max_tokens
    one = streams_total([("long", SimpleNamespace(tokens_received=10, provider=""), 100.0)], *args)
    assert one.expected_usd == pytest.approx(100 * 0.6e-6 + 8000 * 2.5e-6)
    # the model argument is used as streams_cost uses it
    model = lambda c, r: LengthModel([1000.0] * 20, r, 4000)  # noqa: E731
    assert streams_total(streams, *args, model=model) == sum((c for _p, c in streams_cost(streams, *args, model=model)),
                                                              start=InFlightCost())
    assert streams_total([], *args) == InFlightCost()


def test_turnover_is_material_beyond_one_percent_of_the_figure():
    assert MATERIAL_SHARE == 0.01
    assert material_turnover(1, 50)  # below 100 streams every change is material
    assert not material_turnover(0, 50)
    assert not material_turnover(1, 100) and material_turnover(2, 100)
    assert not material_turnover(400, 2000) and material_turnover(401, 2000)


def test_cache_gives_back_a_figure_only_while_fresh():
    c = FlightCache()
    assert c.max_age_s == MAX_AGE_S == 1.0
    fig = InFlightCost(3, 0.1, 0.2, 0.15, 0)
    ids = {1: None, 2: None, 3: None}
    assert c.get("a", 10.0, "k", ids.keys()) is None  # nothing yet
    assert c.put("a", 10.0, "k", ids.keys(), fig) is fig
    assert c.get("a", 10.0, "k", ids.keys()) is fig
    assert c.get("a", 10.999, "k", ids.keys()) is fig  # within the age
    assert c.get("a", 11.0, "k", ids.keys()) is None  # one second of the run's clock: stale
    assert c.get("a", 9.5, "k", ids.keys()) is None  # the clock went back (a test's clock): recompute
    assert c.get("a", 10.5, "k2", ids.keys()) is None  # the key moved (prices, billing, an abort)
    assert c.get("a", 10.5, "k", {1: None, 2: None}.keys()) is None  # a stream ended: 3 streams, material
    assert c.get("a", 10.5, "k", {1: None, 2: None, 4: None}.keys()) is None  # one swapped: 2 changes
    assert c.get("b", 10.5, "k", ids.keys()) is None  # per dataset
    assert (c.hits, c.misses) == (2, 7)
    c.forget("a")
    assert c.get("a", 10.0, "k", ids.keys()) is None


def test_cache_keeps_a_large_figure_through_an_immaterial_turnover():
    c = FlightCache()
    ids = set(range(2000))
    fig = InFlightCost(2000, 1.0, 4.0, 4.0, 0)
    c.put("a", 0.0, "k", ids, fig)
    swapped = (ids - set(range(200))) | set(range(5000, 5200))  # 400 changes: 200 ended, 200 started
    assert c.get("a", 0.5, "k", swapped) is fig
    assert c.get("a", 0.5, "k", swapped | {9999}) is None  # 401


def test_cache_refuses_negative_settings():
    with pytest.raises(ValueError):
        FlightCache(max_age_s=-1)
    with pytest.raises(ValueError):
        FlightCache(material_share=-0.1)


def test_price_key_ignores_the_refit_jitter_of_observed_prices():
    from engine.money.flightcache import PRICE_DIGITS, price_key
    from engine.money.prices import Prices

    assert PRICE_DIGITS == 4
    assert price_key(None) is None
    a = Prices(6.0e-7, 2.5e-6, "observed")
    assert price_key(a) == (6.0e-7, 2.5e-6, "observed")
    assert price_key(Prices(6.00001e-7, 2.500004e-6, "observed")) == price_key(a)  # a refit, 5th digit
    assert price_key(Prices(6.0e-7, 2.502e-6, "observed")) != price_key(a)  # 0.08%: recomputed
    assert price_key(Prices(6.0e-7, 2.5e-6, "config")) != price_key(a)
