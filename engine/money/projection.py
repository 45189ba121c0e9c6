"""Projections: where a dataset and the run will end in tokens, dollars and time.

Pure functions on figures the caller already holds (no I/O, no clocks: rates are passed in).
Token figures are in the token budget's unit (completion tokens unless the dataset counts
prompt + completion). Until a dataset has ``calibrate_after`` completions (``spend.calibrate_after``,
50 by default) its projection is not one number but a range: the low end uses the mean completion
length observed so far (the dataset's own, else the run's), the high end ``max_tokens`` per request;
:func:`range_text` renders it as ``"$0.31–$2.26 (calibrating 12/50)"`` or, with nothing observed
yet, ``"calibrating (0/50)"``. Two ETAs are always kept apart and labelled: one from the recent
rate, one from the since-start rate.

Caps bind projections: spend cannot pass a dollar cap (nothing is dispatched beyond it), so a
projected cost is clamped at the cap that binds it (the dataset's ``max_cost_usd``, what the run's
``max_cost_usd`` leaves, never below what is spent already) and flagged ``capped``; a token budget
binds the tokens (and so the cost) the same way. The unclamped figure is kept apart
(``uncapped_cost_usd``) for the calibration gate, which asks whether the work fits its cap.

The run's ETA (:func:`schedule_eta`) is what the datasets' rows add up to, see there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from engine.metrics.rates import eta_seconds
from engine.money.budget import fmt_usd


@dataclass(frozen=True)
class DatasetProjection:
    """Projected end state of one dataset.

    Attributes:
        tokens_to_come: tokens still expected (tokens): ``(prompts_left + in_flight) * mean``,
            capped by what the token budget has left.
        projected_final_tokens: ``used_tokens + tokens_to_come`` (tokens).
        projected_cost_usd: ``cost_so_far + tokens_to_come * cost_per_completion_token +
            requests_to_come * prompt_usd_per_request`` (USD), where ``requests_to_come`` is
            ``tokens_to_come / mean`` (at most ``prompts_left + in_flight``); None when the price per
            token is unknown. ``cost_so_far`` includes what aborted and failed attempts cost, but
            nothing is extrapolated from it: the rest is priced from per-token prices only.
        cost_so_far: spend so far (USD), as given.
        eta_s_recent / eta_s_since_start: ``tokens_to_come`` over the recent / since-start
            token rate (seconds); None when that rate is 0 and tokens remain; 0.0 when none remain.
        over_cap: projected cost exceeds the dataset's ``max_cost_usd``.
        calibrated: True once ``observed >= calibrate_after`` and a mean is known; before that the
            point figures above use the mean when known, else ``max_tokens`` (pessimistic).
        mean_completion_tokens: the per-request figure used (tokens).
        observed / calibrate_after: completions behind the mean, and how many calibration needs.
        tokens_to_come_low / _high: the range of tokens still expected (tokens); equal to
            ``tokens_to_come`` once calibrated; ``_low`` is None when no mean is known at all.
        cost_low_usd / cost_high_usd: projected final cost range (USD), low <= high; None where unknown. The high
            end is at most ``cost_so_far + (prompts_left + in_flight) * (prompt_usd_per_request +
            max_tokens * cost_per_completion_token)``: every remaining prompt completed once at
            ``max_tokens`` (retried attempts that fail part-way are not included).
        eta_s_low / eta_s_high: the range of ETAs at the recent rate (seconds); None where unknown.
        capped_by: which cap bound the projection: ``"max_cost_usd"`` (the dataset's dollar cap),
            ``"run max_cost_usd"`` (what the run's dollar cap leaves), ``"token_budget"`` (the token
            budget bound the tokens to come); "" when none did. The cost figures above are clamped at
            the binding dollar cap (never below ``cost_so_far``).
        cap_usd: the dollar figure the cost was clamped at (USD), None when no dollar cap bound it.
        uncapped_cost_usd: the projected cost before any dollar clamp (USD; None when unknown): what
            the work would cost, compared with the cap by the calibration gate and ``over_cap``.
        floor_usd: what is spent plus what the streams in flight are expected to cost (USD; None
            when the price is unknown): no projection or clamp goes below it.
        eta_tail_s / eta_floor_s: the drain of the last streams (seconds, see :class:`EtaRow`).
        eta_tokens: the tokens still to STREAM that the dataset's time is spent on (tokens; None: as
            ``tokens_to_come``): what the streams in flight streamed already is left out; a dollar cap
            or what the run's leaves, and the token budget less the
            next request's reservation (below it the dataset is ``budget_met``), bind the prompts
            left here, where the uncapped cost keeps them (the calibration gate asks what the work
            would cost). Without it a capped dataset's ETA ran to hours while its last streams ended.
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
    observed: int = 0
    calibrate_after: int = 0
    tokens_to_come_low: float | None = None
    tokens_to_come_high: float = 0.0
    cost_low_usd: float | None = None
    cost_high_usd: float | None = None
    eta_s_low: float | None = None
    eta_s_high: float | None = None
    capped_by: str = ""
    cap_usd: float | None = None
    uncapped_cost_usd: float | None = None
    floor_usd: float | None = None
    eta_tail_s: float = 0.0
    eta_floor_s: float = 0.0
    eta_tokens: float | None = None

    @property
    def capped(self) -> bool:
        """True when a cap bound the projection (see ``capped_by``)."""
        return bool(self.capped_by)


def clamp_cost(cost: float | None, cost_so_far: float, caps: "list[float | None]") -> tuple[float | None, float | None]:
    """Clamp a projected cost at the tightest of ``caps`` (USD; None entries: no cap).

    Spend cannot pass a cap, and what is spent is spent: the clamp is ``max(cost_so_far, min(caps))``.

    Returns:
        ``(clamped cost, the clamp)``: the clamp (USD) is None when no cap bound ``cost`` (no cap,
        ``cost`` None, or ``cost`` within the tightest cap), and the cost is then returned as is.
    """
    limits = [c for c in caps if c is not None]
    if cost is None or not limits:
        return cost, None
    clamp = max(cost_so_far, min(limits))
    return (clamp, clamp) if cost > clamp else (cost, None)


def project_dataset(
    *,
    prompts_left: int,
    in_flight: int,
    used_tokens: int,
    token_budget: int | None,
    mean_completion_tokens: float | None,
    max_tokens: float,
    cost_so_far: float,
    cost_per_completion_token: float | None,
    recent_tok_per_s: float,
    since_start_tok_per_s: float,
    cost_cap: float | None,
    observed: int | None = None,
    calibrate_after: int = 0,
    fallback_mean_tokens: float | None = None,
    prompt_usd_per_request: float = 0.0,
    run_room_usd: float | None = None,
    in_flight_tokens: float | None = None,
    tokens_sd: float = 0.0,
    eta_tail_s: float = 0.0,
    eta_floor_s: float = 0.0,
    next_request_tokens: float = 0.0,
    in_flight_received: float = 0.0,
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
        cost_per_completion_token: the completion price (USD per completion token), or None when
            unknown. Not a ratio of spend to tokens: spend of aborted attempts would inflate it.
        recent_tok_per_s / since_start_tok_per_s: token rates (tokens per second).
        cost_cap: the dataset's ``max_cost_usd`` or None.
        observed: completions behind ``mean_completion_tokens``; None: calibrated whenever a mean is known.
        calibrate_after: completions needed before the projection is one number (``spend.calibrate_after``).
        fallback_mean_tokens: the run's mean completion length (tokens), the low end of the range
            while this dataset has no completion of its own; None when nothing completed yet.
        prompt_usd_per_request: the prompt's cost of one request (USD; mean prompt tokens x the
            prompt price), added once per request still to come.
        run_room_usd: what the run's dollar cap leaves (USD: its ``max_cost_usd`` less the run's
            spend so far, may be negative after an overshoot); None without a run cap. With
            ``cost_cap``, it clamps the projected costs (:func:`clamp_cost`, ``capped_by``).
        in_flight_tokens: the expected FINAL completion tokens of the ``in_flight`` streams (tokens:
            per stream ``E[length | streamed so far]``, censoring accounted for, see
            :class:`engine.metrics.lengths.LengthDistribution`); None: each counts ``mean``. They are
            to come whatever the budgets say (nothing of a stream in flight is in ``used_tokens`` or
            ``cost_so_far`` yet), so the projected cost is never below ``cost_so_far`` plus their
            cost (``floor_usd``), clamped or not; the token budget binds only the prompts left.
        tokens_sd: standard deviation of the tokens to come (tokens; the lengths' noise and the
            mean's own error): once calibrated the range is the point figure +- 1.96 of it (a 95%
            interval), narrowing as completions arrive.
        eta_tail_s / eta_floor_s: the drain of the last streams (seconds; see :class:`EtaRow`).
        next_request_tokens: what the next request reserves (tokens): a token budget closes when less
            than that is left (``eta_tokens``).
        in_flight_received: what the streams in flight have streamed so far (tokens): still to be
            paid for, no longer to be waited for (``eta_tokens`` leaves it out).

    Raises:
        ValueError: negative counts.
    """
    if prompts_left < 0 or in_flight < 0 or used_tokens < 0:
        raise ValueError("prompts_left, in_flight and used_tokens must be >= 0")
    n_obs = (0 if mean_completion_tokens is None else calibrate_after) if observed is None else int(observed)
    calibrated = mean_completion_tokens is not None and n_obs >= calibrate_after
    mean = float(mean_completion_tokens) if mean_completion_tokens is not None else float(max_tokens)
    left = prompts_left + in_flight
    room = None if token_budget is None else max(0.0, float(token_budget - used_tokens))
    flying = None if in_flight_tokens is None else max(0.0, float(in_flight_tokens))

    def tokens(per_request: float) -> float:
        if flying is None:
            t = left * per_request
            return t if room is None else min(t, room)
        rest = prompts_left * per_request  # the prompts not sent yet: what the token budget leaves
        return flying + (rest if room is None else min(rest, max(0.0, room - flying)))

    def cost_of(t: float | None, per_request: float) -> float | None:
        if t is None or cost_per_completion_token is None:
            return None
        if flying is None:
            requests = min(float(left), t / per_request) if per_request > 0 else float(left)
        else:
            rest = max(0.0, t - flying)
            requests = in_flight + (min(float(prompts_left), rest / per_request) if per_request > 0 else prompts_left)
        return cost_so_far + t * cost_per_completion_token + requests * max(0.0, prompt_usd_per_request)

    floor = None
    if cost_per_completion_token is not None:
        floor = cost_so_far + ((flying or 0.0) * cost_per_completion_token
                               + (in_flight if flying is not None else 0) * max(0.0, prompt_usd_per_request))
    to_come = tokens(mean)
    cost = cost_of(to_come, mean)
    budget_bound = room is not None and (left * mean > room if flying is None else flying + prompts_left * mean > room)
    if calibrated:
        low: float | None = to_come
        high = to_come
        cost_low, cost_high = cost, cost
        if tokens_sd > 0 and cost is not None and cost_per_completion_token is not None:
            half = 1.96 * tokens_sd
            low = max(flying or 0.0, to_come - half)
            high = to_come + half if room is None or flying is None else min(to_come + half, max(room, flying))
            high = max(high, to_come)
            cost_low = cost - (to_come - low) * cost_per_completion_token
            cost_high = cost + (high - to_come) * cost_per_completion_token
    else:
        low_mean = mean_completion_tokens if mean_completion_tokens is not None else fallback_mean_tokens
        low_per = min(float(low_mean), float(max_tokens)) if low_mean is not None else None
        low = tokens(low_per) if low_per is not None else None
        high = tokens(float(max_tokens))
        cost_low = cost_of(low, low_per) if low_per is not None else None
        cost_high = cost_of(high, float(max_tokens))
        if cost_low is not None and cost_high is not None and cost_low > cost_high:
            # a token budget that binds caps both ends at the same tokens: the low end's shorter
            # completions then mean more requests, so more prompt cost. The range is [min, max].
            cost_low, cost_high = cost_high, cost_low
    caps = [cost_cap, None if run_room_usd is None else cost_so_far + run_room_usd]
    eta_tokens = None
    if flying is not None:
        rest = prompts_left * mean
        if room is not None:
            rest = min(rest, max(0.0, room - flying - max(0.0, next_request_tokens)))
        limits = [c for c in caps if c is not None]
        if limits and floor is not None and cost_per_completion_token is not None:
            per_token = cost_per_completion_token + (max(0.0, prompt_usd_per_request) / mean if mean > 0 else 0.0)
            if per_token > 0:
                rest = min(rest, max(0.0, min(limits) - floor) / per_token)
        eta_tokens = max(0.0, flying - max(0.0, in_flight_received)) + rest
    uncapped = cost
    base = cost_so_far if floor is None else floor
    cost, clamp = clamp_cost(cost, base, caps)
    cost_low = clamp_cost(cost_low, base, caps)[0]
    cost_high, clamp_high = clamp_cost(cost_high, base, caps)
    clamp = clamp if clamp is not None else clamp_high  # while calibrating the high end may bind alone
    capped_by = ""
    if clamp is not None:
        capped_by = "max_cost_usd" if cost_cap is not None and clamp == max(base, cost_cap) else "run max_cost_usd"
    elif budget_bound:
        capped_by = "token_budget"
    return DatasetProjection(
        tokens_to_come=to_come,
        projected_final_tokens=used_tokens + to_come,
        projected_cost_usd=cost,
        cost_so_far=cost_so_far,
        eta_s_recent=eta_seconds(to_come, recent_tok_per_s),
        eta_s_since_start=eta_seconds(to_come, since_start_tok_per_s),
        over_cap=uncapped is not None and cost_cap is not None and uncapped > cost_cap,
        calibrated=calibrated,
        mean_completion_tokens=mean,
        observed=n_obs,
        calibrate_after=calibrate_after,
        tokens_to_come_low=low,
        tokens_to_come_high=high,
        cost_low_usd=cost_low,
        cost_high_usd=cost_high,
        eta_s_low=None if low is None else eta_seconds(low, recent_tok_per_s),
        eta_s_high=eta_seconds(high, recent_tok_per_s),
        capped_by=capped_by,
        cap_usd=clamp,
        uncapped_cost_usd=uncapped,
        floor_usd=floor,
        eta_tail_s=max(0.0, eta_tail_s),
        eta_floor_s=max(0.0, eta_floor_s),
        eta_tokens=eta_tokens,
    )


@dataclass(frozen=True)
class RunProjection:
    """Projected end state of the whole run (its ETA: :func:`schedule_eta`).

    Attributes:
        tokens_to_come: sum over datasets (tokens).
        projected_cost_usd: run cost so far + every dataset's remaining cost (USD), clamped at the
            run's ``max_cost_usd`` (never below the cost so far); None when a dataset with tokens
            still to come has no known price.
        spend_rate_usd_per_h: current spend rate (USD per hour); None while not known yet.
        over_cap: the unclamped projected cost exceeds the run cost cap (the work does not fit it).
        calibrated: every unfinished dataset's projection is calibrated.
        cost_low_usd / cost_high_usd: projected cost range (USD; equal to ``projected_cost_usd``
            when calibrated), clamped like it; None where unknown.
        calibration: ``(observed, needed)`` completions of the first unfinished dataset (config
            order) not yet calibrated; None when all are.
        capped: the run's cost cap clamped the projection (or the range's high end), here or in a
            dataset's projection (``capped_by == "run max_cost_usd"``): it reads "capped at $cap";
            cap_usd: the figure it was clamped at (USD), None when not capped.
        uncapped_cost_usd: the projected cost before the clamp (USD; None when unknown).
    """

    tokens_to_come: float
    projected_cost_usd: float | None
    spend_rate_usd_per_h: float | None
    over_cap: bool
    calibrated: bool
    cost_low_usd: float | None = None
    cost_high_usd: float | None = None
    calibration: tuple[int, int] | None = None
    capped: bool = False
    cap_usd: float | None = None
    uncapped_cost_usd: float | None = None


def _sum_cost(cost_so_far: float, parts: list[tuple[float, float | None]]) -> float | None:
    """Run cost so far plus each dataset's remaining cost; ``parts`` = ``(cost_so_far, projected)``."""
    total = cost_so_far
    for so_far, projected in parts:
        if projected is None:
            return None
        total += projected - so_far
    return total


def project_run(
    datasets: list[DatasetProjection],
    spend_rate_usd_per_h: float | None,
    cost_so_far: float,
    *,
    cost_cap: float | None = None,
) -> RunProjection:
    """Combine dataset projections into the run's costs (the ETA: :func:`schedule_eta`).

    Args:
        datasets: projections of the datasets not yet finished (config order).
        spend_rate_usd_per_h: recent spend rate (USD per hour), reported as is.
        cost_so_far: run spend so far (USD), including finished datasets.
        cost_cap: run-wide cost cap (USD) or None: the projections are clamped at it
            (:func:`clamp_cost`), never below what is spent plus the streams in flight (the
            datasets' ``floor_usd``).
    """
    live = [d for d in datasets if d.tokens_to_come_high > 0 or d.tokens_to_come > 0]
    to_come = sum(d.tokens_to_come for d in datasets)
    uncapped = _sum_cost(cost_so_far, [(d.cost_so_far, d.projected_cost_usd) for d in live if d.tokens_to_come > 0])
    low = _sum_cost(cost_so_far, [(d.cost_so_far, d.cost_low_usd) for d in live])
    high = _sum_cost(cost_so_far, [(d.cost_so_far, d.cost_high_usd) for d in live])
    floor = cost_so_far + sum(d.floor_usd - d.cost_so_far for d in live if d.floor_usd is not None)
    cost, clamp = clamp_cost(uncapped, floor, [cost_cap])
    low = clamp_cost(low, floor, [cost_cap])[0]
    high, clamp_high = clamp_cost(high, floor, [cost_cap])
    clamp = clamp if clamp is not None else clamp_high
    if clamp is None and any(d.capped_by == "run max_cost_usd" for d in live):
        clamp = high if cost is None else cost  # a dataset took what the run's cap leaves: the run is at its cap
    first = next((d for d in live if not d.calibrated), None)
    return RunProjection(
        tokens_to_come=to_come,
        projected_cost_usd=cost,
        spend_rate_usd_per_h=spend_rate_usd_per_h,
        over_cap=uncapped is not None and cost_cap is not None and uncapped > cost_cap,
        calibrated=first is None,
        cost_low_usd=low,
        cost_high_usd=high,
        calibration=None if first is None else (first.observed, first.calibrate_after),
        capped=clamp is not None,
        cap_usd=clamp,
        uncapped_cost_usd=uncapped,
    )


#: Shown dataset states whose remaining work counts in the run's ETA: they run now, or will
#: without anyone's action (a paused, skipped, budget-met or stopping dataset does not progress).
ETA_STATES = ("running", "pending")


@dataclass(frozen=True)
class EtaRow:
    """What the run's ETA needs of one dataset (one row of the datasets table).

    Attributes:
        name: dataset name.
        state: its shown state (``DatasetSnapshot.state``).
        lane: the request class most of its remaining prompts use (its class's dispatcher serves it).
        tokens: tokens still to come (tokens; the projection's point figure).
        tokens_low / tokens_high: the range while calibrating (tokens; ``tokens_low`` None: unknown).
        tok_per_s: its own recent rate of completion tokens streamed (tokens per second: every
            stream's tokens as they arrive, not only finished completions').
        tail_s: how much longer than ``tokens / rate`` its last streams take (seconds): while prompts
            are left, the drain at the end (the streams in flight then end one by one and the rate
            falls), ``(x - E[residual]) / v`` with ``x`` the tokens until the longest of them is
            expected to end and ``v`` one stream's rate
            (:meth:`engine.metrics.lengths.LengthDistribution.drain_tokens`).
        floor_s: with no prompt left, when its longest stream in flight is expected to end (seconds):
            the row never finishes before it.
    """

    name: str
    state: str
    lane: str
    tokens: float
    tokens_low: float | None
    tokens_high: float
    tok_per_s: float
    tail_s: float = 0.0
    floor_s: float = 0.0
    limited: bool = False

    @classmethod
    def of(cls, name: str, state: str, lane: str, proj: DatasetProjection, tok_per_s: float,
           limited: bool = False) -> "EtaRow":
        """The row of a dataset from its :class:`DatasetProjection` (``limited``: a budget holds its
        dispatch below the class's slots, see :func:`schedule_eta`)."""
        if proj.eta_tokens is not None and proj.calibrated:  # what is left to stream, as far as the caps go
            t = min(proj.tokens_to_come, proj.eta_tokens)
            return cls(name, state, lane, t, t, t, tok_per_s, proj.eta_tail_s, proj.eta_floor_s, limited)
        return cls(name, state, lane, proj.tokens_to_come, proj.tokens_to_come_low, proj.tokens_to_come_high,
                   tok_per_s, proj.eta_tail_s, proj.eta_floor_s, limited)


@dataclass(frozen=True)
class RunEta:
    """The run's ETA and the rows' ETAs it is made of (seconds; None: unknown or not progressing).

    Attributes:
        eta_s / eta_s_low / eta_s_high: the run's ETA and its range while calibrating (seconds):
            the latest finish among the rows that take part (see :func:`schedule_eta`).
        reason: why ``eta_s`` is None (``"paused"``, ``"run cost cap met"``, ``"all datasets
            paused"``, ``"measuring rate"`` ...); "" when it is known.
        rows: ``{dataset: (eta_s, eta_s_low, eta_s_high)}`` (seconds) of every dataset that takes
            part; the others (finished, paused, ...) have no ETA.
    """

    eta_s: float | None
    eta_s_low: float | None
    eta_s_high: float | None
    reason: str = ""
    rows: dict[str, tuple[float | None, float | None, float | None]] = field(default_factory=dict)


def _finishes(rows: list[EtaRow], tokens: Callable[[EtaRow], float | None]) -> dict[str, float | None]:
    """Each row's finish (seconds from now) by request class: the class's remaining work in config
    order at the class's rate (the summed own rates of its running datasets); None where unknown."""
    lanes: dict[str, list[EtaRow]] = {}
    out: dict[str, float | None] = {}
    for r in rows:
        if r.limited and r.state == "running" and r.tok_per_s > 0:  # at its own pace, beside the lane
            t = tokens(r)
            eta = None if t is None else eta_seconds(max(0.0, t), r.tok_per_s)
            out[r.name] = None if eta is None else max(eta + (r.tail_s if eta > 0 else 0.0), r.floor_s)
            continue
        lanes.setdefault(r.lane, []).append(r)
    for lane_rows in lanes.values():
        rate = sum(r.tok_per_s for r in lane_rows if r.state == "running" and r.tok_per_s > 0)
        cum: float | None = 0.0
        for r in lane_rows:
            t = tokens(r)
            cum = None if cum is None or t is None else cum + max(0.0, t)
            eta = None if cum is None else eta_seconds(cum, rate)
            out[r.name] = None if eta is None else max(eta + (r.tail_s if eta > 0 else 0.0), r.floor_s)
    return out


def _latest(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return None if len(known) < len(values) else max([0.0, *known])


def schedule_eta(rows: list[EtaRow], *, blocked: str = "") -> RunEta:
    """The run's ETA as what the datasets' rows add up to (pure: rates are passed in).

    How the engine runs them: each request class has one dispatcher that fills the class's slots
    from the first dataset (config order) with prompts of that class left, so datasets of one class
    run one after another (the next takes the slots as the previous one's prompts run out) and
    datasets of different classes at the same time. Hence, for the rows in :data:`ETA_STATES`
    with tokens to come, grouped by ``lane`` (each dataset in the class most of its remaining
    prompts use):

    - a lane's rate is the sum of its running datasets' own recent token rates (tokens/s);
    - a row finishes when its lane has done the tokens of the rows before it (config order) and its
      own, at the lane's rate, then its last streams drain: ``(tokens before + own tokens) / lane
      rate + tail_s`` seconds, never before ``floor_s`` (its longest stream in flight). A dataset
      running alone in its class gets its own ``tokens / own rate + tail_s``. A running row whose
      budget holds its dispatch below the class's slots (``limited``) goes at its own rate instead,
      beside the lane (the class's dispatcher gives the rest of the slots to the next datasets);
    - the run's ETA is the latest finish: the max of the rows' ETAs, so it is never below a row's
      ETA and, with one dataset left, equals it. Paused, finished, skipped and budget-met datasets
      take no part (they do not progress: a paused dataset's work is not in the ETA).

    Args:
        rows: every dataset, config order.
        blocked: why nothing can progress now, whatever the rows say (``"paused"``,
            ``"run cost cap met"``, ``"stopping"`` ...): every ETA is then None with this reason.

    Returns:
        A :class:`RunEta`. ``eta_s`` is None with a ``reason`` when ``blocked``; when no row can run
        and some are paused (``"all datasets paused"``); or when a lane has no rate yet
        (``"measuring rate"``: its datasets have no completion in the recent window). With nothing
        left to do anywhere it is 0.0.
    """
    if blocked:
        return RunEta(None, None, None, blocked)
    active = [r for r in rows if r.state in ETA_STATES and (r.tokens > 0 or r.tokens_high > 0)]
    if not active:
        if any(r.state == "paused" for r in rows):
            return RunEta(None, None, None, "all datasets paused")
        tail = max([0.0] + [r.floor_s for r in rows if r.state != "paused"])  # the last streams still end
        return RunEta(tail, tail, tail)
    point = _finishes(active, lambda r: r.tokens)
    low = _finishes(active, lambda r: r.tokens_low)
    high = _finishes(active, lambda r: r.tokens_high)
    # streams still in flight of datasets that send nothing more (skipped, budget met) end too
    draining: list[float | None] = [r.floor_s for r in rows
                                    if r.state not in ETA_STATES and r.state != "paused" and r.floor_s > 0]
    eta = _latest(list(point.values()) + draining)
    return RunEta(eta, _latest(list(low.values()) + draining), _latest(list(high.values()) + draining),
                  "" if eta is not None else "measuring rate",
                  {r.name: (point[r.name], low[r.name], high[r.name]) for r in active})


def range_text(
    point: float | None,
    low: float | None,
    high: float | None,
    calibration: tuple[int, int] | None,
    fmt: Callable[[float | None], str],
    *,
    short: bool = False,
) -> str:
    """A projected figure as text: one number once calibrated, else a range or "calibrating".

    Args:
        point: the figure when calibrated (``calibration`` None).
        low / high: the range while calibrating (None where unknown).
        calibration: ``(observed, needed)`` completions, or None when calibrated.
        fmt: formats one value (e.g. dollars, a duration).
        short: leave out the ``(calibrating n/N)`` label after a range.

    Returns:
        ``fmt(point)`` when calibrated; ``"$0.31–$2.26 (calibrating 12/50)"`` (or without the label
        when ``short``) while calibrating with both ends known; ``"calibrating (0/50)"`` when the
        low end is not known yet.
    """
    if calibration is None:
        return fmt(point)
    n, need = calibration
    if low is None or high is None:
        return f"calibrating ({n}/{need})"
    lo, hi = fmt(min(low, high)), fmt(max(low, high))  # never "$0.0638–$0.0632"
    text = lo if lo == hi else f"{lo}–{hi}"
    return text if short else f"{text} (calibrating {n}/{need})"


#: Share of a dataset's prompts at or below which what is left is a small remainder: the calibration
#: gate lets it finish (its dollar cap still ends it at the cap, ``budget_met``, with the cap's reason).
SMALL_REMAINDER = 0.05


def calibration_gate(
    done: int,
    prompts: int,
    projected_cost: float | None,
    cost_cap: float | None,
    min_samples: int = 50,
    fraction: float = 0.01,
    *,
    left: int | None = None,
    spent: float | None = None,
) -> str | None:
    """Pause reason once early completions project the dataset past its dollar cap.

    After ``max(min_samples, ceil(fraction * prompts))`` completions, returns e.g.
    ``"projected cost $123.45 exceeds max_cost_usd $100.00 after 50 completions"`` when a cap is
    set and ``projected_cost`` (USD) exceeds it. None otherwise: too few completions, no cap,
    unknown projection, or within the cap; and never where a pause would leave the dataset with
    nothing to decide (a run that sits with nothing it can do): when the prompts ``left`` to send
    are a small remainder (at most :data:`SMALL_REMAINDER` of ``prompts``: they are sent, and the cap
    stops them where it binds), or when what is ``spent`` (USD) already reached the cap (dispatch
    ends the dataset ``budget_met``, with the cap's reason).
    """
    needed = max(min_samples, math.ceil(fraction * prompts - 1e-9))
    if done < needed or cost_cap is None or projected_cost is None or projected_cost <= cost_cap:
        return None
    if left is not None and left <= SMALL_REMAINDER * prompts:
        return None
    if spent is not None and spent >= cost_cap:
        return None
    return (
        f"projected cost {fmt_usd(projected_cost)} exceeds max_cost_usd {fmt_usd(cost_cap)} "
        f"after {done:,} completions"
    )


def spend_rate_usd_per_h(rate_window_usd_per_s: float) -> float:
    """USD per hour from a :class:`engine.metrics.rates.RateWindow` rate fed with USD (USD per second)."""
    return rate_window_usd_per_s * 3600.0
