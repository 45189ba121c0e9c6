"""Projections of final tokens, cost and time; the calibration gate. Hand-computed values."""

from __future__ import annotations

import pytest

from engine.projection import (
    DatasetProjection,
    calibration_gate,
    project_dataset,
    project_run,
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
    run = project_run([a, b], 3.6, 2.0, recent_tok_per_s=160.0, cost_cap=2.1)
    assert run.tokens_to_come == 80_000
    assert run.projected_cost_usd == pytest.approx(2.16)  # 2.0 + 0.10 + 0.06
    assert run.eta_s == 500.0
    assert run.spend_rate_usd_per_h == 3.6
    assert run.over_cap and run.calibrated
    assert not project_run([a, b], 3.6, 2.0, recent_tok_per_s=160.0).over_cap


def test_project_run_none_paths():
    a = _proj()
    unpriced = _proj(cost_per_completion_token=None)
    run = project_run([a, unpriced], 0.0, 2.0, recent_tok_per_s=0.0, cost_cap=1.0)
    assert run.projected_cost_usd is None and not run.over_cap and run.eta_s is None
    finished_unpriced = _proj(cost_per_completion_token=None, prompts_left=0, in_flight=0)
    run2 = project_run([a, finished_unpriced], 0.0, 2.0, recent_tok_per_s=100.0)
    assert run2.projected_cost_usd == pytest.approx(2.1)
    assert not project_run([_proj(mean_completion_tokens=None)], 0.0, 0.0,
                           recent_tok_per_s=1.0).calibrated
    empty = project_run([], 0.0, 5.0, recent_tok_per_s=0.0)
    assert (empty.tokens_to_come, empty.projected_cost_usd, empty.eta_s) == (0, 5.0, 0.0)


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
