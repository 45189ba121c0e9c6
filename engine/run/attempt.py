"""The lifecycle of one prompt's request: attempts with retries, then exactly one outcome.

:func:`run_request` runs from the dispatcher's task for a prompt (:class:`engine.run.scheduler.Scheduler`
takes the class's concurrency slot and the budget reservation before it starts it) and returns one
:data:`Outcome` value, which the run applies (:class:`engine.run.outcomes.Outcomes`):

- :class:`Completed`: the response is accounted (:meth:`engine.run.accounting.Accounting.account`:
  usage, counted or estimated);
- :class:`Failed`: the retries are spent, the error is final, or the code hit a bug (an unexpected
  exception costs one prompt, never the run: it fails as ``other`` with ``internal error: ...``);
  the spend of the failed attempts is recorded once;
- :class:`Aborted` (``cancelled``): what was streamed is counted as spent and the prompt returns to
  pending; once that is applied the cancellation goes on (the task ends cancelled);
- returned to pending without a failed attempt: the stream worker holding the stream died
  (:class:`~engine.stream.wire.StreamWorkerLost`: an :class:`Aborted` not ``cancelled``, what it had
  streamed is counted), or the request was held before it was sent (:class:`Requeued`): an attempt,
  first or retry, due while the run or the dataset is paused, skipped or stopping, or one the stream
  workers held back unsent (:class:`~engine.stream.wire.StreamHeld`: the pause came after it was
  handed to a worker, before its first byte left). Nothing is sent and no attempt is counted: a
  pause means no request leaves, queued ones and retries included.

The slot is released in ONE place, the ``finally`` around the attempts, whatever the outcome (a
task cancelled before it ever started is undone by the dispatcher's done-callback instead). Every
failed attempt is written as an attempt row with its partial spend (tokens, USD: a lower bound,
trued up later from ``/generation`` when its generation id is known), feeds the anomaly guard
unless the error is the run's (:mod:`engine.run.runwide`), an endpoint's (several
``base_urls``: ``RequestError.endpoint_fault``) or OpenRouter's ``weight_exceeds_budget`` 402
(whose message is completed with the request's class and the ``max_tokens`` that would fit:
:func:`engine.client.errors.for_request`), and retries follow ``policy``
(:func:`engine.client.retry.call_with_retries`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from engine.client.accumulate import StreamProgress
from engine.client.errors import for_request as budget_error_for_request
from engine.client.errors import is_weight_exceeds_budget
from engine.client.retry import RetryPolicy, call_with_retries
from engine.client.types import Completion, ErrorClass, RequestError
from engine.errors import DatagenError
from engine.money.plausible import completion_budget
from engine.stream.wire import StreamHeld, StreamWorkerLost

if TYPE_CHECKING:
    from engine.client.types import ChatRequest
    from engine.money.spend import SpendControl
    from engine.money.usage import Accounted
    from engine.run.accounting import Accounting
    from engine.run.failures import Failures
    from engine.run.limiter import AdjustableLimiter
    from engine.run.runstate import DatasetRuntime
    from engine.run.telemetry import Telemetry
    from engine.storage.store import PendingPrompt
    from engine.storage.writer import StoreWriter

log = logging.getLogger("engine.run.scheduler")


class _Requeue(DatagenError):
    """Ends the attempts of a request and returns its prompt to pending (not a :class:`RequestError`,
    so the retry loop neither records nor retries it). ``lost``: the stream worker died mid-stream
    (its streamed spend is counted); else the request was held back unsent by a pause or skip."""

    def __init__(self, lost: StreamWorkerLost | None = None) -> None:
        super().__init__("returned to pending")
        self.lost = lost


@dataclass
class Spent:
    """Tokens and USD billed for the failed attempts of one request so far (a lower bound)."""

    tokens: int = 0
    usd: float = 0.0


@dataclass
class AttemptClock:
    """Per attempt: its wall-clock start (s since the epoch), its count, and its dispatch sequence
    number for the anomaly guard (:mod:`engine.run.anomaly`)."""

    attempts: int
    started: float = 0.0
    seq: int = 0


@dataclass(frozen=True)
class Completed:
    """The request completed: ``completion`` as received, ``accounted`` its usage and cost."""

    completion: Completion
    accounted: "Accounted"
    spent: Spent
    at: AttemptClock


@dataclass(frozen=True)
class Failed:
    """The request failed for good with ``error`` after ``at.attempts`` attempts."""

    error: RequestError
    spent: Spent
    at: AttemptClock


@dataclass(frozen=True)
class Aborted:
    """The stream was cut: the task was cancelled (``cancelled``: an abort; the cancellation goes on
    once this is applied) or the stream worker holding it died; ``progress`` is what it had streamed."""

    progress: StreamProgress
    spent: Spent
    at: AttemptClock
    cancelled: bool = True


@dataclass(frozen=True)
class Requeued:
    """The request was held back (paused, skipped or stopping) before it was sent: nothing left, no
    attempt is counted; the prompt is pending again."""

    spent: Spent
    at: AttemptClock


#: What :func:`run_request` ends in.
Outcome = Completed | Failed | Aborted | Requeued


class AttemptHost(Protocol):
    """What :func:`run_request` needs of the run (:class:`engine.run.scheduler.Scheduler` fits it):
    public members only; the outcome is returned, not handed back through the host."""

    spend: "SpendControl"
    telemetry: "Telemetry"
    writer: "StoreWriter"
    policy: RetryPolicy
    clock: Callable[[], float]
    accounting: "Accounting"
    failures: "Failures"
    complete: Any

    def may_send(self, rt: "DatasetRuntime") -> bool: ...
    def anomaly(self, rt: "DatasetRuntime", reason: str | None) -> None: ...


async def run_request(host: AttemptHost, rt: "DatasetRuntime", p: "PendingPrompt", req: "ChatRequest",
                      lim: "AdjustableLimiter", res: Any) -> Outcome:
    """Run prompt ``p``'s request ``req`` to one outcome (see the module docstring), holding one slot
    of ``lim`` and the budget reservation ``res`` until then; the caller applies the outcome (and,
    for an :class:`Aborted` that was ``cancelled``, lets the cancellation go on)."""
    progress = StreamProgress(rt.chars_per_token)
    spent = Spent()
    at = AttemptClock(p.attempts, started=time.time())
    rt.streams[p.id] = (p.cls, progress, p.est_prompt_tokens)
    host.spend.track(rt.name, res, progress)
    try:
        try:
            c = await call_with_retries(_one_attempt(host, rt, req, progress, at, p.cls), host.policy,
                                        on_attempt=_on_attempt(host, rt, p, spent, at))
        except asyncio.CancelledError:
            host.telemetry.attempt_over(rt.name, at.seq)
            return Aborted(progress, spent, at)
        except _Requeue as rq:
            if rq.lost is not None:  # the worker died: what it streamed is spent, the prompt goes back
                host.telemetry.attempt_over(rt.name, at.seq)
                return Aborted(progress, spent, at, cancelled=False)
            return Requeued(spent, at)
        except RequestError as e:
            return Failed(e, spent, at)
        except Exception as e:  # a bug must cost one prompt, not the run
            host.telemetry.attempt_over(rt.name, at.seq)
            log.exception("[%s] unexpected error on prompt %s", rt.name, p.key)
            return Failed(RequestError(ErrorClass.OTHER, f"internal error: {type(e).__name__}: {e}"), spent, at)
        else:
            # tokens and cost even when the response carried no usage, or one not to be believed
            acc = await host.accounting.account(p, c, completion_budget(req.max_tokens, req.body))
    finally:
        lim.release()
        rt.streams.pop(p.id, None)
    return Completed(c, acc, spent, at)


def _one_attempt(host: AttemptHost, rt: "DatasetRuntime", req: "ChatRequest", progress: StreamProgress,
                 at: AttemptClock, cls: str) -> Callable[[], Any]:
    async def one_attempt() -> Completion:
        if not host.may_send(rt):
            # paused, skipped or stopping since it was dispatched (a first attempt whose task ran after
            # the flip) or since its last attempt failed (a retry): nothing leaves
            raise _Requeue()
        at.attempts += 1
        at.started = time.time()
        progress.chars_received = 0
        at.seq = host.telemetry.dispatched(rt.name)
        try:
            c = await host.complete(req, progress=progress)
        except StreamWorkerLost as e:
            raise _Requeue(e) from None
        except StreamHeld:  # a pause or skip reached the stream worker before the request's first byte left
            at.attempts -= 1
            host.telemetry.attempt_over(rt.name, at.seq)
            raise _Requeue() from None
        except RequestError as e:  # a request too expensive for the in-flight budget: name its class and fit
            budget_error_for_request(e, req.max_tokens, cls)
            raise
        host.anomaly(rt, host.telemetry.attempt_ok(rt.name, at.seq))
        return c

    return one_attempt


def _on_attempt(host: AttemptHost, rt: "DatasetRuntime", p: "PendingPrompt", spent: Spent,
                at: AttemptClock) -> Callable[[int, BaseException | None, float | None], None]:
    def on_attempt(n: int, err: BaseException | None, wait_s: float | None) -> None:
        now = time.time()
        if err is None or not isinstance(err, RequestError):
            return
        rt.errors[err.error_class.value] += 1
        tok, usd, estimated = host.accounting.partial_spend(rt, err, p.est_prompt_tokens, err.provider)
        host.telemetry.on_cost(err.provider, usd, host.clock())
        spent.tokens += tok
        spent.usd += usd
        host.writer.add_attempt(
            p.id, rt.name, at.attempts, at.started, now, "error", err.error_class.value, err.status or None,
            err.message, err.provider or None, err.generation_id or None, err.tokens_received,
            usd if usd or estimated else None, estimated,
        )
        # an endpoint's fault (several base_urls: a replica unreachable or gone) says nothing about the dataset,
        # nor does a request too expensive for OpenRouter's in-flight budget (refused before any provider saw it)
        guard = host.failures.run_wide(err) is None and not err.endpoint_fault and not is_weight_exceeds_budget(err)
        host.anomaly(rt, host.telemetry.on_error(rt.name, err.provider, err.error_class.value, err.message,
                                                  guard=guard, seq=at.seq))

    return on_attempt


__all__ = ["Aborted", "AttemptClock", "AttemptHost", "Completed", "Failed", "Outcome", "Requeued", "Spent", "run_request"]
