"""What a request cost: a result's tokens and dollars, failed attempts' partial spend, and the
late ``/generation`` true-ups that correct both.

A collaborator of :class:`engine.run.scheduler.Scheduler` (built in its constructor): every dollar it
learns goes into the spend ledger (:class:`engine.money.spend.SpendControl`, the one place money is
counted), the telemetry's spend rate, and the store (through the writer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable

from engine.money.plausible import Bounds, check
from engine.money.usage import (
    GENERATION,
    Accounted,
    account,
    correction,
    count_with_tokenizer,
    from_generation,
    implausible,
    usage_usable,
)

if TYPE_CHECKING:
    from engine.client.types import Completion
    from engine.money.inflight import InFlightCost
    from engine.money.spend import SpendControl
    from engine.run.runstate import DatasetRuntime
    from engine.run.seams import GetJsonFn, Reconstructor
    from engine.run.telemetry import Telemetry
    from engine.storage.store import PendingPrompt
    from engine.storage.writer import StoreWriter

log = logging.getLogger("engine.run.scheduler")

TRUEUP_END_WAIT_S = 5.0
"""Seconds the end of a run waits, in all, for the ``/generation`` true-ups still in progress
(:meth:`Accounting.settle`) before it cancels them: an abort of thousands of streams must not hold
the exit for tens of seconds; the estimates left are trued up at the next start (:meth:`Accounting.trueup_stored`)."""


class Accounting:
    """Costs of one run's requests.

    Args:
        spend: the money ledger. telemetry: the run's telemetry (spend rate per provider).
        writer: the run's store writer (attempt costs, result usage).
        clock: monotonic clock (s).
        get_json: the provider's ``get_json`` for ``/generation`` (None: partial costs are estimated,
            results are never trued up).
        recon: the reconstruction service whose tokenizer counts usage a response lacks (or None).

    Attributes:
        trueups: the ``/generation`` reads in progress (the run waits :data:`TRUEUP_END_WAIT_S` at
            most for them at its end, then cancels them: :meth:`settle`).
        closed: set by :meth:`settle`: no true-up starts any more (the HTTP client is about to close).
        settled / settled_usd: estimated bills trued up so far, and the sum of their corrections (USD).
        implausible: results and failed attempts per provider whose reported usage or cost was not
            believed (:mod:`engine.money.plausible`); the first of each provider is a warning event.
    """

    def __init__(self, spend: "SpendControl", telemetry: "Telemetry", writer: "StoreWriter",
                 clock: Callable[[], float], get_json: "GetJsonFn | None" = None,
                 recon: "Reconstructor | None" = None) -> None:
        self.spend = spend
        self.telemetry = telemetry
        self.writer = writer
        self.clock = clock
        self.get_json = get_json
        self.recon = recon
        self.trueups: set[asyncio.Task] = set()
        self._bills: set[asyncio.Task] = set()  # the true-ups of estimated bills among :attr:`trueups`
        self._results: set[asyncio.Task] = set()  # and those of results' usage
        self.closed = False
        #: estimated bills of attempts without a result, awaiting their ``/generation`` true-up: made by
        #: this process (cut streams, failed attempts) or read from the store (:meth:`trueup_stored`)
        self.estimated = 0
        #: true-ups of estimated bills that landed, and what they changed (USD: billed - estimated)
        self.settled = 0
        self.settled_usd = 0.0
        self.implausible: dict[str, int] = {}

    def partial_spend(self, rt: "DatasetRuntime", err_or_progress: Any, est_prompt_tokens: int,
                      provider: str | None = None, cut: "InFlightCost | None" = None) -> tuple[int, float, bool]:
        """Tokens, USD and whether the USD is an estimate awaiting its true-up, of a failed or aborted
        attempt that produced no result:

        - the cost the error or stream reported (billed);
        - else, with a generation id and ``/generation``: an estimate now, replaced by the billed
          figure when ``/generation`` answers (:meth:`_trueup`): for a cut stream (``cut``, its figures
          at the cut) its estimated bill (``abort_usd``: what was generated plus its provider's
          observed share of the rest, in full before any observation), for an error what was generated;
        - else what was generated at the best known prices (a lower bound; for a cut stream with no
          generation id, its estimated bill once its provider's billing was observed).
        """
        tokens = int(getattr(err_or_progress, "tokens_received", 0) or 0)
        gid = getattr(err_or_progress, "generation_id", "") or ""
        cost = getattr(err_or_progress, "partial_cost_usd", None)
        if cost is None:
            cost = getattr(err_or_progress, "cost_usd", None)
        if cost is not None:
            why = check(est_prompt_tokens, tokens, float(cost), self.bounds(est_prompt_tokens))
            if not why:
                return tokens, float(cost), False
            self._implausible(rt.name, provider or "", why)  # a cost no price list allows: ours instead
        generated = self.spend.estimate_cost(est_prompt_tokens if tokens else 0, tokens)
        if gid and self.get_json is not None:
            est = cut.abort_usd if cut is not None else generated
            self.estimated += 1
            self._trueup(rt.name, gid, est, provider)
            return tokens, est, True
        if cut is not None and cut.abort_observed:  # a learned share; before any bill: the lower bound
            return tokens, max(generated, cut.abort_usd), False
        return tokens, generated, False

    def _trueup(self, dataset: str, gid: str, estimate_usd: float, provider: str | None = None,
                taught: "tuple[float, float] | None" = None, first_wait_s: float = 1.0, tries: int = 5,
                gate: "asyncio.Semaphore | None" = None) -> None:
        """Replace the estimated bill ``estimate_usd`` (USD) of an attempt that produced no result by
        what ``/generation`` says it was billed: the spend ledger, the telemetry and the attempt row
        (``cost_source`` ``generation``) take the difference. Unanswered, the estimate stays (the
        next start tries again, :meth:`trueup_stored`). ``taught``: the stream's ``(generated,
        expected)`` USD, which teach its provider's abort billing (this process's aborts were noted
        at the abort instead)."""
        from engine.money.credits import generation_cost

        async def read() -> float | None:
            try:
                if gate is not None:
                    async with gate:
                        return await generation_cost(self.get_json, gid, tries=tries, first_wait_s=first_wait_s)
                return await generation_cost(self.get_json, gid, tries=tries, first_wait_s=first_wait_s)
            except Exception as e:  # e.g. httpx's RuntimeError once the client closed: never a stray traceback
                log.debug("[%s] %s: bill not trued up (%s: %s); it stays an estimate until the next start",
                          dataset, gid, type(e).__name__, e)
                return None

        async def run() -> None:
            cost = await read()
            if cost is None:
                return
            if taught is not None:
                self.spend.aborts.add(provider or "", taught[0], taught[1], cost)
            else:
                self.spend.aborts.billed(gid, cost)
            delta = cost - estimate_usd
            self.spend.true_up_lost(dataset, delta)
            if delta > 0:
                self.telemetry.on_cost(provider, delta, self.clock())
            elif delta < 0:  # the estimate was high: the provider's figure comes down (the rate keeps what it saw)
                self.telemetry.providers.record_cost(provider or None, delta)
            self.writer.set_attempt_cost(gid, cost)
            self.settled_usd += delta
            self.settled += 1

        if self.closed:  # the run is closing: the estimate stays, trued up at the next start
            return
        self.track(asyncio.get_running_loop().create_task(run()), self._bills)

    def trueup_stored(self, rows: list[tuple[str, str, str, str, int, int, float]],
                      cut_costs: Callable[[str, list[tuple[str, str, int, int]]], list["InFlightCost"]],
                      concurrency: int = 16) -> int:
        """True up the estimated bills the store holds (:meth:`engine.storage.store.Store.estimated_attempts`:
        streams cut by a kill of an earlier process, or whose ``/generation`` had not answered when
        their process ended), ``concurrency`` reads at a time, in the background (tracked in
        :attr:`trueups`). ``cut_costs``: :meth:`engine.run.ending.RunEnding.cut_costs`, whose
        generated and expected figures teach each provider's abort billing. Returns how many were started."""
        if self.get_json is None or not rows:
            return 0
        gate = asyncio.Semaphore(max(1, concurrency))
        self.estimated += len(rows)
        for ds, cls, provider, gid, prompt, tokens, usd in rows:
            c = cut_costs(ds, [(cls, provider, prompt, tokens)])[0]
            self._trueup(ds, gid, float(usd or 0.0), provider, taught=(c.generated_usd, c.expected_usd),
                         first_wait_s=0.5, tries=3, gate=gate)
        return len(rows)

    def track(self, t: asyncio.Task, kind: "set[asyncio.Task] | None" = None) -> None:
        """Count ``t`` among the true-ups the run waits for (bounded) before it ends (and in ``kind``)."""
        for s in (self.trueups, kind) if kind is not None else (self.trueups,):
            s.add(t)
            t.add_done_callback(s.discard)

    async def settle(self, wait_s: float = TRUEUP_END_WAIT_S) -> tuple[int, int]:
        """End the true-ups before the HTTP client closes: wait up to ``wait_s`` seconds (in all) for
        those in progress, then cancel what is left and wait for the cancellations, so that no read
        outlives the client (a read of a closed client raised ``RuntimeError``, logged at exit as
        "Task exception was never retrieved"). No true-up starts afterwards (:attr:`closed`).

        Returns ``(bills, results)``: the estimated bills left as estimates (stored with
        ``cost_source = 'estimate'``, trued up at the next start by :meth:`trueup_stored`) and the
        results left at our own usage figures. Logs one line when any is left."""
        self.closed = True
        me = asyncio.current_task()
        pending = [t for t in self.trueups if t is not me]
        if pending and wait_s > 0:
            await asyncio.wait(pending, timeout=wait_s)
        left = [t for t in pending if not t.done()]
        bills = sum(1 for t in left if t in self._bills)
        results = sum(1 for t in left if t in self._results)
        for t in left:
            t.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)
        if bills or results:
            log.info("%d estimated bill(s) of cut or failed streams not trued up from /generation within %.0f s: "
                     "they stay estimates until the next start trues them up%s", bills, wait_s,
                     f"; {results} result(s) keep our own usage figures" if results else "")
        return bills, results

    def bounds(self, est_prompt_tokens: int, max_completion_tokens: int | None = None) -> Bounds:
        """What a request could have used (:class:`engine.money.plausible.Bounds`), priced with the
        price list (``[pricing]``, else ``/models``, else the prices learned from believed bills)."""
        sp = self.spend
        prices = sp.config_prices or sp.endpoint_prices or sp.prices()
        return Bounds(est_prompt_tokens, max_completion_tokens, prices)

    def _implausible(self, dataset: str, provider: str, why: tuple[str, ...]) -> None:
        """Count a usage not believed; the first of each provider is a warning (log and event)."""
        n = self.implausible.get(provider, 0)
        self.implausible[provider] = n + 1
        if n == 0:
            msg = (f"provider {provider or '(unnamed)'} reported an implausible usage ({'; '.join(why)}): "
                   f"not believed; such results are accounted at our estimate, priced from the price list "
                   f"(usage_source implausible, the provider's figures in results.usage_claimed)")
            log.warning("[%s] %s", dataset, msg)
            self.writer.add_event("warning", "implausible_usage", dataset, msg)

    async def account(self, p: "PendingPrompt", c: "Completion", max_completion_tokens: int | None = None) -> Accounted:
        """A result's tokens and cost (:func:`engine.money.usage.account`): the response's usage when it
        is believable (:mod:`engine.money.plausible`, ``max_completion_tokens``: the request's
        ``max_tokens`` + reasoning budget), else counted with the ``[tokenizer]`` of live
        reconstruction (in a thread: ~0.5 us a token, too long for the loop on long prompts), else
        estimated. An abort during the count does not lose the paid, finished result: it is
        accounted with the estimate and stored."""
        bounds = self.bounds(p.est_prompt_tokens, max_completion_tokens)
        why = implausible(c, bounds)
        if why:
            self._implausible(p.dataset, c.provider, why)
        tok = getattr(self.recon, "tok", None)
        counted: tuple | None = None
        if tok is not None and (why or not usage_usable(c)):
            try:
                counted = await asyncio.to_thread(count_with_tokenizer, tok, c, p.messages, p.tools)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
            except Exception as e:  # text the tokenizer refuses: the estimate stands
                log.warning("[%s] %s: usage could not be counted (%s: %s); estimated", p.dataset, p.key,
                            type(e).__name__, e)
        return account(c, est_prompt_tokens=p.est_prompt_tokens, price=self.price,
                       count=(lambda: counted) if counted is not None else None, bounds=bounds)

    def price(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """USD of the tokens at the best known prices; None when no price is known."""
        pr = self.spend.prices()
        return pr.cost(prompt_tokens, completion_tokens) if pr is not None else None

    def trueup_result(self, rt: "DatasetRuntime", prompt_id: int, gid: str, acc: Accounted, provider: str) -> None:
        """Replace a stored result's counted/estimated figures by the provider's ``/generation``
        stats once they are known (budgets, counters and the row corrected by the difference)."""
        from engine.money.credits import generation_stats

        async def run() -> None:
            try:
                stats = await generation_stats(self.get_json, gid)
            except Exception as e:  # e.g. the client closed under it: our figures stand
                log.debug("[%s] %s: usage not trued up (%s: %s)", rt.name, gid, type(e).__name__, e)
                return
            final = from_generation(stats, self.price)
            if final is None:
                return
            u = final.usage
            dp, dc, dr, dusd = correction(acc.usage, u)
            self.spend.correct(rt.name, dp, dc, dusd)
            if final.cost_billed:
                self.spend.observer.observe(u.prompt_tokens, u.completion_tokens, u.cost_usd)
            rt.prompt_tokens += dp
            rt.completion_tokens += dc
            rt.reasoning_tokens += dr
            if dusd > 0:
                self.telemetry.on_cost(provider, dusd, self.clock())
            self.writer.set_result_usage(prompt_id, u, GENERATION)

        if not self.closed:
            self.track(asyncio.get_running_loop().create_task(run()), self._results)


__all__ = ["Accounting"]
