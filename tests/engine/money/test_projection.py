"""Projections of final tokens, cost and time; the calibration gate. Hand-computed values."""

from __future__ import annotations

import pytest

from engine.money.projection import (
    DatasetProjection,
    EtaRow,
    calibration_gate,
    project_dataset,
    project_run,
    range_text,
    schedule_eta,
    spend_rate_usd_per_h,
)


def _proj(**over) -> DatasetProjection:
    args = dict(
        prompts_left=90, in_flight=10, used_tokens=50_000, token_budget=None,
        mean_completion_tokens=500.0, max_tokens=4000, cost_so_far=1.0,
        cost_per_completion_token=2e-6, recent_tok_per_s=100.0, since_start_tok_per_s=50.0,
        cost_cap=None,
    )
    args.update(over)
    return project_dataset(**args)


def test_project_dataset_unbounded():
    p = _proj()
    assert p.tokens_to_come == 50_000  # (90 + 10) x 500
    assert p.projected_final_tokens == 100_000
    assert p.projected_cost_usd == pytest.approx(1.1)  # 1.0 + 50,000 x 2e-6
    assert p.eta_s_recent == 500.0 and p.eta_s_since_start == 1000.0
    assert p.calibrated and not p.over_cap and p.mean_completion_tokens == 500.0


def test_project_dataset_capped_by_token_budget():
    p = _proj(token_budget=80_000)
    assert p.tokens_to_come == 30_000
    assert p.projected_final_tokens == 80_000
    assert p.projected_cost_usd == pytest.approx(1.06)
    assert (p.eta_s_recent, p.eta_s_since_start) == (300.0, 600.0)
    done = _proj(token_budget=80_000, used_tokens=85_000, recent_tok_per_s=0.0)
    assert done.tokens_to_come == 0 and done.projected_final_tokens == 85_000
    assert done.eta_s_recent == 0.0  # nothing left: done, even at rate 0


def test_project_dataset_uncalibrated_uses_max_tokens():
    p = _proj(mean_completion_tokens=None)
    assert p.tokens_to_come == 400_000 and not p.calibrated
    assert p.mean_completion_tokens == 4000
    assert p.projected_cost_usd == pytest.approx(1.8)


def test_project_dataset_none_paths_and_over_cap():
    unknown = _proj(cost_per_completion_token=None, cost_cap=0.5)
    assert unknown.projected_cost_usd is None and not unknown.over_cap
    stalled = _proj(recent_tok_per_s=0.0, since_start_tok_per_s=0.0)
    assert stalled.eta_s_recent is None and stalled.eta_s_since_start is None
    assert _proj(cost_cap=1.05).over_cap
    assert not _proj(cost_cap=1.2).over_cap
    with pytest.raises(ValueError):
        _proj(prompts_left=-1)


def test_project_run_sums_remaining_cost_and_tokens():
    a = _proj()  # 50,000 to come, $1.00 so far -> $1.10
    b = _proj(prompts_left=20, in_flight=10, cost_so_far=0.5, mean_completion_tokens=1000.0)
    assert b.tokens_to_come == 30_000 and b.projected_cost_usd == pytest.approx(0.56)
    run = project_run([a, b], 3.6, 2.0, cost_cap=2.1)
    assert run.tokens_to_come == 80_000
    # 2.0 + 0.10 + 0.06 = 2.16 would pass the $2.10 cap: spend cannot, the projection stops there
    assert run.uncapped_cost_usd == pytest.approx(2.16)
    assert run.projected_cost_usd == pytest.approx(2.1) and run.capped and run.cap_usd == pytest.approx(2.1)
    assert run.spend_rate_usd_per_h == 3.6
    assert run.over_cap and run.calibrated
    free = project_run([a, b], 3.6, 2.0)
    assert not free.over_cap and not free.capped and free.projected_cost_usd == pytest.approx(2.16)


def test_project_run_none_paths():
    a = _proj()
    unpriced = _proj(cost_per_completion_token=None)
    run = project_run([a, unpriced], 0.0, 2.0, cost_cap=1.0)
    assert run.projected_cost_usd is None and not run.over_cap and not run.capped
    finished_unpriced = _proj(cost_per_completion_token=None, prompts_left=0, in_flight=0)
    run2 = project_run([a, finished_unpriced], 0.0, 2.0)
    assert run2.projected_cost_usd == pytest.approx(2.1)
    assert not project_run([_proj(mean_completion_tokens=None)], 0.0, 0.0).calibrated
    empty = project_run([], 0.0, 5.0)
    assert (empty.tokens_to_come, empty.projected_cost_usd) == (0, 5.0)


def test_calibration_gate():
    msg = "projected cost $123.45 exceeds max_cost_usd $100.00 after 50 completions"
    assert calibration_gate(49, 1000, 123.45, 100.0) is None  # needs max(50, 10)
    assert calibration_gate(50, 1000, 123.45, 100.0) == msg
    assert calibration_gate(99, 10_000, 123.45, 100.0) is None  # needs ceil(1% x 10,000) = 100
    assert calibration_gate(100, 10_000, 12_345.678, 100.0) == (
        "projected cost $12,345.68 exceeds max_cost_usd $100.00 after 100 completions")
    assert calibration_gate(50, 1000, 100.0, 100.0) is None  # equal is not over
    assert calibration_gate(50, 1000, 123.45, None) is None
    assert calibration_gate(50, 1000, None, 100.0) is None
    # 0.07 x 100 = 7.000000000000001 in floats: still 7 completions needed, not 8
    assert calibration_gate(7, 100, 2.0, 1.0, min_samples=1, fraction=0.07) is not None
    assert calibration_gate(6, 100, 2.0, 1.0, min_samples=1, fraction=0.07) is None


def test_spend_rate_usd_per_h():
    assert spend_rate_usd_per_h(0.001) == pytest.approx(3.6)
    assert spend_rate_usd_per_h(0.0) == 0.0


def test_uncalibrated_dataset_projects_a_range_not_one_number():
    """Before ``calibrate_after`` completions: low end at the observed mean, high end at max_tokens."""
    p = _proj(observed=12, calibrate_after=50)  # mean 500 from 12 completions
    assert not p.calibrated and (p.observed, p.calibrate_after) == (12, 50)
    assert p.tokens_to_come_low == 50_000 and p.tokens_to_come_high == 400_000  # 100 x 500, 100 x 4000
    assert p.cost_low_usd == pytest.approx(1.1) and p.cost_high_usd == pytest.approx(1.8)
    assert (p.eta_s_low, p.eta_s_high) == (500.0, 4000.0)
    cal = _proj(observed=50, calibrate_after=50)
    assert cal.calibrated and cal.cost_low_usd == cal.cost_high_usd == pytest.approx(1.1)
    # nothing observed by this dataset: the run's mean is the low end; none at all: low unknown
    fresh = _proj(mean_completion_tokens=None, observed=0, calibrate_after=50, fallback_mean_tokens=300.0)
    assert fresh.tokens_to_come_low == 30_000 and fresh.tokens_to_come_high == 400_000
    blank = _proj(mean_completion_tokens=None, observed=0, calibrate_after=50)
    assert blank.tokens_to_come_low is None and blank.cost_low_usd is None and blank.eta_s_low is None
    # the token budget caps both ends
    capped = _proj(observed=3, calibrate_after=50, token_budget=80_000)
    assert (capped.tokens_to_come_low, capped.tokens_to_come_high) == (30_000, 30_000)


def test_run_eta_equals_the_only_active_datasets_eta():
    """The header's ETA and the one unfinished dataset's ETA are the same figure, whatever the run rate."""
    done = _proj(prompts_left=0, in_flight=0)
    active = _proj(recent_tok_per_s=40.0)  # 50,000 tokens at 40 tok/s
    rows = [EtaRow.of("done", "done", "short", done, 0.0), EtaRow.of("active", "running", "short", active, 40.0)]
    run = schedule_eta(rows)
    assert run.eta_s == active.eta_s_recent == run.rows["active"][0] == 1250.0
    # a dataset not started yet in the same class goes after it, at the class's rate
    queued = _proj(recent_tok_per_s=0.0)
    run = schedule_eta(rows + [EtaRow.of("queued", "pending", "short", queued, 0.0)])
    assert run.rows["queued"][0] == 1250.0 + 50_000 / 40.0 and run.eta_s == run.rows["queued"][0]
    # alone in a class nobody serves yet: no rate to go by
    lone = schedule_eta([EtaRow.of("queued", "pending", "long", queued, 0.0)])
    assert lone.eta_s is None and lone.reason == "measuring rate"


def test_run_projection_range_and_calibration_label():
    a = _proj(observed=50, calibrate_after=50)  # calibrated: $1.10
    b = _proj(observed=12, calibrate_after=50, cost_so_far=0.0)  # $0.10 .. $0.80 still to come
    c = _proj(mean_completion_tokens=None, observed=0, calibrate_after=50, cost_so_far=0.0,
              fallback_mean_tokens=500.0)
    run = project_run([a, b, c], 0.0, 1.0)
    assert not run.calibrated and run.calibration == (12, 50)  # the first one not calibrated
    assert run.cost_low_usd == pytest.approx(1.0 + 0.1 + 0.1 + 0.1)
    assert run.cost_high_usd == pytest.approx(1.0 + 0.1 + 0.8 + 0.8)
    # one class, config order, its rate 100 tok/s: a, then b, then c
    eta = schedule_eta([EtaRow.of("a", "running", "short", a, 100.0), EtaRow.of("b", "pending", "short", b, 0.0),
                        EtaRow.of("c", "pending", "short", c, 0.0)])
    assert (eta.eta_s_low, eta.eta_s_high) == (1500.0, 8500.0)  # 500 + 500 + 500; 500 + 4000 + 4000
    assert project_run([a], 0.0, 1.0).calibration is None


def test_range_text():
    usd = lambda v: "--" if v is None else f"${v:.2f}"  # noqa: E731
    assert range_text(2.26, 0.31, 2.26, None, usd) == "$2.26"
    assert range_text(2.26, 0.31, 2.26, (12, 50), usd) == "$0.31–$2.26 (calibrating 12/50)"
    assert range_text(2.26, 0.31, 2.26, (12, 50), usd, short=True) == "$0.31–$2.26"
    assert range_text(2.26, None, 2.26, (0, 50), usd) == "calibrating (0/50)"
    assert range_text(1.0, 1.0, 1.0, (49, 50), usd, short=True) == "$1.00"
