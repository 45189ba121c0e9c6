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

from engine.money.usage import (
    GENERATION,
    Accounted,
    account,
    correction,
    count_with_tokenizer,
    from_generation,
    usage_usable,
)

if TYPE_CHECKING:
    from engine.client.types import Completion
    from engine.money.spend import SpendControl
    from engine.run.runstate import DatasetRuntime
    from engine.run.seams import GetJsonFn, Reconstructor
    from engine.run.telemetry import Telemetry
    from engine.storage.store import PendingPrompt
    from engine.storage.writer import StoreWriter

log = logging.getLogger("engine.run.scheduler")


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
        trueups: the ``/generation`` reads in progress (the run waits for them before it ends).
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

    def partial_spend(self, rt: "DatasetRuntime", err_or_progress: Any, est_prompt_tokens: int,
                      provider: str | None = None) -> tuple[int, float]:
        """Tokens/USD a failed or aborted attempt may have been billed (a lower bound): the cost the
        error or stream reported; else 0 now and a true-up from ``/generation`` when its generation
        id is known; else the estimate at the best known prices."""
        tokens = int(getattr(err_or_progress, "tokens_received", 0) or 0)
        gid = getattr(err_or_progress, "generation_id", "") or ""
        cost = getattr(err_or_progress, "partial_cost_usd", None)
        if cost is None:
            cost = getattr(err_or_progress, "cost_usd", None)
        if cost is not None:
            return tokens, float(cost)
        if gid and self.get_json is not None:
            self._trueup(rt, gid, provider)
            return tokens, 0.0
        return tokens, self.spend.estimate_cost(est_prompt_tokens if tokens else 0, tokens)

    def _trueup(self, rt: "DatasetRuntime", gid: str, provider: str | None = None) -> None:
        from engine.money.credits import generation_cost

        async def run() -> None:
            cost = await generation_cost(self.get_json, gid)
            if cost:
                self.spend.aborts.billed(gid, cost)
                self.spend.add_partial(rt.name, cost)
                self.telemetry.on_cost(provider, cost, self.clock())
                self.writer.set_attempt_cost(gid, cost)

        self._track(asyncio.get_running_loop().create_task(run()))

    def _track(self, t: asyncio.Task) -> None:
        self.trueups.add(t)
        t.add_done_callback(self.trueups.discard)

    async def account(self, p: "PendingPrompt", c: "Completion") -> Accounted:
        """A result's tokens and cost (:func:`engine.money.usage.account`): the response's usage, else
        counted with the ``[tokenizer]`` of live reconstruction (in a thread: ~0.5 us a token, too
        long for the loop on long prompts), else estimated. An abort during the count does not lose
        the paid, finished result: it is accounted with the estimate and stored."""
        tok = getattr(self.recon, "tok", None)
        counted: tuple | None = None
        if tok is not None and not usage_usable(c):
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
                       count=(lambda: counted) if counted is not None else None)

    def price(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """USD of the tokens at the best known prices; None when no price is known."""
        pr = self.spend.prices()
        return pr.cost(prompt_tokens, completion_tokens) if pr is not None else None

    def trueup_result(self, rt: "DatasetRuntime", prompt_id: int, gid: str, acc: Accounted, provider: str) -> None:
        """Replace a stored result's counted/estimated figures by the provider's ``/generation``
        stats once they are known (budgets, counters and the row corrected by the difference)."""
        from engine.money.credits import generation_stats

        async def run() -> None:
            final = from_generation(await generation_stats(self.get_json, gid), self.price)
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

        self._track(asyncio.get_running_loop().create_task(run()))


__all__ = ["Accounting"]
