"""Projections: where a dataset and the run will end in tokens, dollars and time.

Pure functions on figures the caller already holds (no I/O, no clocks: rates are passed in).
Token figures are in the token budget's unit (completion tokens unless the dataset counts
prompt + completion). Until the mean completion length is known, the projection uses
``max_tokens`` per request (pessimistic) and says so with ``calibrated=False``. Two ETAs are
always kept apart and labelled: one from the recent rate, one from the since-start rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.budget import fmt_usd
from engine.rates import eta_seconds


@dataclass(frozen=True)
class DatasetProjection:
    """Projected end state of one dataset.

    Attributes:
        tokens_to_come: tokens still expected (tokens): ``(prompts_left + in_flight) * mean``,
            capped by what the token budget has left.
        projected_final_tokens: ``used_tokens + tokens_to_come`` (tokens).
        projected_cost_usd: ``cost_so_far + tokens_to_come * cost_per_completion_token`` (USD);
            None when the price per token is unknown.
        cost_so_far: spend so far (USD), as given.
        eta_s_recent / eta_s_since_start: ``tokens_to_come`` over the recent / since-start
            token rate (seconds); None when that rate is 0 and tokens remain; 0.0 when none remain.
        over_cap: projected cost exceeds the dataset's ``max_cost_usd``.
        calibrated: False when the mean completion length was unknown and ``max_tokens`` used.
        mean_completion_tokens: the per-request figure used (tokens).
    """

    tokens_to_come: float
    projected_final_tokens: float
    projected_cost_usd: float | None
    cost_so_far: float
    eta_s_recent: float | None
    eta_s_since_start: float | None
    over_cap: bool
    calibrated: bool
    mean_completion_tokens: float


def project_dataset(
    *,
    prompts_left: int,
    in_flight: int,
    used_tokens: int,
    token_budget: int | None,
    mean_completion_tokens: float | None,
    max_tokens: int,
    cost_so_far: float,
    cost_per_completion_token: float | None,
    recent_tok_per_s: float,
    since_start_tok_per_s: float,
    cost_cap: float | None,
) -> DatasetProjection:
    """Project one dataset's final tokens, cost and time to finish.

    Args:
        prompts_left: prompts not yet dispatched.
        in_flight: requests dispatched and not yet finished.
        used_tokens: budget tokens spent so far (tokens).
        token_budget: the dataset's token budget (tokens) or None.
        mean_completion_tokens: mean tokens per request (tokens); None before any completion.
        max_tokens: per-request cap used when the mean is unknown (tokens).
        cost_so_far: spend so far (USD).
        cost_per_completion_token: effective USD per budget token (prompt cost folded in), or None.
        recent_tok_per_s / since_start_tok_per_s: token rates (tokens per second).
        cost_cap: the dataset's ``max_cost_usd`` or None.

    Raises:
        ValueError: negative counts.
    """
    if prompts_left < 0 or in_flight < 0 or used_tokens < 0:
        raise ValueError("prompts_left, in_flight and used_tokens must be >= 0")
    calibrated = mean_completion_tokens is not None
    mean = float(mean_completion_tokens) if mean_completion_tokens is not None else float(max_tokens)
    to_come = (prompts_left + in_flight) * mean
    if token_budget is not None:
        to_come = min(to_come, max(0.0, float(token_budget - used_tokens)))
    cost = (
        None
        if cost_per_completion_token is None
        else cost_so_far + to_come * cost_per_completion_token
    )
    return DatasetProjection(
        tokens_to_come=to_come,
        projected_final_tokens=used_tokens + to_come,
        projected_cost_usd=cost,
        cost_so_far=cost_so_far,
        eta_s_recent=eta_seconds(to_come, recent_tok_per_s),
        eta_s_since_start=eta_seconds(to_come, since_start_tok_per_s),
        over_cap=cost is not None and cost_cap is not None and cost > cost_cap,
        calibrated=calibrated,
        mean_completion_tokens=mean,
    )


@dataclass(frozen=True)
class RunProjection:
    """Projected end state of the whole run.

    Attributes:
        tokens_to_come: sum over datasets (tokens).
        projected_cost_usd: run cost so far + every dataset's remaining cost (USD); None when a
            dataset with tokens still to come has no known price.
        eta_s: ``tokens_to_come`` over the run's recent token rate (seconds; datasets mostly run
            one after another, so their ETAs add up rather than overlap); None when the rate is 0.
        spend_rate_usd_per_h: current spend rate (USD per hour).
        over_cap: projected cost exceeds the run cost cap.
        calibrated: every dataset's projection is calibrated.
    """

    tokens_to_come: float
    projected_cost_usd: float | None
    eta_s: float | None
    spend_rate_usd_per_h: float
    over_cap: bool
    calibrated: bool


def project_run(
    datasets: list[DatasetProjection],
    spend_rate_usd_per_h: float,
    cost_so_far: float,
    *,
    recent_tok_per_s: float,
    cost_cap: float | None = None,
) -> RunProjection:
    """Combine dataset projections into the run's.

    Args:
        datasets: projections of the datasets not yet finished.
        spend_rate_usd_per_h: recent spend rate (USD per hour), reported as is.
        cost_so_far: run spend so far (USD), including finished datasets.
        recent_tok_per_s: the run's recent token rate (tokens per second).
        cost_cap: run-wide cost cap (USD) or None.
    """
    to_come = sum(d.tokens_to_come for d in datasets)
    cost: float | None = cost_so_far
    for d in datasets:
        if d.tokens_to_come <= 0:
            continue
        if d.projected_cost_usd is None:
            cost = None
            break
        cost += d.projected_cost_usd - d.cost_so_far
    return RunProjection(
        tokens_to_come=to_come,
        projected_cost_usd=cost,
        eta_s=eta_seconds(to_come, recent_tok_per_s),
        spend_rate_usd_per_h=spend_rate_usd_per_h,
        over_cap=cost is not None and cost_cap is not None and cost > cost_cap,
        calibrated=all(d.calibrated for d in datasets),
    )


def calibration_gate(
    done: int,
    prompts: int,
    projected_cost: float | None,
    cost_cap: float | None,
    min_samples: int = 50,
    fraction: float = 0.01,
) -> str | None:
    """Pause reason once early completions project the dataset past its dollar cap.

    After ``max(min_samples, ceil(fraction * prompts))`` completions, returns e.g.
    ``"projected cost $123.45 exceeds max_cost_usd $100.00 after 50 completions"`` when a cap is
    set and ``projected_cost`` (USD) exceeds it. None otherwise: too few completions, no cap,
    unknown projection, or within the cap.
    """
    needed = max(min_samples, math.ceil(fraction * prompts - 1e-9))
    if done < needed or cost_cap is None or projected_cost is None or projected_cost <= cost_cap:
        return None
    return (
        f"projected cost {fmt_usd(projected_cost)} exceeds max_cost_usd {fmt_usd(cost_cap)} "
        f"after {done:,} completions"
    )


def spend_rate_usd_per_h(rate_window_usd_per_s: float) -> float:
    """USD per hour from a :class:`engine.rates.RateWindow` rate fed with USD (USD per second)."""
    return rate_window_usd_per_s * 3600.0
