"""The engine's command surface: the live target of every command (the dashboard's keys, ``datagen ctl``).

Commands arrive as :class:`~engine.run.commands.RunCommand` values through :meth:`Controller.apply`
(:func:`engine.run.commands.apply`, the one command path). Every per-verb method validates its
arguments (unknown dataset or class -> ``ValueError`` naming it and the valid choices), acts on the
event loop at once, and returns a short human-readable result.
"""

from __future__ import annotations

import asyncio
import time

from engine.report.snapshot import RunSnapshot
from engine.run import commands
from engine.run.commands import CommandResult, RunCommand
from engine.run.ctl import no_verdict_to_clear, resolve_provider
from engine.run.limiter import check_concurrency, concurrency_cap
from engine.run.runstate import Control, PauseKind, RunPhase
from engine.run.scheduler import Scheduler
from engine.run.seams import CreditsCheck
from engine.storage import verdicts
from engine.storage.handle import connect_rw


class Controller:
    """Commands on a running :class:`~engine.run.scheduler.Scheduler`.

    Pause = drain (stop dispatching; in-flight requests finish and are saved). Skip = the
    dataset's pending prompts count as skipped (in-flight ones drain unless ``abort``). Abort =
    cancel in-flight streams now; their prompts return to pending. Paused and skipped states are
    persisted in the store, so a restart honours them.

    Args:
        scheduler: the run's scheduler.
        credits_check: re-reads the credits before a credits pause is lifted (None: resume at once).
    """

    def __init__(self, scheduler: Scheduler, credits_check: CreditsCheck | None = None) -> None:
        self._s = scheduler
        self._run = scheduler.runstate  # states are read here; changes go through the scheduler
        self.credits_check = credits_check

    async def apply(self, cmd: RunCommand) -> CommandResult:
        """Apply ``cmd`` to the running engine (:func:`engine.run.commands.apply`)."""
        return await commands.apply(cmd, self)

    async def exclude_provider(self, name: str) -> str:
        """Stop routing new requests to provider ``name`` (added to ``provider.ignore``; persisted)."""
        if not name:
            raise ValueError("provider name is empty")
        await self._s.routing.exclude(name)
        return f"provider {name} excluded"

    async def include_provider(self, name: str) -> str:
        """Route new requests to an excluded provider again (undoes :meth:`exclude_provider`; persisted).

        Raises:
            ValueError: ``name`` is not excluded (the message lists the excluded ones).
        """
        excluded = list(self._run.excluded_providers)
        if not excluded:
            raise ValueError(f"provider {name!r} is not excluded: no provider is excluded")
        name = resolve_provider(name, excluded, what="excluded provider")
        await self._s.routing.include(name)
        return f"provider {name} included again"

    async def clear_verdict(self, name: str) -> str:
        """Clear provider ``name``'s ``drifting`` fidelity verdict (persisted): its records count again, and a
        provider the drift excluded is routed to again.

        Raises:
            ValueError: ``name`` has no drifting verdict (the message names the ones that do).
        """
        run_dir = self._s.cfg.run.dir

        def clear() -> tuple[int, bool, list[str]]:
            with connect_rw(run_dir, any_thread=True) as h:
                n, excluded = verdicts.clear_provider(h, name, time.time())
                return n, excluded, verdicts.drifting_names(h)

        n, excluded, drifting = await asyncio.to_thread(clear)
        if not n:
            raise ValueError(no_verdict_to_clear(name, drifting))
        also = ""
        if excluded and name in self._run.excluded_providers:
            await self._s.routing.include(name)
            also = " and included again"
        return f"provider {name}: drifting verdict cleared{also}: its records count again"

    def dollars_in_flight(self, dataset: str | None = None) -> float:
        """Expected USD of the requests in flight, of ``dataset`` or of the run (what they cost when
        completed; see :mod:`engine.money.inflight`)."""
        return self._s.ending.cost_in_flight_usd(dataset)

    def snapshot(self) -> RunSnapshot:
        """Immutable snapshot of the engine (see :mod:`engine.report.snapshot`)."""
        return self._s.snapshot()

    def _ds(self, name: str) -> str:
        if name not in self._run.datasets:
            raise ValueError(f"unknown dataset {name!r}; expected one of: {', '.join(self._run.datasets)}")
        return name

    def _refuse_when_ending(self, verb: str, dataset: str | None) -> None:
        """Refuse a change of dataset state (pause, resume, skip, un-skip; a run-wide pause or resume)
        once the run is stopping, stopped or completed: keys typed while a run exits are not
        decisions, and a pause or skip applied then would be stored and carried into the next start.

        Raises:
            ValueError: an unknown dataset (said first), or the run is ending (one line, saying what to
                do instead).
        """
        if dataset is not None:
            self._ds(dataset)
        r = self._run
        if r.stopping or r.done.is_set() or r.lifecycle in (RunPhase.STOPPING, RunPhase.STOPPED, RunPhase.COMPLETED):
            state = "completed" if r.lifecycle == RunPhase.COMPLETED else "stopping"
            raise ValueError(f"the run is {state}: {verb} {dataset or 'of the run'} refused (dataset states no longer "
                             f"change while it ends; once it has exited, `datagen ctl RUN_DIR {verb} DATASET` "
                             f"saves one for the next start)")

    async def pause(self, dataset: str | None = None, reason: str = "paused by user") -> str:
        """Pause one dataset, or the whole run when ``dataset`` is None.

        Raises:
            ValueError: unknown dataset, or the run is ending (:meth:`_refuse_when_ending`).
        """
        self._refuse_when_ending("pause", dataset)
        if dataset is None:
            self._s.pause_all(reason)
            return "run paused (in-flight requests drain)"
        await self._s.set_dataset_control(self._ds(dataset), "paused", reason)
        return f"{dataset} paused"

    async def resume(self, dataset: str | None = None) -> str:
        """Resume one dataset (paused, skipped or budget_met), or the whole run when ``dataset`` is None:
        the run's pause and every paused dataset (by the user or a guard: "resume all"; skipped and
        budget-met datasets stay as they are).

        Resuming a run paused for credits (402 or the credits floor) first re-reads the credits
        (when a ``credits_check`` is set) and refuses while they are still below the floor.

        Raises:
            ValueError: unknown dataset, or the run is ending (:meth:`_refuse_when_ending`).
        """
        self._refuse_when_ending("resume", dataset)
        if dataset is None:
            if self._run.pause == PauseKind.CREDITS and self.credits_check is not None:
                await self.credits_check()
                cr = self._s.spend.credits
                floor = self._s.cfg.spend.credits_floor_usd
                if cr is not None and cr.remaining_usd is not None and cr.remaining_usd <= max(floor, 0.0):
                    return f"not resumed: credits ${cr.remaining_usd:.2f} are still at or below the floor ${floor:.2f}"
            self._s.resume_all()
            paused = [rt.name for rt in self._s.datasets.values() if rt.control == Control.PAUSED]
            for name in paused:
                await self._s.set_dataset_control(name, "active", "")
            return "run resumed" + (f"; {len(paused)} paused dataset(s) resumed: {', '.join(paused)}" if paused else "")
        await self._s.set_dataset_control(self._ds(dataset), "active", "")
        return f"{dataset} resumed"

    async def skip(self, dataset: str, abort: bool = False, reason: str = "skipped by user") -> str:
        """Skip a dataset: no more dispatch, pending prompts count as skipped; ``abort`` cancels its in-flight.

        Raises:
            ValueError: unknown dataset, or the run is ending (:meth:`_refuse_when_ending`).
        """
        self._refuse_when_ending("skip", dataset)
        await self._s.set_dataset_control(self._ds(dataset), "skipped", reason)
        n = self._s.ending.abort(dataset) if abort else 0
        return f"{dataset} skipped" + (f", {n} in-flight aborted" if abort else "")

    def abort(self, dataset: str | None = None) -> str:
        """Cancel in-flight requests (of ``dataset`` or all) now; their prompts return to pending."""
        n = self._s.ending.abort(self._ds(dataset) if dataset else None)
        return f"{n} in-flight request(s) aborted"

    async def failed_counts(self, dataset: str | None = None) -> dict[str, int]:
        """Failed prompts of ``dataset`` (None: all) by error class, from the store (queued
        failures committed first), e.g. ``{"bad_request": 3, "server": 1}``."""
        if dataset is not None:
            self._ds(dataset)
        self._s.failures.release_held()
        await self._s.writer.flush()
        return await self._s.store.failed_counts(dataset)

    async def retry_failed(self, dataset: str | None = None, reason: str | None = None) -> str:
        """Return the failed prompts of ``dataset`` (None: every dataset) that failed with error
        class ``reason`` (None: any) to pending; the run dispatches them again. Datasets stay in
        their state: a paused one is resumed separately.

        Raises:
            ValueError: unknown dataset.
        """
        n = await self._s.failures.retry_failed(self._ds(dataset) if dataset else None, reason)
        what = f"{n} failed prompt(s){' (' + reason + ')' if reason else ''}"
        where = f" of {dataset}" if dataset else ""
        if n == 0:
            return f"no failed prompts{where}{' with reason ' + reason if reason else ''}"
        notes = []
        if self._run.phase in (RunPhase.COMPLETED, RunPhase.STOPPED, RunPhase.STOPPING):
            notes.append("the run has ended: they are requested at the next `datagen run`")
        else:
            if self._run.paused:
                notes.append("the run is paused: resume it to send them")
            held = [d for d in ([dataset] if dataset else self._run.datasets)
                    if self._run.datasets[d].control != Control.ACTIVE and self._run.datasets[d].pending_total]
            if held:
                notes.append(f"{', '.join(held)} {'is' if len(held) == 1 else 'are'} not active: resume to send them")
        return f"{what}{where} returned to pending" + (f"; {'; '.join(notes)}" if notes else "")

    def concurrency_bounds(self, cls: str) -> tuple[int, int]:
        """``(1, cap)``: the concurrency range class ``cls`` accepts (see :func:`engine.run.limiter.concurrency_cap`).

        Raises:
            ValueError: unknown class.
        """
        if cls not in self._s.limiters:
            raise ValueError(f"unknown class {cls!r}; expected one of: {', '.join(self._s.limiters)}")
        return 1, concurrency_cap(self._s.cfg.classes[cls].concurrency)

    async def set_concurrency(self, cls: str, n: int) -> str:
        """Set request class ``cls``'s concurrency to ``n`` at once.

        Raises:
            ValueError: unknown class, or ``n`` outside ``1..cap`` (:meth:`concurrency_bounds`); 0 is
                refused because stopping dispatch is a pause, which the run then shows.
        """
        self.concurrency_bounds(cls)
        check_concurrency(cls, n, self._s.cfg.classes[cls].concurrency)
        await self._s.limiters[cls].set_capacity(n)  # in-flight requests are never cancelled
        self._s.event("info", "concurrency", None, f"class {cls} concurrency set to {n}")
        self._run.notify()
        return f"class {cls} concurrency {n}"

    def stop(self, reason: str = "stopped by user", abort: bool = False, exit_code: int = 0) -> str:
        """Stop the run: no more dispatch; in-flight requests finish (or are cancelled with ``abort``).
        ``exit_code`` becomes the run's exit code unless an earlier stop gave a non-zero one
        (130: interrupted)."""
        self._s.ending.stop(reason, exit_code=exit_code, abort=abort)
        return "run stopping"

    async def drain(self, reason: str = "drain requested", exit_code: int = 0) -> None:
        """Stop dispatching and wait for the requests in flight, up to :meth:`drain_limit_s` seconds;
        then abort what is left. Returns once the drain ended (the run ends within 5 s of the limit)."""
        await self._s.ending.drain(reason=reason, exit_code=exit_code)

    def drain_limit_s(self) -> float:
        """Seconds a drain waits for in-flight requests (``run.drain_timeout_s``; ``"auto"``: the
        requests' own bound, ``provider.timeouts.total_s``)."""
        return self._s.ending.drain_limit_s()

    def dataset_class(self, dataset: str) -> str:
        """The request class most of ``dataset``'s remaining prompts use (what its concurrency keys set).

        Raises:
            ValueError: unknown dataset (the message lists the configured ones).
        """
        rt = self._run.datasets[self._ds(dataset)]
        if rt.pending and max(rt.pending.values()) > 0:
            return max(rt.pending, key=lambda c: rt.pending[c])
        return next(iter(self._s.cfg.classes))
