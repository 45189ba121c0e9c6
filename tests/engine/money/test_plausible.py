"""Is a provider's usage believable (engine.money.plausible, issue 34): the bounds at their edges, the
client's reading of invalid figures, and what engine.money.usage.account does with an implausible one."""

from __future__ import annotations

import json
import math

import pytest

from engine.client.conformance import raw_usage_figures, read_usage
from engine.client.types import Completion, Usage
from engine.money.plausible import (
    COST_SLACK_USD,
    PROMPT_SLACK,
    Bounds,
    check,
    completion_budget,
)
from engine.money.prices import Prices
from engine.money.usage import IMPLAUSIBLE, REPORTED, account, implausible

LIST = Prices(0.6e-6, 2.5e-6, "config")  # $0.60 / $2.50 per million


def bounds(est: int = 100, max_completion: int | None = 1000, prices: Prices | None = LIST) -> Bounds:
    return Bounds(est, max_completion, prices)


def test_limits_are_the_documented_factors():
    b = bounds()
    assert b.prompt_limit() == 16 * 100 + 4096 == 5696
    assert b.completion_limit() == 4 * 1000 + 1024 == 5024
    # 10x the list price of (est or reported prompt, completion) + $0.05
    assert b.cost_limit(50, 1000) == pytest.approx(10 * (100 * 0.6e-6 + 1000 * 2.5e-6) + 0.05)
    assert bounds(max_completion=None).completion_limit() is None
    assert bounds(prices=None).cost_limit(1, 1) is None


@pytest.mark.parametrize("prompt,completion,cost,n_reasons", [
    (5696, 5024, None, 0),  # exactly at the limits: believed
    (5697, 10, None, 1),  # one token over the prompt's
    (10, 5025, None, 1),  # one over the completion's
    (1e12, 10, None, 1),  # the field case: a prompt of 10^12 tokens
    (100, 1000, 10 * (100 * 0.6e-6 + 1000 * 2.5e-6) + COST_SLACK_USD, 0),  # cost at its limit
    (100, 1000, 10 * (100 * 0.6e-6 + 1000 * 2.5e-6) + COST_SLACK_USD + 1e-9, 1),  # just above
    (100, 1000, 0.0, 0),  # free is believable (a promotion, a cached prompt)
    (100, 1000, -0.01, 1),  # negative cost
    (-1, 10, None, 1),  # negative tokens
    (math.nan, 10, None, 1),
    (10, math.inf, None, 1),
    (10, 10, math.nan, 1),
    (1e12, 1e12, 1.6e6, 3),  # every figure absurd: each named
])
def test_check_at_the_edges(prompt, completion, cost, n_reasons):
    assert len(check(prompt, completion, cost, bounds())) == n_reasons


def test_reasons_name_the_figure_and_the_bound():
    (why,) = check(1e12, 10, None, bounds(est=12))
    assert why == f"prompt_tokens 1,000,000,000,000 > 16 x our estimate 12 + {PROMPT_SLACK:,}"
    (why,) = check(100, 1000, 5.0, bounds())
    assert why == "cost $5.0000 > 10 x the price list's $0.0026 + $0.05"
    (why,) = check(1, 1, None, bounds(), invalid=True, raw='{"cost":-3}')
    assert why == 'a figure negative, NaN, infinite or not a number ({"cost":-3})'


def test_an_absurd_prompt_does_not_lift_the_cost_bound():
    """The cost is priced at most at the tokens' own limits: $1.6M for a 10^12-token prompt is named too."""
    why = check(1e12, 10, 1.6e6, bounds())
    assert len(why) == 2 and why[1].startswith("cost $1,600,000.0000 > 10 x")


def test_completion_budget_adds_the_reasoning_budget():
    assert completion_budget(1000) == 1000
    assert completion_budget(1000, {"reasoning": {"max_tokens": 4000}}) == 5000
    assert completion_budget(1000, {"reasoning": {"effort": "high"}}) == 1000
    assert completion_budget(1000, {"reasoning": {"max_tokens": "x"}}) == 1000
    assert completion_budget(1000, {"reasoning": {"max_tokens": True}}) == 1000


# ---- the client's reading of invalid figures ------------------------------------------------------------------------
@pytest.mark.parametrize("u", [
    {"prompt_tokens": 10, "completion_tokens": 5, "cost": -0.5},
    {"prompt_tokens": -10, "completion_tokens": 5},
    {"prompt_tokens": 10, "completion_tokens": float("nan")},
    {"prompt_tokens": 10, "completion_tokens": 5, "cost": "lots"},
    {"prompt_tokens": 10, "completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": -1}},
])
def test_invalid_figures_are_flagged_and_kept_as_sent(u):
    got, flags = read_usage(u)
    assert "usage_invalid" in flags
    assert got.prompt_tokens >= 0 and got.completion_tokens >= 0 and (got.cost_usd is None or got.cost_usd >= 0)
    raw = json.loads(raw_usage_figures(u))  # type: ignore[arg-type]
    assert raw["prompt_tokens"] == u["prompt_tokens"]


def test_valid_figures_raise_no_flag():
    assert read_usage({"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.0})[1] == ()
    assert raw_usage_figures({"cost": float("inf"), "prompt_tokens": 1}) == '{"cost":"inf","prompt_tokens":1}'


# ---- engine.money.usage.account ---------------------------------------------------------------------------------------
def completion(u: Usage, *, flags: tuple[str, ...] = (), raw: str | None = None, content: str = "x" * 400) -> Completion:
    return Completion(reasoning="", content=content, tool_calls=(), finish_reason="stop", native_finish_reason=None,
                      usage=u, provider="Absurd", model="m", generation_id="gen-1", latency_s=1.0, ttft_s=0.1,
                      usage_reported=True, flags=flags, usage_raw=raw)


def price(p: int, c: int) -> float:
    return LIST.cost(p, c)


def test_an_implausible_usage_is_replaced_by_our_priced_estimate():
    c = completion(Usage(10**12, 101, 0, 1.6e6))
    a = account(c, est_prompt_tokens=12, price=price, bounds=bounds(est=12))
    assert a.source == IMPLAUSIBLE and not a.cost_billed and not a.provisional
    assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (12, 101)  # 400 chars / 4 + end of turn
    assert a.usage.cost_usd == pytest.approx(price(12, 101))
    assert len(a.implausible) == 2
    assert json.loads(a.claimed) == {"prompt_tokens": 10**12, "completion_tokens": 101,  # type: ignore[arg-type]
                                     "reasoning_tokens": 0, "cost": 1.6e6}


def test_an_invalid_figure_is_implausible_with_what_was_sent():
    raw = '{"completion_tokens":101,"cost":-2.5,"prompt_tokens":12}'
    c = completion(Usage(12, 101, 0, None), flags=("usage_invalid",), raw=raw)
    a = account(c, est_prompt_tokens=12, price=price, bounds=bounds(est=12))
    assert a.source == IMPLAUSIBLE and a.claimed == raw
    assert a.usage.cost_usd == pytest.approx(price(12, 101))


def test_a_believable_usage_stays_reported_and_without_bounds_only_the_prompt_is_checked():
    c = completion(Usage(90, 101, 0, 0.0003))
    assert account(c, est_prompt_tokens=12, price=price, bounds=bounds(est=12)).source == REPORTED
    assert implausible(completion(Usage(12, 10**9, 0, None)), Bounds(12)) == ()  # max_tokens unknown: not checked
    assert implausible(completion(Usage(10**9, 10, 0, None)), Bounds(12)) != ()
    nothing = Completion("", "hi", (), "stop", None, Usage(), "", "m", "", 1.0, None, usage_reported=False)
    assert implausible(nothing, Bounds(12)) == ()  # no usage came: nothing to believe or not
