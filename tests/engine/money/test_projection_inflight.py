"""Projections with streams in flight (issue 33): the streams under way at their expected final lengths, never
a total below spent + in flight, the ETA of a capped dataset bounded by its cap, the drain of the last
streams in the ETA, and survivorship (finished completions are the short ones) corrected. Pure, hand-computed."""

from __future__ import annotations

import random

import pytest

from engine.money.estimator import CompletionEstimator
from engine.money.projection import EtaRow, project_dataset, schedule_eta

PRICE = 2e-6  # USD per completion token


def _proj(**kw):
    args = dict(prompts_left=100, in_flight=10, used_tokens=0, token_budget=None, mean_completion_tokens=1000.0,
                max_tokens=8000, cost_so_far=1.0, cost_per_completion_token=PRICE, recent_tok_per_s=100.0,
                since_start_tok_per_s=100.0, cost_cap=None, observed=100, calibrate_after=50)
    args.update(kw)
    return project_dataset(**args)


def test_streams_in_flight_count_at_their_expected_final_lengths():
    # 10 streams expected to end at 30,000 tokens in all, 100 prompts left at 1,000
    p = _proj(in_flight_tokens=30_000.0)
    assert p.tokens_to_come == 30_000 + 100 * 1000
    assert p.projected_cost_usd == pytest.approx(1.0 + 130_000 * PRICE)
    assert p.floor_usd == pytest.approx(1.0 + 30_000 * PRICE)
    old = _proj()  # before: every stream in flight at the mean (10 x 1,000)
    assert old.tokens_to_come == 110 * 1000


def test_a_projection_is_never_below_spent_plus_in_flight_even_at_a_cap():
    # a $1.02 cap, $1 spent, $0.06 expected from the streams in flight: the clamp cannot go under $1.06
    p = _proj(in_flight_tokens=30_000.0, cost_cap=1.02)
    assert p.projected_cost_usd == pytest.approx(1.0 + 30_000 * PRICE) and p.capped_by == "max_cost_usd"
    assert p.uncapped_cost_usd == pytest.approx(1.0 + 130_000 * PRICE)  # the gate still sees the whole work


def test_a_token_budget_binds_only_the_prompts_left_and_the_streams_in_flight_come_anyway():
    p = _proj(in_flight_tokens=30_000.0, token_budget=50_000, used_tokens=10_000)
    assert p.tokens_to_come == 30_000 + (40_000 - 30_000)
    q = _proj(in_flight_tokens=45_000.0, token_budget=50_000, used_tokens=10_000)
    assert q.tokens_to_come == 45_000  # over what is left: they are under way


def test_the_eta_of_a_capped_dataset_counts_only_what_its_cap_lets_it_send():
    # $1 spent, a $1.10 cap, streams in flight worth $0.06: $0.04 left = 20,000 tokens of prompts left
    p = _proj(in_flight_tokens=30_000.0, cost_cap=1.10)
    assert p.eta_tokens == pytest.approx(30_000 + 20_000)
    assert p.tokens_to_come == 130_000  # the cost side keeps the whole work
    row = EtaRow.of("b", "running", "short", p, 100.0)
    assert row.tokens == pytest.approx(50_000)
    # a token budget closes when less than the next request's reservation is left
    b = _proj(in_flight_tokens=30_000.0, token_budget=50_000, next_request_tokens=5_000)
    assert b.eta_tokens == pytest.approx(30_000 + 15_000)


def test_the_drain_of_the_last_streams_is_in_the_eta():
    row = EtaRow("a", "running", "short", 100_000, 100_000, 100_000, 100.0, tail_s=300.0)
    assert schedule_eta([row]).eta_s == pytest.approx(1000 + 300)
    last = EtaRow("a", "running", "short", 1_000, 1_000, 1_000, 100.0, floor_s=900.0)
    assert schedule_eta([last]).eta_s == pytest.approx(900)  # its longest stream, not 10 s of tokens


def test_survivorship_the_censored_mean_is_what_projections_use():
    """2,000 streams of mean 2,000 started over the last 600 s at 4 tokens/s: the finished ones average ~650,
    the censored estimate ~2,000; the dataset's projection prices the prompts left at the latter."""
    rng = random.Random(7)
    est = CompletionEstimator(8000, calibrate_after=50)
    censored = []
    for i in range(2000):
        n = min(8000, 8 + int(rng.expovariate(1 / 1992)))
        age = rng.uniform(0, 600) * 4
        if n <= age:
            est.observe(n, i)
        else:
            censored.append(age)
    est.set_censored(censored)
    finished_mean = est.mean()
    assert finished_mean is not None and finished_mean < 900
    assert est.censored_mean() == pytest.approx(2000, rel=0.1)
    from engine.money.spend import _length_figures
    fig = _length_figures({"short": est}, {"short": 1000}, 1000, 4.0)
    assert fig.mean == pytest.approx(est.censored_mean())
    assert fig.in_flight_tokens > sum(censored) + len(censored) * 1500  # each at r + ~2,000 (memoryless)
    assert fig.tail_s > 0  # the drain of ~1,200 streams of 4 tokens/s


def test_the_eta_waits_only_for_what_the_streams_in_flight_still_have_to_stream():
    # B11/trial: 12 streams left at ~5,000 tokens each read as 2h37m: their streamed tokens counted as work
    p = _proj(prompts_left=0, in_flight=12, in_flight_tokens=12 * 7_000.0, in_flight_received=12 * 5_000.0)
    assert p.eta_tokens == pytest.approx(12 * 2_000)
    assert p.tokens_to_come == pytest.approx(12 * 7_000)  # the cost still counts all of it


def test_a_budget_limited_dataset_goes_at_its_own_pace_beside_the_lane():
    a = EtaRow("a", "running", "short", 50_000, 50_000, 50_000, 100.0, limited=True)  # trickling at its budget
    b = EtaRow("b", "running", "short", 100_000, 100_000, 100_000, 1_000.0)
    eta = schedule_eta([a, b])
    assert eta.rows["a"][0] == pytest.approx(500)  # its own 50,000 at its own 100 tok/s
    assert eta.rows["b"][0] == pytest.approx(100)  # not behind a's budget room: 100,000 at 1,000 tok/s
    lane = schedule_eta([EtaRow("a", "running", "short", 50_000, 50_000, 50_000, 100.0), b])
    assert lane.rows["b"][0] == pytest.approx(150_000 / 1_100)  # unlimited: one after another in the class


def test_streams_of_a_skipped_dataset_still_count_in_the_run_eta():
    # the trial: `s` left 2 streams in flight for ~4 minutes while the ETA read 0s
    skipped = EtaRow("a", "skipped", "short", 0, 0, 0, 0.0, floor_s=240.0)
    assert schedule_eta([skipped]).eta_s == pytest.approx(240)
    other = EtaRow("b", "running", "short", 10_000, 10_000, 10_000, 100.0)
    assert schedule_eta([skipped, other]).eta_s == pytest.approx(240)
