"""What a request's outcome does to the run: the one place an :data:`engine.run.attempt.Outcome` is applied.

:func:`engine.run.attempt.run_request` returns the outcome of a prompt's request; the scheduler's
request task hands it to :meth:`Outcomes.apply` at once (in the same step of the event loop), which
settles the budget reservation, writes the attempt, result or failure rows, updates the counters
and returns the prompt to pending where the outcome says so:

- :class:`~engine.run.attempt.Completed`: the reservation is settled, the result and its attempt
  are written, the tokens counted, the reconstruction queued and a provisional cost trued up;
- :class:`~engine.run.attempt.Failed`: its failed attempts' spend is recorded (once, in the spend
  ledger) and :class:`~engine.run.failures.Failures` fails the prompt or, for a run-wide error,
  returns it to pending; the run pause it decides is applied (:func:`engine.run.guards.apply`);
- :class:`~engine.run.attempt.Aborted`: back to pending; what was streamed is counted as spent;
- :class:`~engine.run.attempt.Requeued`: back to pending; nothing was sent.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from engine.run import guards
from engine.run.attempt import Aborted, Completed, Failed, Outcome, Requeued

if TYPE_CHECKING:
    from engine.money.spend import SpendControl
    from engine.run.accounting import Accounting
    from engine.run.ending import RunEnding
    from engine.run.failures import Failures
    from engine.run.runstate import DatasetRuntime, RunState
    from engine.run.telemetry import Telemetry
    from engine.storage.store import PendingPrompt
    from engine.storage.writer import StoreWriter

log = logging.getLogger("engine.run.scheduler")


class Outcomes:
    """Applies the outcomes of one run's requests (see the module docstring).

    Args:
        run: the run state (counters, requeue, the end).
        spend: the money ledger (reservations settled or released).
        accounting: costs (partial spend, true-ups) and the reconstruction service.
        telemetry: per-provider costs, the anomaly guard's windows, samples.
        writer: the run's store writer (attempts, results).
        ending: the abort estimates of streams cut before their generation id.
        failures: what happens to a prompt whose request failed.
        pausable: where guard pauses are applied (:func:`engine.run.guards.apply`).
        clock: monotonic clock in seconds.
    """

    def __init__(self, run: "RunState", spend: "SpendControl", accounting: "Accounting", telemetry: "Telemetry",
                 writer: "StoreWriter", ending: "RunEnding", failures: "Failures", pausable: guards.Pausable,
                 clock: Callable[[], float]) -> None:
        self.run = run
        self.spend = spend
        self.accounting = accounting
        self.telemetry = telemetry
        self.writer = writer
        self.ending = ending
        self.failures = failures
        self.pausable = pausable
        self.clock = clock

    def apply(self, rt: "DatasetRuntime", p: "PendingPrompt", res: Any, outcome: Outcome) -> None:
        """Apply ``outcome`` of prompt ``p`` of ``rt`` (budget reservation ``res``)."""
        if isinstance(outcome, Completed):
            self._completed(rt, p, res, outcome)
        elif isinstance(outcome, Failed):
            self.spend.release(rt.name, res, outcome.spent.tokens, outcome.spent.usd)
            self.run.unblock()
            guards.apply(self.pausable, self.failures.on_failure(rt, p, outcome.error, outcome.at.attempts))
        elif isinstance(outcome, Aborted):
            self._aborted(rt, p, res, outcome)
        elif isinstance(outcome, Requeued):
            self.spend.release(rt.name, res, outcome.spent.tokens, outcome.spent.usd)
            self.writer.set_attempts(p.id, outcome.at.attempts)
            self.run.return_to_pending(rt, p, outcome.at.attempts)
            self.run.unblock()

    def _aborted(self, rt: "DatasetRuntime", p: "PendingPrompt", res: Any, o: Aborted) -> None:
        """Aborted: back to pending; the cut stream's bill is counted as spent. With a generation id
        and ``/generation``, its estimated bill (what it generated plus its provider's observed share
        of the rest: a provider that keeps generating after a disconnect bills the completion in
        full) is accounted at once and trued up when ``/generation`` answers; a stream cut before its
        generation id arrived can never be trued up: once aborted streams' bills were observed, its
        estimated bill is accounted, before that what it generated (a lower bound)."""
        progress, at = o.progress, o.at
        cut = self.ending.abort_cost(rt.name, p.cls, progress, p.est_prompt_tokens)
        tok, usd, estimated = self.accounting.partial_spend(rt, progress, p.est_prompt_tokens, progress.provider, cut)
        self.telemetry.on_cost(progress.provider, usd, self.clock())
        self.writer.add_attempt(p.id, rt.name, at.attempts, at.started, time.time(), "aborted",
                                provider=progress.provider or None, generation_id=progress.generation_id or None,
                                tokens_received=tok, cost_usd=usd if usd or estimated else None, estimated=estimated)
        self.spend.release(rt.name, res, o.spent.tokens + tok, o.spent.usd + usd)
        self.writer.set_attempts(p.id, at.attempts)
        self.run.return_to_pending(rt, p, at.attempts)
        self.run.unblock()

    def _completed(self, rt: "DatasetRuntime", p: "PendingPrompt", res: Any, o: Completed) -> None:
        """The request completed: settle its reservation, record the result and its attempts."""
        acc, spent, at = o.accounted, o.spent, o.at
        attempts = at.attempts
        u = acc.usage
        received, c = o.completion, dataclasses.replace(o.completion, usage=u)
        self.spend.settle(rt.name, res, u.prompt_tokens, u.completion_tokens, u.cost_usd, billed=acc.cost_billed)
        if spent.tokens or spent.usd:
            self.spend.add_partial(rt.name, spent.usd, tokens=spent.tokens)  # earlier failed attempts of this prompt
        self.writer.add_attempt(p.id, rt.name, attempts, at.started, time.time(), "ok", provider=c.provider,
                                generation_id=c.generation_id, cost_usd=u.cost_usd)
        self.writer.add_result(p.id, rt.name, p.key, c, attempts, usage_source=acc.source, usage_claimed=acc.claimed)
        recon = self.accounting.recon
        if acc.implausible:  # figures not believed are no billed figure to check the rebuilt lengths against
            received = dataclasses.replace(received, usage=dataclasses.replace(received.usage, prompt_tokens=0,
                                                                               completion_tokens=0, reasoning_tokens=0))
        if recon is not None:  # the response as received: only billed figures are checked against
            try:
                recon.submit(p.id, rt.name, p.key, p.messages, p.tools, received)
            except Exception:  # the result is stored; `datagen validate` rebuilds it
                log.exception("[%s] reconstruction of %s could not be queued", rt.name, p.key)
        if acc.provisional and c.generation_id and self.accounting.get_json is not None:
            self.accounting.trueup_result(rt, p.id, c.generation_id, acc, c.provider)
        now = self.clock()
        rt.in_flight -= 1
        rt.done += 1
        rt.prompt_tokens += u.prompt_tokens
        rt.completion_tokens += u.completion_tokens
        rt.reasoning_tokens += u.reasoning_tokens
        rt.rate.add(now)
        rt.chars_per_token.observe(len(c.reasoning) + len(c.content) + sum(len(t.arguments) for t in c.tool_calls),
                                   u.completion_tokens)
        self.run.rate.add(now)
        last = p.messages[-1].get("content") if p.messages else ""
        guards.apply(self.pausable, guards.anomaly(rt, self.telemetry.on_success(
            rt.name, p.key, last if isinstance(last, str) else "", c, now, seq=at.seq)))
        self.failures.on_success()  # a success: held 4xx are the prompts' own
        self.run.unblock()
        self.run.check_finished()


__all__ = ["Outcomes"]
