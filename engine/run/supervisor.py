"""The run's supervisor: the periodic work beside dispatch.

- every ``TICK_S`` (1 s): apply control commands queued by ``datagen ctl`` (the store's
  ``commands`` table; each row read back as a :class:`~engine.run.commands.RunCommand` and applied
  through the controller, :func:`engine.run.commands.apply`), measure event-loop lag, sample throughput history, run the calibration gate
  (pause a dataset whose projected cost exceeds its cap after its first 1% / 50 completions, never
  one with only a small remainder left or its cap already met: :func:`gate`) and
  the credits floor as a backstop (pause everything when credits minus the dollars in flight fall
  below ``spend.credits_floor_usd``; dispatch itself checks the floor first, :mod:`engine.money.creditsfloor`);
- every tick, first: the run directory (:class:`engine.storage.rundir.RunDirWatch`): deleted, moved or
  replaced stops the run (:func:`engine.run.guards.run_dir_lost`: deleted aborts the streams in flight,
  moved drains them into the store where it went); unwritable or nearly full pauses it until it is
  fine again (:func:`engine.run.guards.disk`);
- every ``spend.credits_poll_s``: read credits from ``/key`` (fallback ``/credits``): of the one
  server, or of every endpoint of ``[provider] base_urls``, summed (:mod:`engine.money.credits`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from engine.money.projection import calibration_gate
from engine.money.spend import CreditsReading
from engine.report.snapshot import DatasetSnapshot
from engine.run import guards
from engine.run.commands import CommandResult, RunCommand
from engine.run.controller import Controller
from engine.run.runstate import Control
from engine.run.scheduler import Scheduler
from engine.storage.rundir import DirHealth, RunDirWatch

log = logging.getLogger(__name__)

TICK_S = 1.0
#: Store meta key of the provider's usage (USD) before the run's first dollar (:meth:`SpendControl.usage_baseline`).
USAGE_BASELINE_KEY = "credits_usage_baseline"


def gate(d: DatasetSnapshot) -> str | None:
    """The calibration gate's reason for dataset ``d`` (:func:`engine.money.projection.calibration_gate`
    on its figures: what is left to send and what is spent count), or None."""
    return calibration_gate(d.done, d.prompts, d.projected_cost_uncapped_usd, d.max_cost_usd,
                            left=d.pending, spent=d.cost_usd)


class Supervisor:
    """Runs beside a :class:`~engine.run.scheduler.Scheduler` until stopped.

    Args:
        scheduler: the scheduler to supervise.
        controller: its controller (commands are applied through it).
        read_credits: ``read_credits(clock)`` reads the provider's credits once (e.g.
            ``functools.partial(engine.money.credits.read_credits, client.get_json)``, or
            :func:`~engine.money.credits.read_credits_each` over a fleet's endpoints), None when the
            provider offers none; None disables credits polling.
        clock: monotonic clock (s).
        watch: the run directory held open, probed every tick (None: not watched).
    """

    def __init__(self, scheduler: Scheduler, controller: Controller,
                 read_credits: Callable[[Callable[[], float]], Awaitable[CreditsReading | None]] | None = None,
                 clock: Callable[[], float] = time.monotonic, watch: RunDirWatch | None = None) -> None:
        self.s = scheduler
        #: the run directory held open (None: not watched)
        self.watch = watch
        #: the reading that found the run directory deleted or moved (None: not lost)
        self.dir_lost: DirHealth | None = None
        self._drain_task: asyncio.Task | None = None
        self.ctl = controller
        self.read_credits = read_credits
        self.clock = clock
        self._floor_paused_at: float | None = None
        self.credits_task: asyncio.Task | None = None

    async def poll_credits(self) -> None:
        """Read credits once and record them (no-op without ``read_credits``). A partial reading
        (some endpoint gave none) is logged when it starts being partial."""
        if self.read_credits is None:
            return
        try:
            reading = await self.read_credits(self.clock)
        except Exception as e:  # a monitoring read must never stop the run
            log.warning("credits read failed: %s", e)
            return
        if reading is None:
            log.info("credits: provider exposes neither /key nor /credits; credits not tracked")
            self.read_credits = None
            return
        before = self.s.spend.credits
        if reading.partial and (before is None or before.missing != reading.missing):
            log.warning("credits partial: %d of %d endpoints gave none (%s); credits shown are the others' "
                        "and spend is not reconciled until every endpoint answers", len(reading.missing),
                        reading.endpoints, ", ".join(reading.missing))
        had = self.s.spend.usage_at_start is not None
        self.s.spend.on_credits(reading)
        base = self.s.spend.usage_baseline()
        if not had and base is not None:  # the run's first reading: the drift spans its later processes too
            try:
                if await self.s.store.get_meta(USAGE_BASELINE_KEY) is None:
                    await self.s.store.set_meta(USAGE_BASELINE_KEY, repr(base))
            except Exception as e:  # the drift then counts from this process's start
                log.warning("credits baseline not stored: %s", e)

    async def _credits_loop(self) -> None:
        while True:
            await self.poll_credits()
            if self.read_credits is None:
                return
            await asyncio.sleep(self.s.cfg.spend.credits_poll_s)

    async def check_run_dir(self) -> DirHealth | None:
        """Probe the run directory (off the loop) and act: stop the run when it was deleted or moved
        (once), pause it when it cannot take more writes, resume a pause for the disk once it can.
        Returns the reading (None: not watched, or already lost)."""
        if self.watch is None or self.dir_lost is not None:
            return None
        h = await asyncio.to_thread(self.watch.probe)
        lost = guards.run_dir_lost(h, self.s.ending.in_flight_cost())
        if lost is not None:
            self.dir_lost = h  # the stop's event logs the reason (once)
            if lost.abort:
                self.s.ending.stop(lost.reason, exit_code=lost.exit_code, abort=True)
            else:
                self._drain_task = asyncio.create_task(
                    self.s.ending.drain(reason=lost.reason, exit_code=lost.exit_code))
            return h
        slots = sum(c.concurrency for c in self.s.cfg.classes.values())
        if guards.disk_recovered(h, self.s.runstate, slots):
            self.s.resume_all()
        else:
            guards.apply(self.s, guards.disk(h, self.s.runstate, slots))
        return h

    async def apply_commands(self) -> None:
        """Apply queued ``datagen ctl`` commands in order and record their results."""
        for cid, verb, dataset, arg in await self.s.store.pending_commands():
            try:
                result = await self.ctl.apply(RunCommand.from_row(verb, dataset, arg))
            except ValueError as e:  # a malformed row: refused as such
                result = CommandResult.refused(str(e))
            await self.s.store.mark_command(cid, time.time(), result.text, result.ok)
            self.s.event("info", "ctl", dataset, f"ctl {verb}{' ' + dataset if dataset else ''}"
                         f"{' ' + arg if arg else ''}: {result.text}")

    def guards(self) -> None:
        """Calibration gate per dataset and the credits floor (see module docstring)."""
        snap = self.s.snapshot()
        self.calibration(snap)
        cr = self.s.spend.credits
        pause = guards.credits_floor(cr, self.s.cfg.spend.credits_floor_usd, snap.cost_in_flight_usd, self.s.runstate)
        if pause is not None and cr is not None and self._floor_paused_at != cr.at:  # once per credits reading
            self._floor_paused_at = cr.at
            guards.apply(self.s, pause)

    def calibration(self, snap=None) -> list[asyncio.Task]:
        """The calibration gate of every active dataset not gated yet in this process (``snap``: the
        snapshot to judge, default now); returns the tasks of the dataset pauses it started."""
        snap = snap if snap is not None else self.s.snapshot()
        tasks = []
        for d in snap.datasets:
            rt = self.s.runstate.datasets[d.name]
            if rt.gate_fired or rt.control != Control.ACTIVE:
                continue
            t = guards.apply(self.s, guards.calibration(rt, gate(d)))
            if t is not None:
                tasks.append(t)
        return tasks

    async def gate_before_dispatch(self) -> None:
        """Decide the calibration gate from the stored results, before the first dispatch of a
        restarted run (a dataset past its first completions that projects over its cap is paused,
        and the pause stored, before any request leaves).

        A dataset the gate paused in an earlier process is judged again with this config: when its
        cap was raised or removed since, so that the gate no longer fires, it is made active again,
        in the store too (``datagen status`` must not keep quoting a cap the config no longer has);
        else it stays paused, with the gate's reason in today's figures. Every dataset still paused by an
        earlier process (the user, a guard) with prompts left is announced, with how to resume it."""
        snap = self.s.snapshot()
        for d in snap.datasets:
            rt = self.s.runstate.datasets[d.name]
            if rt.control != Control.PAUSED or not rt.reason.startswith(guards.CALIBRATION_PREFIX):
                continue
            still = gate(d)
            rt.gate_fired = True  # judged now: not again in this process
            if still is None:
                log.info("dataset %s: calibration gate lifted (now: dataset cap %s, %d prompt(s) left); it runs again",
                         d.name, "none" if d.max_cost_usd is None else f"${d.max_cost_usd:,.2f}", d.pending)
                rt.control, rt.reason = Control.ACTIVE, ""
            else:
                rt.reason = f"{guards.CALIBRATION_PREFIX}{still}"
            await self.s.store.set_dataset_state(d.name, rt.control, rt.reason, time.time())
        for rt in self.s.runstate.datasets.values():  # a pause kept from an earlier process is a decision to see
            if rt.control == Control.PAUSED and any(rt.pending.values()):
                self.s.event("warning", "paused", rt.name,
                             f"still paused (an earlier run paused it: {rt.reason or 'by the user'}); resume: p on its "
                             f"row, or datagen ctl {self.s.cfg.run.dir} resume {rt.name}")
        for t in self.calibration(self.s.snapshot()):
            await t

    async def run(self) -> None:
        """Tick until cancelled."""
        if self.read_credits is not None:
            self.credits_task = asyncio.create_task(self._credits_loop())
        try:
            next_t = self.clock()
            while True:
                next_t += TICK_S
                await asyncio.sleep(max(0.0, next_t - self.clock()))
                lag = max(0.0, self.clock() - next_t)
                self.s.telemetry.loop_lag_ms = lag * 1000.0
                if lag > 5 * TICK_S:
                    next_t = self.clock()
                try:
                    await self.check_run_dir()
                except Exception:  # supervision must survive its own bugs
                    log.exception("run directory check failed")
                try:
                    await self.apply_commands()
                    self.s.update_censored()
                    self.guards()
                    self.s.telemetry.tick(self.s.elapsed_s(), self.clock())
                except Exception:  # supervision must survive its own bugs
                    log.exception("supervisor tick failed")
        finally:
            if self.credits_task:
                self.credits_task.cancel()
            if self._drain_task is not None and not self._drain_task.done():
                self._drain_task.cancel()
