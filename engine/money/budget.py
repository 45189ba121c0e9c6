"""Token and dollar budgets that cannot be overshot by ``concurrency x max_tokens``.

Pure logic, no I/O, no clocks. A request *reserves* its expected cost at dispatch and *settles*
the actual figure on completion (or *releases*, counting what was streamed, when it fails), so
``used + reserved`` bounds what may still be spent and a dispatcher simply stops when a new
reservation does not fit. The expected completion length comes from a per-(dataset, class)
:class:`CompletionEstimator`: ``max_tokens`` until calibrated, then a high percentile of recent
lengths (raised to its upper confidence bound while few were seen). A stream's hold grows with its
progress (:mod:`engine.money.overrun`), and ``hard_cap`` reserves ``max_tokens`` so a budget is never
exceeded. Unknown prices are ``None``, never ``$0``.

Units: token budgets count tokens, cost budgets count USD; :class:`Budget` is unit-agnostic.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import DatagenError
from engine.money.estimator import UCB_Z, CompletionEstimator, km_quantile  # noqa: F401 - re-exported
from engine.money.overrun import HOLD_ERROR_FACTOR, OverrunTracker
from engine.money.prices import Prices  # re-exported: callers price reservations with it

HARD_CAP_PROMPT_FACTOR = 4
"""``hard_cap`` reserves the prompt at this multiple of its estimate (characters / 4 + 4 per
message), i.e. up to one token per character, where prompt tokens count (``budget_counts = "total"``,
dollar caps)."""


class BudgetExceeded(DatagenError):
    """A reservation was requested that the budget cannot hold (callers check first)."""


class NoPriceError(DatagenError, ValueError):
    """A dollar cap is set but no price is known, so a request's cost cannot be reserved."""


def fmt_usd(x: float) -> str:
    """``$1,234.57`` (two decimals, thousands separators)."""
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


@dataclass(frozen=True)
class Reservation:
    """An open hold of ``amount`` (budget units) on one :class:`Budget`; ``rid`` is unique
    across all budgets of the process."""

    amount: float
    rid: int


_rids = itertools.count(1)


class Budget:
    """A spend limit in one unit (tokens or USD) with reservations.

    Args:
        limit: the cap (>= 0), or None for unlimited (still tracks ``used``/``reserved``).

    Raises:
        ValueError: negative or NaN ``limit``.
    """

    def __init__(self, limit: float | None) -> None:
        if limit is not None and not limit >= 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit!r}")
        self.limit = limit
        self.used = 0.0
        self._open: dict[int, float] = {}
        self._reserved = 0.0

    @property
    def reserved(self) -> float:
        """Sum of the open reservations (units)."""
        return self._reserved

    def can_reserve(self, amount: float) -> bool:
        """True when unlimited or ``used + reserved + amount <= limit``."""
        return self.limit is None or self.used + self._reserved + amount <= self.limit

    def reserve(self, amount: float, hold: float = 0.0) -> Reservation:
        """Hold ``amount`` units for a request about to be sent.

        ``hold``: what the streams in flight are expected to take beyond their reservations (units;
        negative when they reserved more than expected, see :mod:`engine.money.overrun`), counted
        in the check as :meth:`can_reserve` ``(amount + hold)``.

        Raises:
            ValueError: negative or NaN ``amount``.
            BudgetExceeded: :meth:`can_reserve` is False for ``amount + hold``.
        """
        if not amount >= 0:
            raise ValueError(f"amount must be >= 0, got {amount!r}")
        if not self.can_reserve(amount + hold):
            raise BudgetExceeded(
                f"cannot reserve {amount:g}: used {self.used:g} + reserved {self._reserved:g} "
                f"> limit {self.limit:g}"
            )
        res = Reservation(float(amount), next(_rids))
        self._open[res.rid] = res.amount
        self._reserved += res.amount
        return res

    def is_open(self, res: Reservation) -> bool:
        """True while ``res`` belongs to this budget and was neither settled nor released."""
        return res.rid in self._open

    def _close(self, res: Reservation) -> None:
        amount = self._open.pop(res.rid, None)
        if amount is None:
            raise ValueError(f"reservation {res.rid} already settled/released or not from this budget")
        # Reset exactly when idle so float residue cannot accumulate over millions of requests.
        self._reserved = self._reserved - amount if self._open else 0.0

    def settle(self, res: Reservation, actual: float) -> None:
        """Close ``res`` and add the request's ``actual`` spend to ``used``.

        Raises:
            ValueError: ``res`` already closed or foreign; negative ``actual``.
        """
        if not actual >= 0:
            raise ValueError(f"actual must be >= 0, got {actual!r}")
        self._close(res)
        self.used += actual

    def release(self, res: Reservation, spent: float = 0.0) -> None:
        """Close ``res`` of an aborted/failed request; ``spent`` (what was streamed/billed
        anyway) is added to ``used``.

        Raises:
            ValueError: ``res`` already closed or foreign; negative ``spent``.
        """
        self.settle(res, spent)

    def add_used(self, amount: float) -> None:
        """Add spend that had no reservation (units).

        Raises:
            ValueError: negative ``amount``.
        """
        if not amount >= 0:
            raise ValueError(f"amount must be >= 0, got {amount!r}")
        self.used += amount

    @property
    def remaining(self) -> float | None:
        """``limit - used`` (may be negative after an overshoot); None when unlimited."""
        return None if self.limit is None else self.limit - self.used

    def exhausted(self, next_amount: float) -> bool:
        """True when a limit is set and ``used + next_amount > limit``: even with nothing in
        flight, one more request of ``next_amount`` would not fit."""
        return self.limit is not None and self.used + next_amount > self.limit

    @property
    def overshoot(self) -> float:
        """``max(0, used - limit)`` (units; 0 when unlimited)."""
        return 0.0 if self.limit is None else max(0.0, self.used - self.limit)


@dataclass(frozen=True)
class Reservations:
    """The holds of one dispatched request across its dataset's budgets.

    Attributes:
        cls: request class (``"short"``, ``"long"``...).
        est_prompt_tokens: prompt-token estimate used (tokens).
        expected_completion_tokens: completion tokens reserved (tokens).
        tokens / cost / run_cost: reservations on the token, dataset-cost and run-cost budgets.
    """

    cls: str
    est_prompt_tokens: int
    expected_completion_tokens: int
    tokens: Reservation
    cost: Reservation
    run_cost: Reservation


class DatasetBudgets:
    """Token budget, cost cap and the shared run cost cap of one dataset, reserved atomically.

    Args:
        max_tokens: completion cap per class (tokens), e.g. ``{"short": 10240, "long": 16384}``;
            one :class:`CompletionEstimator` is kept per class.
        token_budget: token cap (tokens) or None.
        max_cost_usd: dataset cost cap (USD) or None.
        run_cost: the run-wide cost :class:`Budget` shared by all datasets (None: unlimited).
        counts_total: the token budget counts prompt + completion tokens (default completion only).
        calibrate_after / percentile / window: passed to each :class:`CompletionEstimator`.
        hard_cap: never exceed a budget: every request reserves its class's ``max_tokens`` (and
            :data:`HARD_CAP_PROMPT_FACTOR` x the prompt estimate where prompts count, in tokens
            or dollars), so ``used + reserved <= limit`` bounds the final spend. Fewer requests fit
            in flight near the end (see ``bench/b9_hard_cap.py`` for the throughput cost).

    Without ``hard_cap``, the reservation of a stream still running grows with its progress
    (:mod:`engine.money.overrun`): after :meth:`track` and each :meth:`refresh`, the streams in flight
    hold their expected final lengths plus a noise margin instead of what they reserved at dispatch.
    """

    def __init__(self, max_tokens: Mapping[str, int], *, token_budget: int | None = None,
                 max_cost_usd: float | None = None, run_cost: Budget | None = None,
                 counts_total: bool = False, calibrate_after: int = 50, percentile: float = 0.90,
                 window: int = 2000, hard_cap: bool = False) -> None:
        self.estimators = {
            cls: CompletionEstimator(mt, calibrate_after, percentile, window)
            for cls, mt in max_tokens.items()
        }
        self.tokens = Budget(token_budget)
        self.cost = Budget(max_cost_usd)
        self.run_cost = run_cost if run_cost is not None else Budget(None)
        self.counts_total = counts_total
        self.hard_cap = hard_cap
        self.overrun = OverrunTracker()
        self._open_order: dict[str, dict[int, None]] = {cls: {} for cls in max_tokens}  # dispatch order of each open request
        self._reason = ""

    def _estimator(self, cls: str) -> CompletionEstimator:
        try:
            return self.estimators[cls]
        except KeyError:
            raise KeyError(f"unknown request class {cls!r}") from None

    def _amounts(self, cls: str, est_prompt_tokens: int, prices: Prices | None) -> tuple[int, int, float]:
        if est_prompt_tokens < 0:
            raise ValueError("est_prompt_tokens must be >= 0")
        est = self._estimator(cls)
        expected = est.max_tokens if self.hard_cap else est.expected()
        prompt = est_prompt_tokens * HARD_CAP_PROMPT_FACTOR if self.hard_cap else est_prompt_tokens
        tok = expected + (prompt if self.counts_total else 0)
        cost = 0.0
        if self.cost.limit is not None or self.run_cost.limit is not None:
            if prices is None:
                raise NoPriceError("a cost cap is set but no price is known for this model")
            cost = prices.cost(prompt, expected)
        return expected, tok, cost

    def try_reserve(self, cls: str, est_prompt_tokens: int, prices: Prices | None,
                    run_hold_tokens: float | None = None) -> Reservations | None:
        """Reserve one request of class ``cls`` on all budgets, or nothing.

        Token amount: expected completion tokens (+ ``est_prompt_tokens`` when ``counts_total``).
        Cost amount (USD): ``prices.cost(est_prompt_tokens, expected)`` when any cost cap is set,
        else 0. (``hard_cap``: ``max_tokens`` and the prompt estimate x :data:`HARD_CAP_PROMPT_FACTOR`.)
        It fits when each budget holds it on top of ``used + reserved`` and the streams' hold
        (:attr:`overrun`; priced at the completion price for dollar budgets). ``run_hold_tokens``: the
        hold of every dataset sharing the run's cost cap (tokens; None: this dataset's alone): the
        run cap is checked against all of them.

        Returns:
            The :class:`Reservations`, or None (nothing reserved) when any budget refuses.

        Raises:
            KeyError: unknown class.
            NoPriceError: a cost cap is set and ``prices`` is None.
            ValueError: negative ``est_prompt_tokens``.
        """
        expected, tok, cost = self._amounts(cls, est_prompt_tokens, prices)
        over_tok = self.overrun.total
        price = prices.completion_usd_per_token if prices is not None else 0.0
        over_usd = over_tok * price
        run_over = over_usd if run_hold_tokens is None else run_hold_tokens * price
        if not (self.tokens.can_reserve(tok + over_tok) and self.cost.can_reserve(cost + over_usd)
                and self.run_cost.can_reserve(cost + run_over)):
            return None
        r = Reservations(cls, est_prompt_tokens, expected, self.tokens.reserve(tok, over_tok),
                         self.cost.reserve(cost, over_usd), self.run_cost.reserve(cost, run_over))
        self._open_order[cls][r.tokens.rid] = None
        return r

    def _check_open(self, r: Reservations) -> None:
        if not (self.tokens.is_open(r.tokens) and self.cost.is_open(r.cost)
                and self.run_cost.is_open(r.run_cost)):
            raise ValueError("reservations already settled/released or not from these budgets")

    def settle(self, r: Reservations, prompt_tokens: int, completion_tokens: int,
               cost_usd: float | None, prices: Prices | None) -> None:
        """Close a completed request: observe its length in the class estimator and add its
        tokens and cost (``cost_usd`` if reported, else ``prices.cost(...)``, else 0 USD).

        Raises:
            ValueError: ``r`` already settled/released (nothing is changed then) or negatives.
        """
        self._check_open(r)
        if prompt_tokens < 0 or completion_tokens < 0:
            raise ValueError("token counts must be >= 0")
        if cost_usd is None:
            cost_usd = prices.cost(prompt_tokens, completion_tokens) if prices is not None else 0.0
        if not cost_usd >= 0:
            raise ValueError(f"cost_usd must be >= 0, got {cost_usd!r}")
        self._estimator(r.cls).observe(completion_tokens, r.tokens.rid)
        self._open_order[r.cls].pop(r.tokens.rid, None)
        self.overrun.close(r.tokens.rid, completion_tokens)
        self.tokens.settle(r.tokens, completion_tokens + (prompt_tokens if self.counts_total else 0))
        self.cost.settle(r.cost, cost_usd)
        self.run_cost.settle(r.run_cost, cost_usd)

    def release(self, r: Reservations, tokens_spent: int = 0, cost_spent: float = 0.0) -> None:
        """Close an aborted/failed request, counting what was streamed/billed anyway
        (``tokens_spent`` in budget tokens, ``cost_spent`` USD). Truncated lengths are not fed to
        the estimator (they would bias it low).

        Raises:
            ValueError: ``r`` already settled/released (nothing is changed then) or negatives.
        """
        self._check_open(r)
        if not (tokens_spent >= 0 and cost_spent >= 0):
            raise ValueError("spent amounts must be >= 0")
        self._open_order[r.cls].pop(r.tokens.rid, None)
        streamed = tokens_spent - (r.est_prompt_tokens if self.counts_total else 0)
        self._estimator(r.cls).observe_cut(streamed, r.tokens.rid)
        self.overrun.close(r.tokens.rid, streamed)
        self.tokens.release(r.tokens, tokens_spent)
        self.cost.release(r.cost, cost_spent)
        self.run_cost.release(r.run_cost, cost_spent)

    def track(self, r: Reservations, progress: Any) -> None:
        """Follow the stream of open reservation ``r``: ``progress.tokens_received`` (completion
        tokens streamed so far) is read at each :meth:`refresh`. Closed by :meth:`settle` /
        :meth:`release`. Nothing is tracked under ``hard_cap`` (``max_tokens`` is reserved already)."""
        if not self.hard_cap and self.tokens.is_open(r.tokens):
            self.overrun.track(r.tokens.rid, r.cls, r.expected_completion_tokens, progress)

    def refresh(self, prices: Prices | None = None) -> int:
        """Recompute the hold of the tracked streams (:mod:`engine.money.overrun`) from their progress
        and each class's length distribution (call after :meth:`CompletionEstimator.set_censored`).
        Returns it (tokens, may be negative: the dispatch-time percentiles reserved more than the
        streams are expected to take). ``prices`` is unused (kept for the callers' signature)."""
        for cls, est in self.estimators.items():
            est.set_oldest_in_flight(next(iter(self._open_order[cls]), None))
        if not len(self.overrun):
            return 0
        return self.overrun.refresh(lambda cls, got: self.estimators[cls].moments(got),
                                    lambda cls: HOLD_ERROR_FACTOR * self.estimators[cls].mean_relative_error())

    def budget_met(self, cls_next: str, prices: Prices | None = None, est_prompt_tokens: int = 0) -> bool:
        """True when this dataset can never dispatch another request of ``cls_next``: a budget's
        ``used`` reached its limit, or it is :meth:`Budget.exhausted` for the next request's
        expected amount (tokens; USD only when ``prices`` is given). The shared run cost cap
        counts too. The dataset's remaining prompts then count as skipped. :meth:`reason` tells
        which budget.

        Raises:
            KeyError: unknown class.
        """
        est = self._estimator(cls_next)
        expected = est.max_tokens if self.hard_cap else est.expected()
        prompt = est_prompt_tokens * HARD_CAP_PROMPT_FACTOR if self.hard_cap else est_prompt_tokens
        tok = expected + (prompt if self.counts_total else 0)
        cost = prices.cost(prompt, expected) if prices is not None else 0.0
        unit = "prompt+completion tokens" if self.counts_total else "completion tokens"
        self._reason = ""
        t = self.tokens
        if t.limit is not None and (t.used >= t.limit or t.exhausted(tok)):
            self._reason = f"token budget met: {t.used:,.0f} / {t.limit:,.0f} {unit}"
            if t.used < t.limit:
                self._reason += f" (next request needs ~{tok:,})"
        for b, name in ((self.cost, "cost cap max_cost_usd"), (self.run_cost, "run cost cap")):
            if not self._reason and b.limit is not None and (b.used >= b.limit or b.exhausted(cost)):
                self._reason = f"{name} met: {fmt_usd(b.used)} / {fmt_usd(b.limit)}"
                if b.used < b.limit:
                    self._reason += f" (next request needs ~${cost:,.4f})"
        return bool(self._reason)

    def reason(self) -> str:
        """Why the last :meth:`budget_met` call returned True, e.g.
        ``"token budget met: 200,312 / 200,000 completion tokens"``; ``""`` if it returned False."""
        return self._reason
