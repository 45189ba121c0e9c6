"""Spend control for one run: budgets with in-flight reservation, prices, projections.

Pure bookkeeping (no I/O, no clocks read): the scheduler calls :meth:`SpendControl.reserve` before
dispatching a request, :meth:`settle` when it completes and :meth:`release` when it fails or is
aborted; the supervisor feeds credits readings. Reservations follow ``engine.money.budget``: the class
``max_tokens`` until a dataset+class has ``spend.calibrate_after`` completions, then the observed
``spend.reserve_percentile`` (see :class:`engine.money.budget.CompletionEstimator`), growing with each
stream's progress once :meth:`SpendControl.track` follows it, so ``used + reserved`` bounds what can
still be spent and a budget is overshot by at most the in-flight tail that runs past its percentile
(``spend.hard_cap``: ``max_tokens`` is reserved, never overshot). :attr:`SpendControl.aborts` learns
what providers bill for aborted streams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from engine.config import Config
from engine.money.budget import Budget, DatasetBudgets, Reservations, fmt_usd
from engine.money.creditsfloor import CreditsFloorReached, CreditsHolds  # noqa: F401 - re-exported
from engine.money.inflight import AbortBilling, LengthModel
from engine.money.prices import PriceObserver, Prices
from engine.money.projection import DatasetProjection, project_dataset


class _Naive:
    """Marker reservation of the naive mode (``spend.reservation = "none"``): reserves nothing."""

    __slots__ = ("cls",)

    def __init__(self, cls: str) -> None:
        self.cls = cls


@dataclass(frozen=True, slots=True)
class CreditsReading:
    """Provider credits at one moment.

    Attributes:
        remaining_usd: credits left (USD; ``/key`` ``limit_remaining`` or ``/credits`` total - usage),
            None when the provider has no limit to report.
        usage_usd: the key's total usage (USD), the truth spend is reconciled against; None if unknown.
        source: ``key`` | ``credits``.
        at: monotonic time of the reading (s).
        endpoints: endpoints asked (several ``[provider] base_urls``: each has its own ``/key``; 1 otherwise).
        missing: the (masked) urls of those that gave no credits (unreachable, or neither ``/key`` nor
            ``/credits``): the reading is partial, ``remaining_usd`` the sum of the others and
            ``usage_usd`` None, so no spend drift is computed from it.
    """

    remaining_usd: float | None
    usage_usd: float | None
    source: str
    at: float
    endpoints: int = 1
    missing: tuple[str, ...] = ()

    @property
    def partial(self) -> bool:
        """True when some endpoint gave no credits (see ``missing``)."""
        return bool(self.missing)


class SpendControl:
    """Budgets, prices and credits of one run.

    Args:
        cfg: the validated config (datasets' ``token_budget`` / ``budget_counts`` / ``max_cost_usd``,
            ``[spend]``, ``[pricing]``, classes' ``max_tokens``).
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        s = cfg.spend
        self.run_cost = Budget(s.max_cost_usd)
        max_tokens = {c: k.max_tokens for c, k in cfg.classes.items()}
        self.budgets = {
            d.name: DatasetBudgets(
                max_tokens, token_budget=d.token_budget, max_cost_usd=d.max_cost_usd, run_cost=self.run_cost,
                counts_total=d.budget_counts == "total", calibrate_after=s.calibrate_after,
                percentile=s.reserve_percentile, hard_cap=s.hard_cap,
            )
            for d in cfg.datasets
        }
        self.naive = s.reservation == "none"
        self.observer = PriceObserver()
        p = cfg.pricing
        self.config_prices = (
            Prices(p.prompt_usd_per_m / 1e6, p.completion_usd_per_m / 1e6, "config")
            if p.prompt_usd_per_m is not None and p.completion_usd_per_m is not None
            else None
        )
        self.endpoint_prices: Prices | None = None
        self.credits: CreditsReading | None = None
        self.usage_at_start: float | None = None
        self._spent_at_reading = 0.0
        #: dollars held against the credits left above ``spend.credits_floor_usd`` (checked at dispatch)
        self.credit_holds = CreditsHolds(s.credits_floor_usd)
        self.credits_waiting = False  # the last reserve() was refused for credits held in flight
        self.spent_since_start = 0.0  # USD accounted by this process (results + partial spend)
        self.lost_usd: dict[str, float] = {d.name: 0.0 for d in cfg.datasets}
        #: USD accounted per dataset, the run's earlier processes included: results, failed and
        #: aborted attempts, late true-ups. THE dollars of a dataset (snapshots and status read them
        #: here); every method that records spend adds to it, so it cannot disagree with the budgets.
        #: The store's figure has the same definition (engine.storage.dollars; tests/engine/storage/test_storage_dollars.py).
        self.dataset_usd: dict[str, float] = {d.name: 0.0 for d in cfg.datasets}
        #: what providers billed for streams this engine aborted (the abort estimate learns from it)
        self.aborts = AbortBilling()
        self._abort_rows: list[tuple[str, str, str, int, int, float]] = []

    # ---- prices -----------------------------------------------------------------------------
    @property
    def has_cost_cap(self) -> bool:
        """True when a dollar cap is configured anywhere."""
        return self.cfg.spend.max_cost_usd is not None or any(d.max_cost_usd for d in self.cfg.datasets)

    def prices(self) -> Prices | None:
        """Best known prices: observed from billed usage, else ``[pricing]``, else ``/models``; or None."""
        return self.observer.prices(self.config_prices or self.endpoint_prices)

    # ---- seeding from the store -----------------------------------------------------------
    def seed(self, dataset: str, prompt_tokens: int, completion_tokens: int, cost_usd: float,
             recent: dict[str, list[int]] | dict[str, list[tuple[int, int]]]) -> None:
        """Count what earlier processes already spent and calibrate estimators with ``recent``
        completion lengths per class in dispatch order, oldest first: tokens, or ``(tokens, censored)``
        (:meth:`engine.storage.store.Store.recent_lengths`: censored 1 is a stream cut before it
        ended, a lower bound of its length, :meth:`CompletionEstimator.observe_cut`). They take
        dispatch orders below this process's (negative), so the first requests of this process
        come after them in the estimator's cohort."""
        b = self.budgets[dataset]
        b.tokens.add_used(completion_tokens + (prompt_tokens if b.counts_total else 0))
        b.cost.add_used(cost_usd)
        self.run_cost.add_used(cost_usd)
        self.dataset_usd[dataset] = self.dataset_usd.get(dataset, 0.0) + cost_usd
        for cls, values in recent.items():
            est = b.estimators.get(cls)
            if est is None:
                continue
            n = len(values)
            for i, v in enumerate(values):
                tokens, censored = v if isinstance(v, tuple) else (v, 0)
                if censored:
                    est.observe_cut(tokens, i - n)
                else:
                    est.observe(tokens, i - n)

    def seed_aborts(self, rows: list[tuple[str, str, str, int, int, float]]) -> None:
        """Bills of streams earlier processes aborted, ``(dataset, class, provider, prompt tokens,
        tokens received, billed USD)`` (:meth:`engine.storage.store.Store.aborted_bills`); priced into
        :attr:`aborts` once a price is known (:meth:`abort_share`). The tokens received are cut
        lengths of their class, seeded with the results by :meth:`seed`, in dispatch order."""
        self._abort_rows = list(rows)

    def abort_share(self, provider: str) -> float | None:
        """The observed share of a dropped stream's rest that ``provider`` bills
        (:meth:`engine.money.inflight.AbortBilling.share_for`), the bills of earlier processes included:
        those are compared with what they had generated at the current prices (rows of datasets no
        longer configured are ignored)."""
        if self._abort_rows:
            p = self.prices()
            if p is not None:
                rows, self._abort_rows = self._abort_rows, []
                for ds, _cls, prov, prompt, got, billed in rows:
                    if ds in self.budgets:
                        self.aborts.add_earlier(prov, p.cost(prompt, got), billed)
        return self.aborts.share_for(provider)

    # ---- reservation lifecycle ------------------------------------------------------------
    def reserve(self, dataset: str, cls: str, est_prompt_tokens: int) -> Reservations | _Naive | None:
        """Reserve a request's expected tokens/dollars; None when a budget refuses or the credits
        held by requests in flight leave no room for it now (nothing reserved; see
        :attr:`credits_waiting`).

        Once credits were read, the request's expected cost (its class's completion estimate and
        ``est_prompt_tokens`` at :meth:`prices`; 0 while no price is known) is also held against the
        credits left above ``spend.credits_floor_usd`` (:class:`engine.money.creditsfloor.CreditsHolds`).

        Raises:
            engine.money.budget.NoPriceError: a dollar cap is set and no price is known.
            engine.money.creditsfloor.CreditsFloorReached: the request would take credits below the floor
                (nothing reserved; the message is the pause reason).
        """
        b = self.budgets[dataset]
        est = b.estimators[cls]
        expected = est.max_tokens if b.hard_cap else est.expected()
        usd = self.estimate_cost(est_prompt_tokens, expected)
        self.credits_waiting = not self.credit_holds.check(usd, self.spent_since_start)
        if self.credits_waiting:
            return None
        if self.naive:
            over = (b.tokens.limit is not None and b.tokens.used >= b.tokens.limit) or (
                b.cost.limit is not None and b.cost.used >= b.cost.limit) or (
                self.run_cost.limit is not None and self.run_cost.used >= self.run_cost.limit)
            r: Reservations | _Naive | None = None if over else _Naive(cls)
        else:
            run_hold = sum(d.overrun.total for d in self.budgets.values()) if self.run_cost.limit is not None else None
            r = b.try_reserve(cls, est_prompt_tokens, self.prices() if self.has_cost_cap else None, run_hold)
        if r is not None:
            self.credit_holds.hold(id(r), usd)
        return r

    def track(self, dataset: str, r: Reservations | _Naive, progress: Any) -> None:
        """Follow the stream of an open reservation (``progress.tokens_received``: completion tokens
        so far), so its reservation grows with its progress (:meth:`DatasetBudgets.track`)."""
        if not isinstance(r, _Naive):
            self.budgets[dataset].track(r, progress)

    def refresh(self, dataset: str) -> None:
        """Recompute the overrun of the dataset's tracked streams (after the censored lengths were
        set): :meth:`DatasetBudgets.refresh`."""
        self.budgets[dataset].refresh(self.prices() if self.has_cost_cap else None)

    def settle(self, dataset: str, r: Reservations | _Naive, prompt_tokens: int, completion_tokens: int,
               cost_usd: float | None, *, billed: bool = True) -> None:
        """Settle a completed request with its usage (tokens, USD). ``billed`` False: the figures are
        ours (counted, estimated or priced, see :mod:`engine.money.usage`): they count in the budgets but do
        not teach the price observer."""
        if billed:
            self.observer.observe(prompt_tokens, completion_tokens, cost_usd)
        self.credit_holds.close(id(r))
        b = self.budgets[dataset]
        if isinstance(r, _Naive):
            b.estimators[r.cls].observe(completion_tokens)
            b.tokens.add_used(completion_tokens + (prompt_tokens if b.counts_total else 0))
            cost = cost_usd or 0.0
            b.cost.add_used(cost)
            self.run_cost.add_used(cost)
        else:
            b.settle(r, prompt_tokens, completion_tokens, cost_usd, self.prices())
        self.spent_since_start += cost_usd or 0.0
        self.dataset_usd[dataset] += cost_usd or 0.0

    def release(self, dataset: str, r: Reservations | _Naive, tokens_spent: int = 0, cost_spent: float = 0.0) -> None:
        """Release a failed/aborted request's reservation, counting what it spent (a lower bound)."""
        self.credit_holds.close(id(r))
        b = self.budgets[dataset]
        if isinstance(r, _Naive):
            b.tokens.add_used(tokens_spent)
            b.cost.add_used(cost_spent)
            self.run_cost.add_used(cost_spent)
        else:
            b.release(r, tokens_spent, cost_spent)
        self.spent_since_start += cost_spent
        self.lost_usd[dataset] += cost_spent
        self.dataset_usd[dataset] += cost_spent

    def add_partial(self, dataset: str, cost_usd: float, tokens: int = 0) -> None:
        """Add spend (USD, tokens) of attempts that produced no result: failed attempts of a prompt
        that later completed, or a late-known cost from ``/generation``."""
        b = self.budgets[dataset]
        b.tokens.add_used(tokens)
        b.cost.add_used(cost_usd)
        self.run_cost.add_used(cost_usd)
        self.spent_since_start += cost_usd
        self.lost_usd[dataset] += cost_usd
        self.dataset_usd[dataset] += cost_usd

    def count_lost(self, dataset: str, tokens: int, usd: float, cls: str | None = None) -> None:
        """Count the spend of a stream an earlier process of the run lost (cut by a kill, recorded by
        :func:`engine.stream.recover.recover_cut_streams`): budgets, caps and the dataset's dollars;
        with its class ``cls``, its ``tokens`` streamed as a censored length of that class (recorded
        after :meth:`seed` read the store, they would be missing there: the restart after a kill then
        reserved from the short completions alone)."""
        if dataset in self.dataset_usd:
            self.add_partial(dataset, usd, tokens=tokens)  # counts it in lost_usd too (once)
            est = self.budgets[dataset].estimators.get(cls) if cls is not None else None
            if est is not None:
                est.observe_cut(tokens, -1)  # dispatched by the last process: after the seeded lengths

    def true_up_lost(self, dataset: str, delta_usd: float) -> None:
        """Replace an estimated bill of an attempt that produced no result (a cut stream's, a failed
        attempt's) by the billed figure: add ``delta_usd`` = billed - estimated (USD; may be
        negative) to the dataset's lost spend, its dollars, the caps and this process's spend.
        ``used`` never drops below 0."""
        if dataset not in self.dataset_usd:
            return
        b = self.budgets[dataset]
        for budget in (b.cost, self.run_cost):
            budget.used = max(0.0, budget.used + delta_usd)
        self.spent_since_start += delta_usd
        self.lost_usd[dataset] += delta_usd
        self.dataset_usd[dataset] += delta_usd

    def correct(self, dataset: str, prompt_tokens: int, completion_tokens: int, cost_usd: float) -> None:
        """Correct a settled result's figures by the given differences (tokens, USD; may be negative),
        e.g. when a ``/generation`` true-up replaces counted or estimated usage: the budgets then hold
        the true figures, counted once. ``used`` never drops below 0."""
        b = self.budgets[dataset]
        tokens = completion_tokens + (prompt_tokens if b.counts_total else 0)
        for budget, amount in ((b.tokens, tokens), (b.cost, cost_usd), (self.run_cost, cost_usd)):
            budget.used = max(0.0, budget.used + amount)
        self.spent_since_start += cost_usd
        self.dataset_usd[dataset] += cost_usd

    def estimate_cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Cost (USD) of the given tokens at the best known prices; 0.0 when no price is known."""
        p = self.prices()
        return p.cost(prompt_tokens, completion_tokens) if p else 0.0

    def budget_met(self, dataset: str, cls: str, est_prompt_tokens: int = 0) -> str | None:
        """The reason the dataset can take no more requests, or None."""
        b = self.budgets[dataset]
        if self.naive:
            if b.tokens.limit is not None and b.tokens.used >= b.tokens.limit:
                return f"token budget met: {b.tokens.used:,.0f} / {b.tokens.limit:,.0f} tokens"
            if b.cost.limit is not None and b.cost.used >= b.cost.limit:
                return f"cost cap met: ${b.cost.used:.2f} / ${b.cost.limit:.2f}"
            return None
        if b.budget_met(cls, self.prices() if self.has_cost_cap else None, est_prompt_tokens):
            return b.reason()
        return None

    def refusal_reason(self, dataset: str, cls: str, est_prompt_tokens: int = 0) -> str:
        """Why :meth:`reserve` refuses the dataset's next request of ``cls`` when nothing is in flight
        run-wide (so nothing can settle and make room): what the request needs against what each
        budget has left (tokens, USD), e.g. ``"budgets cannot hold the next request with nothing in
        flight: needs ~1,850 tokens / ~$0.0195; left: run cost cap $0.0124"``."""
        b = self.budgets[dataset]
        est = b.estimators[cls]
        expected = est.max_tokens if b.hard_cap else est.expected()
        usd = self.estimate_cost(est_prompt_tokens, expected)
        left = []
        for name, budget, money in (("token budget", b.tokens, False), ("cost cap", b.cost, True),
                                    ("run cost cap", b.run_cost, True)):
            if budget.limit is not None:
                room = budget.limit - budget.used - budget.reserved
                left.append(f"{name} {fmt_usd(room) if money else f'{room:,.0f} tokens'}")
        return (f"budgets cannot hold the next request with nothing in flight: needs ~{expected:,} tokens / "
                f"~${usd:,.4f}; left: {', '.join(left) or 'unlimited (overrun of finished streams)'}")

    def observed_lengths(self, dataset: str, cls: str) -> list[float]:
        """Recent completion lengths (tokens, sorted) of ``dataset``'s class ``cls``; the class's
        over every dataset while this one has none; [] when none at all."""
        own = self.budgets[dataset].estimators[cls].recent_lengths()
        if own:
            return own
        out: list[float] = []
        for b in self.budgets.values():
            est = b.estimators.get(cls)
            if est is not None:
                out += est.recent_lengths()
        return out

    def length_model(self, dataset: str, cls: str, in_flight: list[float]) -> Any:
        """The length distribution of ``dataset``'s class ``cls``: :meth:`CompletionEstimator.lengths`
        (its streams in flight censored as the scheduler last gave them, at most a tick old, and the cut
        streams), else, before any ``set_censored``, :meth:`CompletionEstimator.lengths_with` ``in_flight``
        (tokens streamed so far by its requests in flight); before this dataset has a completion of the
        class, the class's lengths over every dataset (:class:`engine.money.inflight.LengthModel`)."""
        est = self.budgets[dataset].estimators[cls]
        dist = est.lengths() if est.count and est.censored_set else est.lengths_with(in_flight)
        return dist if dist is not None else LengthModel(self.observed_lengths(dataset, cls), in_flight, est.max_tokens)

    def reserved_tokens(self, dataset: str) -> int:
        """Tokens the dataset's in-flight requests hold: what they reserved at dispatch plus the hold
        (:mod:`engine.money.overrun`: their expected final lengths and margin in place of that), >= 0."""
        b = self.budgets[dataset]
        return max(0, int(b.tokens.reserved + (b.overrun.total if len(b.overrun) else 0)))

    # ---- credits ----------------------------------------------------------------------------
    def usage_baseline(self) -> float | None:
        """The provider's usage (USD) before this run's first dollar: the first reading's usage minus
        what the run had accounted by then, earlier processes included (persisted by the run, so the
        drift spans every process of the run: what a kill lost shows); None before a reading."""
        if self.usage_at_start is None:
            return None
        return self.usage_at_start - sum(self.dataset_usd.values()) + self.spent_since_start

    def seed_baseline(self, baseline: float) -> None:
        """Take the run's persisted :meth:`usage_baseline` (call after the counters are seeded, before
        the first reading): the drift then counts from the run's first start, not this process's."""
        self.usage_at_start = baseline + sum(self.dataset_usd.values()) - self.spent_since_start

    def on_credits(self, reading: CreditsReading) -> None:
        """Record a credits reading (the first one fixes the usage baseline for reconciliation, unless
        :meth:`seed_baseline` gave the run's own)."""
        if self.usage_at_start is None and reading.usage_usd is not None:
            self.usage_at_start = reading.usage_usd - self.spent_since_start
        self.credits = reading
        self._spent_at_reading = self.spent_since_start
        self.credit_holds.on_reading(reading.remaining_usd, self.spent_since_start)

    def drift_usd(self) -> float | None:
        """Provider-reported usage since the run's first start minus our accounted spend since then
        (every process of the run, with :meth:`seed_baseline`; else this process's), both as of the
        last credits reading (USD). Positive: the provider billed more than we accounted."""
        c = self.credits
        if c is None or c.usage_usd is None or self.usage_at_start is None:
            return None
        return (c.usage_usd - self.usage_at_start) - self._spent_at_reading

    # ---- projections ------------------------------------------------------------------------
    def project(self, dataset: str, *, prompts_left: int, in_flight: int, cost_so_far: float,
                completion_tokens: int, recent_tok_per_s: float, since_start_tok_per_s: float,
                fallback_mean_tokens: float | None = None, mean_prompt_tokens: float = 0.0,
                pending_by_class: Mapping[str, int] | None = None,
                run_room_usd: float | None = None, stream_tok_per_s: float = 0.0) -> DatasetProjection:
        """Project the dataset's final tokens, cost and ETA (see :func:`engine.money.projection.project_dataset`;
        calibrated after ``spend.calibrate_after`` completions, a range before).

        Lengths come from each class's :meth:`CompletionEstimator.lengths`: finished completions AND
        the streams in flight (censored at what they streamed, as last given by
        :meth:`CompletionEstimator.set_censored`), so the first, short completions do not make the
        rest look cheap. The streams in flight count at their expected final lengths, the prompts
        left at each class's mean; ``tokens_sd`` combines the lengths' own noise with the error of
        the estimated means. ``stream_tok_per_s`` (one stream's rate, tokens per second; 0: unknown)
        turns the drain of the last streams into the ETA's ``eta_tail_s`` / ``eta_floor_s``.

        The rest is priced at :meth:`prices` (observed from billed results, else ``[pricing]`` or
        ``/models``; the fit over whatever results were seen when none of those is known), never
        from ``cost_so_far`` / ``completion_tokens``, which spend of aborted attempts inflates.
        ``mean_prompt_tokens`` (tokens per request) prices each request's prompt.
        ``pending_by_class`` (prompts per request class) sets the per-request cap of the range's
        high end to the classes' ``max_tokens`` weighted by what is left of each (in-flight requests
        taken in the same mix): a dataset of short prompts is never projected at the long class's
        cap. Without it, or with nothing pending, the largest ``max_tokens`` of the classes.
        ``run_room_usd``: what the run's dollar cap leaves (USD; None: no run cap): with the
        dataset's own ``max_cost_usd`` it clamps the projected costs (``capped_by``)."""
        b = self.budgets[dataset]
        fig = _length_figures(b.estimators, pending_by_class, prompts_left, stream_tok_per_s)
        mean = fig.mean
        if mean is None:
            means = [m for e in b.estimators.values() if (m := e.mean()) is not None]
            mean = (sum(means) / len(means)) if means else None
        budget = b.tokens.limit
        p = self.prices() or self.observer.fitted()
        return project_dataset(
            prompts_left=prompts_left, in_flight=in_flight, used_tokens=int(b.tokens.used),
            token_budget=int(budget) if budget is not None else None, mean_completion_tokens=mean,
            max_tokens=_weighted_max_tokens(b.estimators, pending_by_class), cost_so_far=cost_so_far,
            cost_per_completion_token=p.completion_usd_per_token if p else None, recent_tok_per_s=recent_tok_per_s,
            since_start_tok_per_s=since_start_tok_per_s, cost_cap=b.cost.limit,
            observed=sum(e.count for e in b.estimators.values()), calibrate_after=self.cfg.spend.calibrate_after,
            fallback_mean_tokens=fallback_mean_tokens,
            prompt_usd_per_request=(p.prompt_usd_per_token * mean_prompt_tokens) if p else 0.0,
            run_room_usd=run_room_usd, in_flight_tokens=_flying(fig, in_flight, mean, b.estimators, pending_by_class),
            tokens_sd=fig.sd, eta_tail_s=fig.tail_s, eta_floor_s=fig.floor_s,
            next_request_tokens=max((e.expected() for c, e in b.estimators.items()
                                     if (pending_by_class or {}).get(c, 0) > 0), default=0),
            in_flight_received=fig.received,
        )


def _flying(fig: "_LengthFigures", in_flight: int, mean: float | None, estimators: Mapping[str, Any],
            pending_by_class: Mapping[str, int] | None) -> float | None:
    """Expected final tokens of ``in_flight`` streams: the censored figure of those the estimators
    were last told of, ``mean`` (else the classes' ``max_tokens``) for any dispatched since; None
    when none is known (the projection then counts ``mean`` per stream)."""
    if not in_flight or not fig.streams:
        return None
    per = mean if mean is not None else _weighted_max_tokens(estimators, pending_by_class)
    return fig.in_flight_tokens + max(0, in_flight - fig.streams) * per


@dataclass(frozen=True)
class _LengthFigures:
    mean: float | None  # tokens per prompt left (classes weighted by what is left of each)
    in_flight_tokens: float  # expected final tokens of the streams in flight the estimators know of
    streams: int  # how many those are
    received: float  # what they have streamed so far
    sd: float  # of the tokens to come
    tail_s: float
    floor_s: float


def _length_figures(estimators: Mapping[str, Any], pending_by_class: Mapping[str, int] | None, prompts_left: int,
                    stream_tok_per_s: float) -> _LengthFigures:
    """A dataset's length figures from its classes' censored length distributions (see :meth:`SpendControl.project`)."""
    pending = {c: n for c, n in (pending_by_class or {}).items() if n > 0 and c in estimators}
    weights = pending or {c: 1 for c in estimators}
    total_w = sum(weights.values())
    mean_sum = 0.0
    known = True
    flying = 0.0
    var = 0.0
    tail_s = floor_s = 0.0
    for cls, est in estimators.items():
        dist = est.lengths() if est.count else None
        if dist is None or not dist.known:
            known = known and cls not in weights
            flying += len(est.censored) * est.max_tokens
            continue
        m = dist.mean()
        mean_sum += weights.get(cls, 0) * m
        left = pending.get(cls, 0)
        rem_sum = 0.0
        for r in est.censored:
            e, v = dist.remaining_moments(r)
            flying += r + e
            rem_sum += e
            var += v
        se = dist.mean_standard_error()
        var += left * dist.variance() + (left * se) ** 2 + (rem_sum * se / m if m > 0 else 0.0) ** 2
        if stream_tok_per_s > 0 and est.censored:
            if left > 0:
                x = dist.drain_tokens([], steady=len(est.censored))
                tail_s = max(tail_s, (x - _mean_residual(dist)) / stream_tok_per_s)
            else:
                floor_s = max(floor_s, dist.drain_tokens(est.censored) / stream_tok_per_s)
    mean = mean_sum / total_w if known and total_w else None
    streams = sum(len(e.censored) for e in estimators.values())
    received = sum(sum(e.censored) for e in estimators.values())
    return _LengthFigures(mean, flying, streams, received, math.sqrt(var), max(0.0, tail_s), floor_s)


def _mean_residual(dist: Any) -> float:
    """Mean remaining length of a stream caught at a random moment of its life (tokens):
    ``E[L^2] / (2 E[L])`` of the capped lengths (the equilibrium residual of a renewal process)."""
    m = dist.mean()
    if m <= 0:
        return 0.0
    second = dist.variance() + m * m
    return second / (2.0 * m)


def _weighted_max_tokens(estimators: Mapping[str, Any], pending_by_class: Mapping[str, int] | None) -> float:
    """The per-request ``max_tokens`` (tokens) of what is left: the classes' caps weighted by their
    pending prompts; the largest cap when no class has any pending (an upper bound)."""
    left = {c: n for c, n in (pending_by_class or {}).items() if n > 0 and c in estimators}
    if not left:
        return float(max(e.max_tokens for e in estimators.values()))
    return sum(n * estimators[c].max_tokens for c, n in left.items()) / sum(left.values())
