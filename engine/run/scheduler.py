"""The dispatch core: datasets in config order, per-class concurrency, bounded prefetch, retries.

How work flows:

- One dispatcher coroutine per request class. It takes a slot from the class's
  :class:`~engine.run.limiter.AdjustableLimiter`, picks the first dataset in config order that has
  dispatchable prompts of that class, takes the next prompt from a small prefetch buffer (pages of
  ``PAGE`` rows read by id cursor from the store) and starts one task for it. So the number of
  tasks equals the requests in flight, never the number of prompts, and memory stays flat with
  80,000 prompts. When a dataset runs out of prompts to dispatch, the next one starts at once while
  the previous one's tail drains.
- A request task (:func:`engine.run.attempt.run_request`) runs the attempts (:func:`engine.client.retry.call_with_retries`),
  releases its slot and returns one outcome, which :class:`~engine.run.outcomes.Outcomes` applies
  (the result or failure queued on the :class:`~engine.storage.writer.StoreWriter`). A prompt stays
  ``pending`` in the store until its result is committed, so a crash only ever re-requests prompts
  whose result was not stored.
- Errors of the account, the route or the config (401, 402, 404 "No endpoints found", the same 4xx
  on the first few prompts) pause the whole run with the reason and leave the prompt pending
  (:mod:`engine.run.failures`, rules in :mod:`engine.run.runwide`); other 400/403 fail the prompt with the
  reason; transient errors are retried with backoff up to ``run.max_attempts`` and then fail the
  prompt with the last reason.

All mutable state lives on the event loop, in the run state (:mod:`engine.run.runstate`);
:meth:`Scheduler.snapshot` returns an immutable copy. The scheduler's collaborators are public and
called directly: ``ending`` (stop, abort, drain, dollars in flight), ``failures`` (retry-failed),
``routing`` (the request body, excluded providers), ``outcomes``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import os
import time
from typing import Any, Callable

from engine.client.retry import RetryPolicy
from engine.config import Config
from engine.money.spend import SpendControl
from engine.report.snapshot import RunSnapshot
from engine.report.statusserver import StatusServer, persisted_elapsed
from engine.run import guards
from engine.run.accounting import Accounting
from engine.run.attempt import Aborted, run_request
from engine.run.ending import RunEnding
from engine.run.failures import Failures
from engine.run.limiter import AdjustableLimiter
from engine.run.observe import build_snapshot, engine_status, live_row, run_elapsed_s
from engine.run.outcomes import Outcomes
from engine.run.routing import Routing
from engine.run.runstate import (
    PERSISTED_CONTROLS,
    TERMINAL_CONTROLS,
    Control,
    DatasetRuntime,
    PauseKind,
    RunPhase,
    RunState,
)
from engine.run.seams import CompleteFn, EndpointsFn, GetJsonFn, Reconstructor, WorkersFn
from engine.run.telemetry import Telemetry
from engine.storage.store import PendingPrompt, Store
from engine.storage.writer import StoreWriter

log = logging.getLogger(__name__)

#: Prompts read from the store per page, per (dataset, class).
PAGE = 256
#: Seconds between refreshes of a dataset's in-flight (censored) lengths while dispatching.
CENSOR_EVERY_S = 0.25


class _OnRunState:
    """A :class:`Scheduler` attribute kept on its :class:`~engine.run.runstate.RunState` (``field``)."""

    def __init__(self, field_name: str) -> None:
        self.field = field_name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else getattr(obj.runstate, self.field)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj.runstate, self.field, value)


class Scheduler:
    """Runs one generation job over a prepared store.

    Args:
        cfg: validated config.
        store: the run's open store, already ingested.
        writer: the batched writer for ``store``.
        complete: coroutine function doing ONE attempt: ``complete(req, progress) -> Completion``,
            raising :class:`~engine.client.types.RequestError` (normally ``ChatClient.complete``).
        policy: retry timing (attempts, backoff).
        clock: monotonic clock in seconds (injectable for tests).
        get_json: ``get_json(path, params)`` of the provider, for late costs of failed attempts and
            ``/generation`` true-ups (None: estimate).
        recon: token reconstruction service (:class:`~engine.run.seams.Reconstructor`) or None.
        endpoints: with several endpoints (``[provider] base_urls``), their figures now
            (:meth:`engine.client.fleet.EndpointFleet.snapshot`), for snapshots; None with one.
        workers: the stream workers' figures now (:meth:`engine.stream.pool.StreamWorkerPool.figures`),
            for snapshots; None when ``complete`` is not a pool's (tests).
        hold: ``hold(run, datasets)`` of the stream workers (:meth:`engine.stream.pool.StreamWorkerPool.hold`):
            called with the hold state in the same step that pauses, resumes, skips or reactivates,
            so the requests handed to a worker and not sent yet are held back too; None: no workers.
    """

    # The run state's fields under the names callers use (kept on self.runstate).
    datasets = _OnRunState("datasets")
    state_reason = _OnRunState("reason")
    exit_code = _OnRunState("exit_code")
    excluded_providers = _OnRunState("excluded_providers")

    @property
    def state(self) -> RunPhase:
        """The run's shown state (:attr:`engine.run.runstate.RunState.phase`; read only)."""
        return self.runstate.phase

    @property
    def run_paused(self) -> bool:
        """Dispatch is paused run-wide (read from ``runstate.pause``)."""
        return self.runstate.paused

    @property
    def pause_kind(self) -> str:
        """Who paused the run ("" when not paused; read from ``runstate.pause``)."""
        return self.runstate.pause_kind

    def __init__(
        self,
        cfg: Config,
        store: Store,
        writer: StoreWriter,
        complete: CompleteFn,
        policy: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        get_json: GetJsonFn | None = None,
        recon: Reconstructor | None = None,
        endpoints: EndpointsFn | None = None,
        workers: WorkersFn | None = None,
        hold: Callable[[bool, frozenset[str]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.writer = writer
        #: ONE attempt: ``complete(req, progress) -> Completion`` (engine.run.attempt).
        self.complete = complete
        self.policy = policy or RetryPolicy(max_attempts=cfg.run.max_attempts)
        self.clock = clock
        #: the run's shared mutable state (phase, pause, per-dataset counters): engine.run.runstate.
        self.runstate = RunState(t0=clock())
        self.limiters = {name: AdjustableLimiter(c.concurrency) for name, c in cfg.classes.items()}
        self.on_event: Callable[[str, str, str | None, str], None] | None = None
        self.spend = SpendControl(cfg)
        self.telemetry = Telemetry(cfg.spend.anomaly_error_rate, cfg.spend.anomaly_window)
        #: what happens to prompts whose request failed, and retry-failed (engine.run.failures).
        urls = cfg.provider.all_base_urls()
        self.failures = Failures(self.runstate, writer, store, self.telemetry, api_key_env=cfg.provider.api_key_env,
                                 reach=urls[0] if len(urls) == 1 else f"any of the {len(urls)} endpoints"
                                 if urls else "the simulator", event=self.event,
                                 stall_s=cfg.provider.timeouts.stall_s)
        self._begun: set[int] = set()
        #: the endpoints' figures (several ``base_urls``) or None (engine.client.fleet).
        self.endpoints: EndpointsFn | None = endpoints
        #: the stream workers' figures (engine.stream.pool) or None.
        self.workers: WorkersFn | None = workers
        #: the stream workers' hold (engine.stream.pool) or None.
        self.hold = hold
        #: a request's costs: results, partial spend, /generation true-ups, and the provider's ``get_json``
        #: and the reconstruction service ``recon`` (engine.run.accounting).
        self.accounting = Accounting(self.spend, self.telemetry, writer, lambda: self.clock(), get_json, recon)
        #: stop, abort, drain, and the dollars in flight (engine.run.ending).
        self.ending = RunEnding(cfg, self.runstate, self.spend, clock, self.event, on_stop=self._hold)
        #: the request body and the excluded providers (engine.run.routing).
        self.routing = Routing(cfg, self.runstate, store, self.telemetry, self.event)
        #: applies what each request ended in (engine.run.outcomes).
        self.outcomes = Outcomes(self.runstate, self.spend, self.accounting, self.telemetry, writer, self.ending,
                                 self.failures, self, lambda: self.clock())

    # ---- setup ------------------------------------------------------------------------------
    async def load(self) -> None:
        """Load counters and persisted control states from the store."""
        rows = await self.store.datasets()
        self.spend.seed_aborts(await self.store.aborted_bills())  # what providers billed for aborted streams
        counts = await self.store.state_counts()
        usage = await self.store.usage_totals()
        errors = await self.store.error_counts()
        lost = await self.store.lost_costs()
        lost_tokens = await self.store.lost_tokens()
        for name, row in (await self.store.latest_results()).items():
            self.telemetry.restore_sample(name, row)
        self.runstate.prior_elapsed_s = await self._prior_elapsed_s()
        for pos, d in enumerate(self.cfg.datasets):
            row = rows[d.name]
            rt = DatasetRuntime(d.name, pos, row["prompts"], row["rejected"], d.token_budget)
            if row["state"] in PERSISTED_CONTROLS:
                rt.control, rt.reason = Control(row["state"]), row["state_reason"]
            for cls in self.cfg.classes:
                rt.pending[cls] = counts.get((d.name, cls, "pending"), 0)
                rt.cursor[cls] = 0
                rt.buffer[cls] = collections.deque()
                rt.requeue[cls] = collections.deque()
            rt.done = sum(n for (ds, _, s), n in counts.items() if ds == d.name and s == "done")
            rt.failed = sum(n for (ds, _, s), n in counts.items() if ds == d.name and s == "failed")
            p, c, r, cost, _ = usage.get(d.name, (0, 0, 0, 0.0, 0))
            rt.prompt_tokens, rt.completion_tokens, rt.reasoning_tokens = p, c, r
            rt.errors.update(errors.get(d.name, {}))
            self.datasets[d.name] = rt
            cut = lost_tokens.get(d.name, 0)  # what streams cut or failed took of the token budget
            self.spend.seed(d.name, p, c + cut, cost + lost.get(d.name, 0.0), await self.store.recent_lengths(d.name))
            self.spend.lost_usd[d.name] = lost.get(d.name, 0.0)
        # Re-decide budget-met datasets once every dataset's spend is counted (the run cost cap is
        # shared): a cap raised since makes them active again, in the store too, so `datagen status`
        # agrees with the engine (not "run cost cap met" and every prompt skipped while it runs).
        for rt in self.datasets.values():
            if rt.control == Control.BUDGET_MET and not any(
                self.spend.budget_met(rt.name, cls) for cls in self.cfg.classes if rt.pending.get(cls)
            ):
                rt.control, rt.reason = Control.ACTIVE, ""  # the budget was raised since
                await self.store.set_dataset_state(rt.name, Control.ACTIVE, "", time.time())
        excl = await self.store.get_meta("excluded_providers")
        if excl:
            self.routing.restore(json.loads(excl))

    async def _prior_elapsed_s(self) -> float:
        """Run seconds of earlier processes: the store's runtime row, or the elapsed file a killed
        engine kept more recently (:func:`engine.report.statusserver.persisted_elapsed`), so the
        elapsed time never goes back at a restart."""
        stored = await self.store.prior_elapsed_s()
        try:
            row = await self.store.runtime_times()
        except Exception:  # a store without the row (or a test's store): the stored figure
            return stored
        if not row:
            return stored
        return persisted_elapsed(self.cfg.run.dir, row[0], row[1], stored)

    # ---- events -----------------------------------------------------------------------------
    def event(self, level: str, kind: str, dataset: str | None, message: str) -> None:
        """Record a run event in the store (batched) and the log."""
        self.writer.add_event(level, kind, dataset, message)
        getattr(log, "warning" if level == "warning" else "error" if level == "error" else "info")(
            "%s%s", f"[{dataset}] " if dataset else "", message
        )
        self.telemetry.on_event(level, dataset, message)
        if self.on_event:
            self.on_event(level, kind, dataset, message)

    # ---- dispatch ---------------------------------------------------------------------------
    def _pick(self, cls: str) -> DatasetRuntime | None:
        run = self.runstate
        if run.paused or run.stopping:
            return None
        if run.credits_wait:  # run-wide: until a request in flight settles and frees its credits hold
            if any(rt.in_flight for rt in self.datasets.values()):
                return None
            run.credits_wait = False
        for rt in self.datasets.values():
            if rt.control == Control.ACTIVE and rt.pending.get(cls, 0) > 0 and cls not in rt.blocked:
                return rt
        return None

    def _could_have_work(self, cls: str) -> bool:
        if self.runstate.stopping:
            return False
        # In-flight prompts may come back to pending (abort, 402, 401), so they count as possible work.
        return any(
            rt.control not in TERMINAL_CONTROLS and (rt.pending.get(cls, 0) > 0 or rt.in_flight > 0)
            for rt in self.datasets.values()
        )

    async def _next_prompt(self, rt: DatasetRuntime, cls: str) -> PendingPrompt | None:
        rq = rt.requeue[cls]
        if rq:
            return rq.popleft()
        buf = rt.buffer[cls]
        if not buf:
            page = await self.store.fetch_pending(rt.name, cls, rt.cursor[cls], PAGE)
            if not page:
                # Store and counters disagree (should not happen): trust the store.
                log.warning("[%s] no pending %s prompts found in store; counter was %d", rt.name, cls, rt.pending[cls])
                rt.pending[cls] = 0
                return None
            rt.cursor[cls] = page[-1].id
            buf.extend(page)
        return buf.popleft()

    async def _dispatch_class(self, cls: str) -> None:
        lim = self.limiters[cls]
        changed = self.runstate.wake[cls]
        while True:
            await lim.acquire()
            rt = self._pick(cls)
            if rt is None:
                lim.release()
                if not self._could_have_work(cls):
                    return
                changed.clear()
                await changed.wait()
                continue
            p = await self._next_prompt(rt, cls)
            if p is None:
                lim.release()
                continue
            if not self.may_send(rt):  # changed while fetching
                rt.requeue[cls].appendleft(p)
                lim.release()
                continue
            now = self.clock()
            if now - rt.censored_at >= CENSOR_EVERY_S:  # in-flight lengths feed the reservation percentile
                rt.censored_at = now
                self._censor(rt)
            try:
                res = self.spend.reserve(rt.name, cls, p.est_prompt_tokens)
            except Exception as e:  # credits floor (checked before dispatch), or a dollar cap
                rt.requeue[cls].appendleft(p)  # with no price: the request stays pending, never spend blind
                lim.release()
                guards.apply(self, guards.reserve_refused(e))
                continue
            if res is None:
                rt.requeue[cls].appendleft(p)
                lim.release()
                if self.spend.credits_waiting:  # credits left above the floor are held in flight: wait for them
                    self.runstate.credits_wait = True
                    continue
                reason = self.spend.budget_met(rt.name, cls, p.est_prompt_tokens)
                if not reason and self.runstate.in_flight() == 0:
                    # refused with nothing in flight anywhere: no reservation can settle, it never fits
                    reason = self.spend.refusal_reason(rt.name, cls, p.est_prompt_tokens)
                if reason:
                    await self._budget_met(rt, reason)
                else:
                    rt.blocked.add(cls)  # wait for in-flight reservations to settle
                    rt.limited_at[cls] = self.clock()
                continue
            rt.pending[cls] -= 1
            rt.in_flight += 1
            if not rt.started:
                rt.started = True
                rt.rate.start(self.clock())
                rt.tok_rate.start(self.clock())
                self.telemetry.usd_rate.start(self.clock())  # the spend rate counts from the first dispatch
                self.telemetry.tok_rate.start(self.clock())  # so does the token rate
            task = asyncio.get_running_loop().create_task(self._request(rt, p, lim, res))
            rt.tasks.add(task)
            task.add_done_callback(functools.partial(self._task_done, rt=rt, p=p, lim=lim, res=res))

    async def _request(self, rt: DatasetRuntime, p: PendingPrompt, lim: AdjustableLimiter, res: Any) -> None:
        """A prompt's request task: its attempts (:func:`engine.run.attempt.run_request`), then its
        outcome applied (:meth:`engine.run.outcomes.Outcomes.apply`); an abort's cancellation goes on."""
        self._begun.add(p.id)
        outcome = await run_request(self, rt, p, self.routing.request_for(p), lim, res)
        self.outcomes.apply(rt, p, res, outcome)
        if isinstance(outcome, Aborted) and outcome.cancelled:
            raise asyncio.CancelledError

    def may_send(self, rt: DatasetRuntime) -> bool:
        """Whether a request of ``rt`` may leave now: the run is not paused or stopping and the
        dataset is active (a retry checks it too: a pause means no request leaves)."""
        return rt.control == Control.ACTIVE and not self.runstate.paused and not self.runstate.stopping

    def anomaly(self, rt: DatasetRuntime, reason: str | None) -> None:
        """Pause ``rt`` when the anomaly guard fired (``reason``) and it is still active (:func:`engine.run.guards.anomaly`)."""
        guards.apply(self, guards.anomaly(rt, reason))

    async def _budget_met(self, rt: DatasetRuntime, reason: str) -> None:
        if rt.control != Control.ACTIVE:
            return
        await self.set_dataset_control(rt.name, Control.BUDGET_MET, reason)
        if self.cfg.spend.on_budget == "abort":
            self.ending.abort(rt.name)

    def _task_done(self, t: asyncio.Task, rt: DatasetRuntime, p: PendingPrompt, lim: AdjustableLimiter,
                   res: Any) -> None:
        rt.tasks.discard(t)
        if p.id in self._begun:
            self._begun.discard(p.id)
            return
        # Cancelled before its first step (an abort right after dispatch): undo the dispatch.
        lim.release()
        self.spend.release(rt.name, res)
        self.runstate.return_to_pending(rt, p, p.attempts)
        self.runstate.unblock()

    def update_censored(self) -> None:
        """Give each dataset+class estimator the tokens streamed so far by its in-flight requests
        (right-censored lengths, see :meth:`engine.money.estimator.CompletionEstimator.set_censored`)."""
        for rt in self.datasets.values():
            self._censor(rt)

    def _censor(self, rt: DatasetRuntime) -> None:
        by_cls: dict[str, list[float]] = {c: [] for c in self.cfg.classes}
        streamed = 0.0
        for cls, prog, _est in rt.streams.values():
            got = prog.tokens_received
            by_cls[cls].append(got)
            streamed += got
        for cls, vals in by_cls.items():
            self.spend.budgets[rt.name].estimators[cls].set_censored(vals)
        self.spend.refresh(rt.name)
        now = self.clock()
        delta = rt.note_streamed(now, streamed)  # the rates count tokens as they stream
        if delta:
            self.telemetry.tok_rate.add(now, delta)

    # ---- control (used by engine.run.controller) ----------------------------------------------
    def pause_all(self, reason: str, kind: PauseKind | str = PauseKind.USER) -> None:
        """Stop dispatching everywhere; in-flight requests finish and are saved (drain).

        ``kind`` says which guard paused (:class:`~engine.run.runstate.PauseKind`: ``pause`` = the user,
        ``credits``, ``price``...).
        """
        kind = PauseKind(kind)
        self.runstate.set_pause(kind, reason)
        self._hold()
        self.event("warning", str(kind), None, f"run paused: {reason}")
        if kind != PauseKind.USER:
            self.telemetry.notice(f"run paused by a guard: {reason}. Resume: R in the dashboard, or "
                                  f"datagen ctl {self.cfg.run.dir} resume")

    def resume_all(self) -> None:
        """Resume dispatching (datasets paused individually stay paused)."""
        self.runstate.set_pause(None, "")
        self._hold()
        self.failures.on_resume()
        self.event("info", "resume", None, "run resumed")
        self.runstate.notify()

    async def set_dataset_control(self, name: str, control: str, reason: str, guard: bool = False) -> None:
        """Set a dataset's control state (``active`` | ``paused`` | ``skipped``) and persist it.

        ``guard``: a guard (anomaly guard, calibration gate), not the user, made the change: it is
        logged at WARNING and announced (:meth:`engine.run.telemetry.Telemetry.notice`).
        """
        rt = self.datasets[name]
        rt.control, rt.reason = Control(control), reason
        self._hold()
        await self.store.set_dataset_state(name, control, reason, time.time())
        self.event("warning" if guard else "info", control, name,
                   f"dataset {control}" + (f": {reason}" if reason else ""))
        if guard:
            self.telemetry.notice(f"[{name}] {control} by a guard: {reason}. Resume: p on the dataset in the "
                                  f"dashboard, or datagen ctl {self.cfg.run.dir} resume {name}")
        self.runstate.notify()
        self.runstate.check_finished()

    def _hold(self) -> None:
        """Tell the stream workers what may not leave now (:attr:`hold`): every request while the run
        is paused or stopping (a drain waits for the streams in flight, it sends nothing new), else
        those of the datasets not active (paused, skipped, budget met). Called in the step that flips
        the state, before anything reads it: no request handed to a worker leaves unsent once the
        pause or the stop shows."""
        if self.hold is not None:
            self.hold(self.runstate.paused or self.runstate.stopping,
                      frozenset(rt.name for rt in self.datasets.values() if rt.control != Control.ACTIVE))

    # ---- running ----------------------------------------------------------------------------
    async def run(self) -> int:
        """Dispatch until every dataset is done/skipped, or the run is stopped. Returns an exit code."""
        if not self.datasets:
            await self.load()
        self._hold()  # the states loaded (a dataset paused by an earlier process)
        self.runstate.lifecycle = RunPhase.RUNNING  # shown as paused while runstate.pause holds
        self.runstate.check_finished()
        # `datagen status` asks this engine for its own figures while it runs (engine.report.statusserver)
        status = StatusServer(self.cfg.run.dir, lambda: engine_status(self), self._runtime_fields)
        await status.start()
        dispatchers = []
        for cls in self.cfg.classes:
            self.runstate.wake[cls] = asyncio.Event()
            dispatchers.append(asyncio.create_task(self._dispatch_class(cls), name=f"dispatch-{cls}"))
        try:
            await self._run_until_done(dispatchers)
        finally:
            await status.close()
        if self.runstate.lifecycle == RunPhase.STOPPING:
            self.runstate.lifecycle = RunPhase.STOPPED
        return self.exit_code

    async def _run_until_done(self, dispatchers: list[asyncio.Task]) -> None:
        """Wait for the run's end, then stop the dispatchers, the requests left and the true-ups."""
        try:
            await self.runstate.done.wait()
        finally:
            self.runstate.stopping = True
            self.runstate.notify()
            for d in dispatchers:
                d.cancel()
            await asyncio.gather(*dispatchers, return_exceptions=True)
            tasks = [t for rt in self.datasets.values() for t in rt.tasks]
            if tasks:
                for t in tasks:
                    t.cancel()
                await asyncio.wait(tasks, timeout=10)  # bounded: a request ignoring cancellation cannot hang exit
            if self.ending.ender is not None:
                self.ending.ender.cancel()
            self.failures.release_held()
            # late costs of failed/aborted attempts (/generation): a few seconds in all, then cancelled
            # (the estimates left are trued up at the next start), so none outlives the HTTP client
            await self.accounting.settle()

    # ---- snapshot ---------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        """Run seconds: this process's time plus what earlier processes of the run accumulated."""
        return self.runstate.elapsed_s(self.clock())

    def _runtime_fields(self) -> dict[str, Any]:
        """The elapsed file's fields (:class:`engine.report.statusserver.StatusServer`): pid,
        ``started_at`` (epoch s, as the runtime row's), ``elapsed_s`` (s) and state."""
        return {"pid": os.getpid(), "started_at": self.runstate.started_wall, "elapsed_s": run_elapsed_s(self),
                "state": str(self.state)}

    def live(self) -> dict[str, Any]:
        """Fields of the store's ``runtime`` row (see :func:`engine.run.observe.live_row`)."""
        return live_row(self)

    def snapshot(self) -> RunSnapshot:
        """Return an immutable snapshot of the run (see :func:`engine.run.observe.build_snapshot`)."""
        return build_snapshot(self)
