"""What the dashboard needs from whatever runs the engine: a typed host interface and its two hosts.

The dashboard reads the engine only through immutable snapshots (:class:`engine.report.snapshot.RunSnapshot`)
and sends commands only as :class:`engine.run.commands.RunCommand` values through :class:`Commands`
(:meth:`engine.run.controller.Controller.apply`: the engine's one command path, which ``datagen ctl``
takes too) and :class:`DashboardHost`. Two hosts implement it:

- :class:`EngineHost` does what :func:`engine.run.headless.run_headless` does, minus the printing: it runs
  :func:`engine.api.prepare_job` and :func:`engine.api.run_job` (writer, supervisor, scheduler; closes the
  job). The app runs :meth:`EngineHost.run` as an async Textual worker on its own loop.
- :class:`StaticHost` shows an injected snapshot source and command target (tests, screenshots).
"""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path
from typing import Callable, Protocol

from engine.api import (
    CommandResult,
    Config,
    Controller,
    Job,
    RunCommand,
    RunSnapshot,
    Scheduler,
    fmt_limit,
    prepare_job,
    run_job,
)

log = logging.getLogger("datagen.dashboard")

QUIT_MODES = ("drain", "abort")
"""How a quit stops the run: in-flight requests finish (``drain``) or are cancelled (``abort``)."""


class Commands(Protocol):
    """Where the dashboard sends commands (:class:`engine.run.controller.Controller` fits it): every key's
    command as a :class:`~engine.run.commands.RunCommand` through :meth:`apply`, and the failed
    counts ``f`` offers to retry."""

    async def apply(self, cmd: RunCommand) -> CommandResult:
        """Apply ``cmd`` (:func:`engine.run.commands.apply`): ``ok`` says whether it was applied (a
        refusal names the unknown dataset/class/provider or the out-of-range value); ``message`` is
        shown as a toast."""
        ...

    async def failed_counts(self, dataset: str | None = None) -> dict[str, int]:
        """Failed prompts of ``dataset`` (None: all) by error class, e.g. ``{"server": 3}``."""
        ...


class DashboardHost(Protocol):
    """Everything the dashboard asks of its host, besides the snapshots' contents.

    Attributes:
        controller: the command target; None while the engine is being prepared.
        quit_mode: ``"drain"`` or ``"abort"`` once a quit was requested, else None.
        exit_code: the run's exit code once it ended (docs/commands.md, "Every command"), else None.
        finished: True once the run ended (normally or not); a quit then exits at once.
    """

    @property
    def controller(self) -> Commands | None: ...

    @property
    def quit_mode(self) -> str | None: ...

    @property
    def exit_code(self) -> int | None: ...

    @property
    def finished(self) -> bool: ...

    def snapshot(self) -> RunSnapshot | None:
        """The run's state now (None before the engine is prepared)."""
        ...

    def dataset_class(self, dataset: str) -> str | None:
        """The request class most of ``dataset``'s remaining prompts use (None: unknown; the
        dashboard then takes the snapshot's first class)."""
        ...

    def request_quit(self, mode: str, interrupted: str | None = None) -> str:
        """Stop the run (``mode`` one of :data:`QUIT_MODES`); returns a line for a notification.

        Raises:
            ValueError: ``mode`` is not ``"drain"`` or ``"abort"``.
        """
        ...


def check_quit_mode(mode: str) -> str:
    """``mode`` when it is one of :data:`QUIT_MODES`.

    Raises:
        ValueError: anything else, naming it.
    """
    if mode not in QUIT_MODES:
        raise ValueError(f"mode must be 'drain' or 'abort', got {mode!r}")
    return mode


class _LogLines(io.TextIOBase):
    """A text stream that turns each written line into an INFO log record (for ``prepare``'s
    progress lines, which would otherwise print behind the dashboard's back). An indented line
    details the one before it (the tokenizer's marker ids, a rejected row's example) and is logged
    at DEBUG: the log pane keeps the summary lines."""

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
                self._log.log(logging.DEBUG if line[:1].isspace() else logging.INFO, "%s", line)
        return len(s)


class EngineHost:
    """One job's lifecycle on the current event loop (a :class:`DashboardHost`).

    Engine members it uses (through :mod:`engine.api`): ``prepare_job``/``run_job``; ``Job.controller``
    (snapshots and every command: ``stop()``, ``drain()``, ``drain_limit_s()``, ``dataset_class()``) and
    ``Job.store.path``; ``Job.scheduler`` only through :attr:`scheduler`, for tests that check the engine itself.

    Attributes:
        job: the prepared job (None until :meth:`run` has prepared it).
        exit_code: the run's exit code once :meth:`run` returned (see ``engine.run.runner``).
        error: the exception that ended :meth:`run`, if any (config/data errors included).
        quit_mode: ``"drain"`` or ``"abort"`` once a quit was requested.
        interrupted: the signal or key (``"SIGTERM"``, ``"Ctrl-C"``) that stopped the run (exit 130).
    """

    def __init__(self, cfg: Config, exit_on_pause: bool = False) -> None:
        self.cfg = cfg
        self.exit_on_pause = exit_on_pause
        self.job: Job | None = None
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self.quit_mode: str | None = None
        #: the signal or key that interrupted the run (exit code 130), if any.
        self.interrupted: str | None = None
        self._drain_task: asyncio.Future[None] | None = None

    @property
    def controller(self) -> Controller | None:
        """Commands for the job's scheduler (None until prepared)."""
        return self.job.controller if self.job is not None else None

    @property
    def scheduler(self) -> Scheduler | None:
        """The running scheduler, or None before ``prepare`` finished (for tests that check the
        engine itself; the dashboard reads :meth:`snapshot`)."""
        return self.job.scheduler if self.job is not None else None

    @property
    def store_path(self) -> Path | None:
        """The run's store file (None before ``prepare`` finished)."""
        return self.job.store.path if self.job is not None else None

    @property
    def finished(self) -> bool:
        """True once :meth:`run` returned (normally or not)."""
        return self.exit_code is not None or self.error is not None

    def snapshot(self) -> RunSnapshot | None:
        """The scheduler's snapshot now (also after the job closed); None before ``prepare`` finished."""
        return self.job.controller.snapshot() if self.job is not None else None

    def dataset_class(self, dataset: str) -> str | None:
        """``Controller.dataset_class(dataset)``; None before ``prepare`` finished or for an unknown name."""
        if self.job is None:
            return None
        try:
            return self.job.controller.dataset_class(dataset)
        except ValueError:
            return None

    async def run(self) -> int:
        """Prepare, run to the end and close; returns the exit code (also kept in ``exit_code``).

        Raises whatever ``prepare`` raises (kept in ``error`` too).
        """
        out = _LogLines(log)
        try:
            self.job = job = await prepare_job(self.cfg, out)
        except BaseException as e:
            self.error = e
            raise
        if self.quit_mode:  # quit was asked while preparing: nothing was dispatched
            await job.close()
            self.exit_code = 130  # quit before anything ran: every prompt is left (interrupted)
            return self.exit_code
        try:  # writer + supervisor + scheduler; closes the job; the engine applies exit-on-pause
            code = await run_job(job, exit_on_pause=self.exit_on_pause, out=out)
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
        snap = self.snapshot()
        return snap is not None and all(d.pending == 0 and d.in_flight == 0 for d in snap.datasets)

    def request_quit(self, mode: str, interrupted: str | None = None) -> str:
        """Stop the run: ``"drain"`` (in-flight requests finish and are stored, up to the drain limit,
        ``run.drain_timeout_s``, by default the requests' own ``provider.timeouts.total_s``, then
        aborted) or ``"abort"`` (cancel them now; their prompts return to pending). Safe to call
        before the job is prepared and more than once (a later ``"abort"`` upgrades a drain).

        A quit before the run completed exits 130 (interrupted by the user; docs/commands.md, "Every command"),
        like a signal, unless the drain stored the last prompts (then 0, completed); a quit after
        the run ended keeps the run's own code.

        Args:
            interrupted: the signal or key that asked (``"SIGINT"``, ``"Ctrl-C"``...), named in the
                log and state reason.

        Returns:
            a short description for a notification (count and estimated dollars in flight).

        Raises:
            ValueError: ``mode`` is not ``"drain"`` or ``"abort"``.
        """
        check_quit_mode(mode)
        self.quit_mode = mode if self.quit_mode != "abort" else "abort"
        if interrupted:
            self.interrupted = self.interrupted or interrupted
        code = 130  # left before the run completed: interrupted (see run() for a drain that completes it)
        why = f"{self.interrupted}: interrupted" if self.interrupted else "quit"
        if self.job is None:
            return "quitting as soon as the engine has started"
        ctl = self.job.controller
        snap = ctl.snapshot()
        n, usd = snap.in_flight, snap.cost_in_flight_usd
        if mode == "abort":
            ctl.stop(f"{why} (abort)", abort=True, exit_code=code)
            return f"aborting {n:,} in-flight request(s) (est. ${usd:.4f})"
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(ctl.drain(reason=f"{why} (drain)", exit_code=code))
        return (f"draining {n:,} in-flight request(s) (est. ${usd:.4f}, up to {fmt_limit(ctl.drain_limit_s())}); "
                f"again to abort")

    def close_limit_s(self) -> float:
        """Seconds the app may wait for the engine to stop once asked: the drain limit plus the
        5 s abort grace and time to flush and close (used as a hard bound at unmount)."""
        limit = self.job.controller.drain_limit_s() if self.job is not None else 0.0
        return limit + 30.0


class InjectedCommands(Commands, Protocol):
    """A :class:`Commands` target given to :class:`StaticHost`, which also names dataset classes
    and is told about a quit."""

    def dataset_class(self, dataset: str) -> str | None:
        """The request class of ``dataset`` (None: the snapshot's first class)."""
        ...

    def stop(self, reason: str = "", abort: bool = False) -> str:
        """Stop the run (drain, or abort with ``abort``)."""
        ...


class StaticHost:
    """A :class:`DashboardHost` over an injected snapshot source and command target (tests and
    screenshots): no engine runs; a quit tells the controller (``stop``) and ends the app at once
    with exit code 0.

    Args:
        source: returns the snapshot to show (or None).
        controller: the command target (e.g. :class:`tui.testing.FakeController`).
    """

    def __init__(self, source: Callable[[], RunSnapshot | None], controller: InjectedCommands | None) -> None:
        self._source = source
        self._controller = controller
        self.quit_mode: str | None = None
        self.exit_code: int | None = None

    @property
    def controller(self) -> InjectedCommands | None:
        """The injected command target."""
        return self._controller

    @property
    def finished(self) -> bool:
        """True once a quit was requested (nothing runs: the quit ends it)."""
        return self.exit_code is not None

    def snapshot(self) -> RunSnapshot | None:
        """What the injected source returns now."""
        return self._source()

    def dataset_class(self, dataset: str) -> str | None:
        """The injected controller's ``dataset_class`` (None without a controller)."""
        return self._controller.dataset_class(dataset) if self._controller is not None else None

    def request_quit(self, mode: str, interrupted: str | None = None) -> str:
        """Stop the injected controller (``stop("quit", abort=...)``) and mark the run quit (exit code 0).

        Raises:
            ValueError: ``mode`` is not ``"drain"`` or ``"abort"``.
        """
        self.quit_mode = check_quit_mode(mode)
        if self._controller is not None:
            self._controller.stop("quit", abort=(mode == "abort"))
        self.exit_code = 0
        return "quitting"


__all__ = ["Commands", "DashboardHost", "EngineHost", "InjectedCommands", "QUIT_MODES", "StaticHost"]
