"""The run's dollars in flight read from the per-dataset cache (engine.run.ending.RunEnding.in_flight_cost)
equal the figures priced now after every change that moves them, and are at most a second of the
run's clock old otherwise (issue 37, B1 CPU per request). A fake clock; the real SpendControl."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from engine.client.progress import StreamProgress
from engine.config import parse_config
from engine.money.inflight import InFlightCost
from engine.money.spend import SpendControl
from engine.run.ending import RunEnding


def _ending(tmp_path, datasets=("a", "b")):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "x"}) + "\n")
    cfg = parse_config({
        "run": {"name": "fly", "dir": str(tmp_path / "run")},
        "provider": {"kind": "simulated"},
        "pricing": {"prompt_usd_per_m": 0.6, "completion_usd_per_m": 2.5},
        "classes": {"short": {"max_tokens": 8000, "concurrency": 4000}},
        "datasets": [{"name": d, "path": str(p), "format": "text"} for d in datasets],
    }, tmp_path / "config.toml")
    spend = SpendControl(cfg)
    run = SimpleNamespace(datasets={d: SimpleNamespace(name=d, streams={}, tasks=set()) for d in datasets},
                          stopping=False)
    t = [100.0]
    end = RunEnding(cfg, run, spend, lambda: t[0], lambda *a: None)
    return end, run, spend, t


class _Rng:
    def __init__(self) -> None:
        self.r = random.Random(7)
        self.next_id = 0

    def add(self, rt, n: int, provider: str = "") -> list[int]:
        ids = []
        for _ in range(n):
            prog = StreamProgress()
            prog.chars_received = int(self.r.expovariate(1 / 5000))
            prog.provider = provider
            rt.streams[self.next_id] = ("short", prog, 200)
            ids.append(self.next_id)
            self.next_id += 1
        return ids


def _exact(end: RunEnding, dataset: str | None = None) -> InFlightCost:
    """The figure as the engine priced it before the cache: the sum of the per-stream costs."""
    total = InFlightCost()
    for _p, c in end.stream_costs(dataset):
        total = total + c
    return total


def _same(a: InFlightCost, b: InFlightCost) -> None:
    assert a.streams == b.streams and a.abort_observed == b.abort_observed
    for f in ("generated_usd", "expected_usd", "abort_usd"):
        assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-12), f


def test_cached_figures_equal_fresh_ones_after_each_change(tmp_path):
    end, run, spend, t = _ending(tmp_path)
    a, b = run.datasets["a"], run.datasets["b"]
    rng = _Rng()
    assert end.in_flight_cost() == InFlightCost()
    rng.add(a, 30, "SimA")
    rng.add(b, 20)

    def check() -> None:
        for d in (None, "a", "b"):
            _same(end.in_flight_cost(d), _exact(end, d))
            _same(end.in_flight_cost(d, fresh=True), _exact(end, d))

    check()  # before any completion: every stream at max_tokens
    first = end.in_flight_cost("a")
    assert first.expected_usd == pytest.approx(30 * (200 * 0.6e-6 + 8000 * 2.5e-6))
    for x in (300, 900, 1500, 2500, 4000) * 4:  # the first completions: the model leaves its bound
        spend.budgets["a"].estimators["short"].observe(x)
    assert end.in_flight_cost("a").expected_usd < 0.8 * first.expected_usd  # same clock, recomputed
    check()
    rng.add(a, 1)  # a stream started
    check()
    del a.streams[next(iter(a.streams))]  # one ended
    check()
    k = next(iter(b.streams))
    b.streams[k + 10_000] = b.streams.pop(k)  # one of b's swapped for another
    check()
    before = end.in_flight_cost()
    for _ in range(5):  # the abort billing learned a provider's share: the abort estimate moves
        spend.aborts.add("SimA", 0.01, 0.05, 0.01)
    after = end.in_flight_cost()
    assert after.abort_observed == 50 and after.abort_usd < before.abort_usd  # b's unknown providers: pooled
    check()
    assert end.abort("a") == 0  # no tasks here; an abort recomputes what is left
    assert end.flight.get("a", t[0], end._flight_key(spend.prices()), a.streams.keys()) is None
    check()
    a.streams.clear()
    assert end.in_flight_cost("a") == InFlightCost()
    check()


def test_cached_figures_are_at_most_a_second_of_the_run_clock_old(tmp_path):
    end, run, spend, t = _ending(tmp_path, ("a",))
    a = run.datasets["a"]
    rng = _Rng()
    for x in range(200, 4000, 19):
        spend.budgets["a"].estimators["short"].observe(x)
    rng.add(a, 2000)
    first = end.in_flight_cost()
    _same(first, _exact(end))
    for _c, prog, _p in a.streams.values():  # every stream streams on
        prog.chars_received += 400
    t[0] += 0.9
    assert end.in_flight_cost() == first  # within the age: the figure kept (what a second of streaming moves)
    assert _exact(end).generated_usd > first.generated_usd * 1.01
    progressed = _exact(end)
    ended = list(a.streams)[:150]
    for k in ended:  # 150 ended, 150 started: 300 changes of 2,000 streams, immaterial
        del a.streams[k]
    rng.add(a, 150)
    kept = end.in_flight_cost()
    assert kept == first
    # what the turnover alone moved: about sqrt(300) / 2,000 of the figure (exponential lengths)
    assert _exact(end).expected_usd == pytest.approx(progressed.expected_usd, rel=0.02)
    assert (end.flight.hits, end.flight.misses) == (2, 1)
    t[0] += 0.1  # one second since it was priced: priced again
    _same(end.in_flight_cost(), _exact(end))
    again = end.in_flight_cost()
    for k in list(a.streams)[:201]:  # 201 ended and 201 started: 402 > 400, material at once
        del a.streams[k]
    rng.add(a, 201)
    misses = end.flight.misses
    assert end.in_flight_cost() != again and end.flight.misses == misses + 1
    _same(end.in_flight_cost(), _exact(end))


def test_observed_prices_refitted_at_every_result_keep_the_figure_until_they_move(tmp_path):
    end, run, spend, t = _ending(tmp_path, ("a",))
    rng = _Rng()
    rng.add(run.datasets["a"], 150)
    for i in range(40):  # observed prices replace the config's once 20 results had a cost
        spend.observer.observe(300 + i, 1000 + 37 * i, (300 + i) * 0.6e-6 + (1000 + 37 * i) * 2.5e-6)
    first = end.in_flight_cost()
    assert spend.prices().source == "observed"
    spend.observer.observe(500, 2000, 500 * 0.6e-6 + 2000 * 2.5e-6 * (1 + 1e-7))  # a refit: 7th digit
    assert end.in_flight_cost() == first and end.flight.misses == 1
    for _ in range(40):  # the completion price moved 2x: recomputed at once, same clock
        spend.observer.observe(500, 2000, 500 * 0.6e-6 + 2000 * 5.0e-6)
    assert end.in_flight_cost().generated_usd > first.generated_usd * 1.2
    _same(end.in_flight_cost(), _exact(end))
