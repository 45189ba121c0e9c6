"""Property: a projected range never reads low above high (``$0.0638–$0.0632``), for a dataset
or the run, whatever the inputs (random inputs, fixed seeds: reproducible)."""

from __future__ import annotations

import random

import pytest

from engine.money.budget import fmt_usd
from engine.money.projection import EtaRow, project_dataset, project_run, range_text, schedule_eta


def random_dataset(rng: random.Random):
    max_tokens = rng.choice([1, 50, 2000, 10240, 16384, rng.uniform(1, 20000)])
    budget = rng.choice([None, rng.randint(0, 2_000_000), rng.randint(0, 5000)])
    used = rng.randint(0, budget + 1000) if budget is not None else rng.randint(0, 100_000)
    return project_dataset(
        prompts_left=rng.randint(0, 5000), in_flight=rng.randint(0, 2000), used_tokens=used, token_budget=budget,
        mean_completion_tokens=rng.choice([None, rng.uniform(0, 30000), rng.uniform(0, 500)]),
        max_tokens=max_tokens, cost_so_far=rng.uniform(0, 5),
        cost_per_completion_token=rng.choice([None, 0.0, rng.uniform(0, 1e-5)]),
        recent_tok_per_s=rng.choice([0.0, rng.uniform(0, 5000)]),
        since_start_tok_per_s=rng.choice([0.0, rng.uniform(0, 5000)]),
        cost_cap=rng.choice([None, rng.uniform(0, 10)]), observed=rng.choice([None, rng.randint(0, 100)]),
        calibrate_after=rng.choice([0, 50]), fallback_mean_tokens=rng.choice([None, rng.uniform(0, 3000)]),
        prompt_usd_per_request=rng.choice([0.0, rng.uniform(0, 0.01)]),
    )


def ordered(low, high) -> bool:
    return low is None or high is None or low <= high + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_low_never_above_high(seed):
    rng = random.Random(seed)
    for _ in range(5000):
        ds = [random_dataset(rng) for _ in range(rng.randint(1, 4))]
        for d in ds:
            assert ordered(d.cost_low_usd, d.cost_high_usd), d
            assert ordered(d.tokens_to_come_low, d.tokens_to_come_high), d
            assert ordered(d.eta_s_low, d.eta_s_high), d
        r = project_run(ds, None, sum(d.cost_so_far for d in ds), cost_cap=rng.choice([None, rng.uniform(0, 5)]))
        assert ordered(r.cost_low_usd, r.cost_high_usd), (r, ds)
        rows = [EtaRow.of(str(i), rng.choice(["running", "pending"]), rng.choice(["short", "long"]), d,
                          rng.uniform(0, 100)) for i, d in enumerate(ds)]
        e = schedule_eta(rows)
        assert ordered(e.eta_s_low, e.eta_s_high), (e, ds)
        text = range_text(r.projected_cost_usd, r.cost_low_usd, r.cost_high_usd, (1, 50), fmt_usd)
        if "–" in text:
            lo, hi = text.split(" ")[0].split("–")
            assert float(lo.lstrip("$").replace(",", "")) <= float(hi.lstrip("$").replace(",", "")), text


def test_a_token_budget_that_binds_costs_more_prompts_at_the_low_mean():
    """The case behind the report: the budget caps both ends at the same tokens, so the low end's
    shorter completions mean more requests and more prompt cost; the range must still be ordered."""
    d = project_dataset(prompts_left=100, in_flight=0, used_tokens=0, token_budget=10_000,
                        mean_completion_tokens=200, max_tokens=2000, cost_so_far=0.05,
                        cost_per_completion_token=1e-6, recent_tok_per_s=10, since_start_tok_per_s=10,
                        cost_cap=None, observed=10, calibrate_after=50, prompt_usd_per_request=1e-4)
    # tokens: both ends 10,000 (the budget); requests 50 at the low end, 5 at the high end
    assert d.cost_low_usd == pytest.approx(0.05 + 0.01 + 5 * 1e-4)
    assert d.cost_high_usd == pytest.approx(0.05 + 0.01 + 50 * 1e-4)
    assert range_text(None, d.cost_low_usd, d.cost_high_usd, (10, 50), fmt_usd) == "$0.06–$0.07 (calibrating 10/50)"
