"""Hosting the engine inside the dashboard's event loop.

:class:`EngineHost` does what :func:`engine.runner.run_headless` does, minus the printing: it runs
``prepare(cfg)``, starts the writer, runs the scheduler to the end and closes the job. The app runs
:meth:`EngineHost.run` as an async Textual worker on its own loop, pulls
``host.scheduler.snapshot()`` on a timer and sends commands through ``host.controller``.
"""

from __future__ import annotations

import asyncio
import io
import logging

from engine import runner
from engine.config import Config
from engine.controller import Controller
from engine.runner import Job, fmt_limit, prepare
from engine.scheduler import Scheduler

log = logging.getLogger("datagen.dashboard")


class _LogLines(io.TextIOBase):
    """A text stream that turns each written line into an INFO log record (for ``prepare``'s
    progress lines, which would otherwise print behind the dashboard's back)."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._buf = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self._buf += s
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            if line.strip():
                self._log.info("%s", line)
        return len(s)


class EngineHost:
    """One job's lifecycle on the current event loop.

    Attributes:
        job: the prepared job (None until :meth:`run` has prepared it).
        controller: commands for the job's scheduler (None until prepared).
        exit_code: the run's exit code once :meth:`run` returned (see ``engine.runner``).
        error: the exception that ended :meth:`run`, if any (config/data errors included).
        quit_mode: ``"drain"`` or ``"abort"`` once a quit was requested.
        interrupted: the signal or key (``"SIGTERM"``, ``"Ctrl-C"``) that stopped the run (exit 130).
    """

    def __init__(self, cfg: Config, exit_on_pause: bool = False) -> None:
        self.cfg = cfg
        self.exit_on_pause = exit_on_pause
        self.job: Job | None = None
        self.controller: Controller | None = None
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self.quit_mode: str | None = None
        #: the signal or key that interrupted the run (exit code 130), if any.
        self.interrupted: str | None = None
        self._drain_task: asyncio.Task | None = None

    @property
    def handles_exit_on_pause(self) -> bool:
        """True when the engine's ``runner.run_job`` watches for guard pauses itself."""
        return hasattr(runner, "run_job")

    @property
    def scheduler(self) -> Scheduler | None:
        """The running scheduler, or None before ``prepare`` finished."""
        return self.job.scheduler if self.job else None

    @property
    def finished(self) -> bool:
        """True once :meth:`run` returned (normally or not)."""
        return self.exit_code is not None or self.error is not None

    async def run(self) -> int:
        """Prepare, run to the end and close; returns the exit code (also kept in ``exit_code``).

        Raises whatever ``prepare`` raises (kept in ``error`` too).
        """
        out = _LogLines(log)
        try:
            self.job = job = await prepare(self.cfg, out)
        except BaseException as e:
            self.error = e
            raise
        self.controller = getattr(job, "controller", None) or Controller(job.scheduler)
        if self.quit_mode:  # quit was asked while preparing: nothing was dispatched
            await job.close()
            self.exit_code = 130  # quit before anything ran: every prompt is left (interrupted)
            return self.exit_code
        run_job = getattr(runner, "run_job", None)
        try:
            if run_job is not None:  # writer + supervisor + scheduler; closes the job
                code = await run_job(job, exit_on_pause=self.exit_on_pause, out=out)
            else:
                job.writer_task = asyncio.create_task(job.writer.run(job.writer_stop), name="writer")
                try:
                    code = await job.scheduler.run()
                finally:
                    await job.close()
        except BaseException as e:
            self.error = e
            raise
        finally:
            if self._drain_task is not None and not self._drain_task.done():
                self._drain_task.cancel()
        if code == 130 and self.quit_mode and not self.interrupted and self._nothing_left():
            code = 0  # quit, but the drain stored the last requests: the run completed
        self.exit_code = code
        return code

    def _nothing_left(self) -> bool:
        """True when no dataset has a prompt pending or in flight (the run is complete)."""
        sched = self.scheduler
        if sched is None:
            return False
        try:
            return all(d.pending == 0 and d.in_flight == 0 for d in sched.snapshot().datasets)
        except Exception:  # noqa: BLE001 - no snapshot after close: count the run as interrupted
            return False

    def request_quit(self, mode: str, interrupted: str | None = None) -> str:
        """Stop the run: ``"drain"`` (in-flight requests finish and are stored, up to the drain limit,
        ``run.drain_timeout_s``, by default the requests' own ``provider.timeouts.total_s``, then
        aborted) or ``"abort"`` (cancel them now; their prompts return to pending). Safe to call
        before the job is prepared and more than once (a later ``"abort"`` upgrades a drain).

        A quit before the run completed exits 130 (interrupted by the user; README "exit codes"),
        like a signal, unless the drain stored the last prompts (then 0, completed); a quit after
        the run ended keeps the run's own code.

        Args:
            interrupted: the signal or key that asked (``"SIGINT"``, ``"Ctrl-C"``...), named in the
                log and state reason.

        Returns:
            a short description for a notification (count and estimated dollars in flight).
        """
        if mode not in ("drain", "abort"):
            raise ValueError(f"mode must be 'drain' or 'abort', got {mode!r}")
        self.quit_mode = mode if self.quit_mode != "abort" else "abort"
        if interrupted:
            self.interrupted = self.interrupted or interrupted
        code = 130  # left before the run completed: interrupted (see run() for a drain that completes it)
        why = f"{self.interrupted}: interrupted" if self.interrupted else "quit"
        sched = self.scheduler
        if sched is None:
            return "quitting as soon as the engine has started"
        n, usd = sched.snapshot().in_flight, sched.cost_in_flight_usd()
        if mode == "abort":
            sched.stop(f"{why} (abort)", exit_code=code, abort=True)
            return f"aborting {n:,} in-flight request(s) (est. ${usd:.4f})"
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(sched.drain(reason=f"{why} (drain)", exit_code=code))
        return (f"draining {n:,} in-flight request(s) (est. ${usd:.4f}, up to {fmt_limit(sched.drain_limit_s())}); "
                f"again to abort")

    def close_limit_s(self) -> float:
        """Seconds the app may wait for the engine to stop once asked: the drain limit plus the
        5 s abort grace and time to flush and close (used as a hard bound at unmount)."""
        sched = self.scheduler
        limit = sched.drain_limit_s() if sched is not None else 0.0
        return limit + 30.0
