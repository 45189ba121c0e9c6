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
from engine.runner import Job, prepare
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
    """

    def __init__(self, cfg: Config, exit_on_pause: bool = False) -> None:
        self.cfg = cfg
        self.exit_on_pause = exit_on_pause
        self.job: Job | None = None
        self.controller: Controller | None = None
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self.quit_mode: str | None = None
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
            self.exit_code = 0
            return 0
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
        self.exit_code = code
        return code

    def request_quit(self, mode: str) -> str:
        """Stop the run: ``"drain"`` (in-flight requests finish and are stored, up to
        ``run.drain_timeout_s`` seconds, then aborted) or ``"abort"`` (cancel them now; their
        prompts return to pending). Safe to call before the job is prepared and more than once
        (a later ``"abort"`` upgrades a drain). Returns a short description."""
        if mode not in ("drain", "abort"):
            raise ValueError(f"mode must be 'drain' or 'abort', got {mode!r}")
        self.quit_mode = mode if self.quit_mode != "abort" else "abort"
        sched = self.scheduler
        if sched is None:
            return "quitting as soon as the engine has started"
        if mode == "abort":
            n = sched.snapshot().in_flight
            sched.stop("quit (abort) requested", abort=True)
            return f"aborting {n:,} in-flight request(s)"
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(sched.drain(self.cfg.run.drain_timeout_s))
        return f"draining in-flight requests (up to {self.cfg.run.drain_timeout_s:.0f}s)"
