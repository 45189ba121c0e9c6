"""``datagen run --headless``: a run without the dashboard, with progress lines on stdout, signal
handling (first Ctrl-C/SIGTERM drains, the second aborts) and the run's log file.

Exit codes: those of :func:`engine.run.runner.run_job` (0 completed, 1 configuration/data error,
2 key rejected, 3 paused by a guard with ``--exit-on-pause``, 4 run directory deleted or moved while
running, 130 interrupted).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Callable

from engine.config import Config
from engine.report.metricsserver import open_metrics, printer, serving
from engine.report.progress import (
    abort_at_end_text,
    abort_hint,
    ends_text,
    final_report,
    format_notices,
    format_progress,
)
from engine.run.logsafe import LimitedStreamHandler, SafeFileHandler
from engine.run.runner import FILE_ONLY, Job, prepare, run_job
from engine.run.runstate import RunPhase
from engine.run.scheduler import Scheduler
from engine.run.seams import TextOut

log = logging.getLogger("engine")


class SafeOut:
    """A text stream wrapper that stops writing, instead of raising, once the terminal or pipe is gone
    (``datagen run | head``, a closed tmux pane): the run goes on and the file log keeps everything."""

    def __init__(self, f: TextOut) -> None:
        self.f = f
        self.dead = False

    def write(self, s: str) -> int:
        if not self.dead:
            try:
                return self.f.write(s)
            except (OSError, ValueError):
                self.dead = True
        return len(s)

    def flush(self) -> None:
        if not self.dead:
            try:
                self.f.flush()
            except (OSError, ValueError):
                self.dead = True


#: ``logging.Handler.name`` of the handlers :func:`setup_file_logging` adds (file, stderr): a rerun in the same
#: process replaces them, and a caller closes them by this name (:func:`is_datagen_handler`).
HANDLER_NAMES = ("datagen.file", "datagen.stderr")


def is_datagen_handler(h: logging.Handler) -> bool:
    """Whether ``h`` is one of the handlers :func:`setup_file_logging` added."""
    return h.get_name() in HANDLER_NAMES


def setup_file_logging(run_dir: Path, *, stderr_level: int | None = logging.WARNING) -> None:
    """Log to ``RUN_DIR/datagen.log`` (owner-only) and, optionally, warnings to stderr (except
    records marked :data:`~engine.run.runner.FILE_ONLY`). Both handlers count the same warning
    repeated within a minute instead of repeating it, and the file's handler drops (and counts) the
    lines a full or vanished disk refuses (:mod:`engine.run.logsafe`).

    Raises:
        OSError: ``datagen.log`` cannot be created.
    """
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        if is_datagen_handler(h):
            root.removeHandler(h)
    path = Path(run_dir) / "datagen.log"
    fh = SafeFileHandler(path)  # a full disk drops and counts lines, never prints tracebacks
    os.chmod(path, 0o600)
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    fh.set_name(HANDLER_NAMES[0])
    root.addHandler(fh)
    if stderr_level is not None:
        sh = LimitedStreamHandler(sys.stderr)  # the same warning within a minute is counted, not repeated
        sh.setLevel(stderr_level)
        sh.addFilter(lambda record: not getattr(record, FILE_ONLY, False))
        sh.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        sh.set_name(HANDLER_NAMES[1])
        root.addHandler(sh)
    for noisy in ("httpx", "httpcore", "aiosqlite"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def interrupt_action(signame: str, stopping: bool) -> str:
    """What an interrupt does: the one rule of the headless runner and the dashboard.

    Args:
        signame: ``"SIGINT"``, ``"SIGTERM"``, ``"SIGHUP"`` or ``"Ctrl-C"`` (the key in the dashboard).
        stopping: True when a stop is already in progress: an earlier interrupt, the dashboard's
            "Drain, then quit", an exit on pause (see :func:`run_stopping`).

    Returns:
        ``"drain"`` for the first interrupt (in-flight requests finish and are stored);
        ``"abort"`` for any interrupt while a stop is in progress: that stop counted as the first;
        ``"continue"`` for SIGHUP while stopping: the terminal went away, nobody asked to lose the
        streams, so the stop in progress goes on unchanged (a SIGHUP is never an escalation).
    """
    if not stopping:
        return "drain"
    return "continue" if signame == "SIGHUP" else "abort"


def run_stopping(sched: Scheduler | None) -> bool:
    """True when ``sched``'s run is stopping or stopped (a drain or stop is in progress or done)."""
    return sched is not None and sched.runstate.phase in (RunPhase.STOPPING, RunPhase.STOPPED)


def fmt_limit(seconds: float) -> str:
    """A drain limit for people: ``"15s"``, ``"30m"``, ``"1h05m"``."""
    s = int(round(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" + (f"{s % 60:02d}s" if s % 60 else "")
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def drain_line(snap) -> str:
    """The headless line shown while a drain runs: in-flight count, their estimated USD, time left,
    what that abort would cut and bill, when the streams are expected to end, and how to abort now, e.g.
    ``draining: 1,222 in flight (est. $8.8500); aborting them in 14m12s (~310 cut, est. $2.1000); all end
    in ~33m20s; abort now: Ctrl-C again or datagen ctl runs/x abort``.

    Args:
        snap: an ``engine.report.snapshot.RunSnapshot`` with ``drain_left_s`` set.
    """
    cut = abort_at_end_text(snap)
    ends = ends_text(snap)
    return (f"draining: {snap.in_flight:,} in flight (est. ${snap.cost_in_flight_usd:.4f}); "
            f"aborting them in {fmt_limit(snap.drain_left_s or 0.0)}" + (f" ({cut})" if cut else "")
            + (f"; {ends}" if ends else "") + f"; abort now: Ctrl-C again or {abort_hint(snap)}")


async def run_headless(
    cfg: Config,
    out: TextOut = sys.stdout,
    *,
    exit_on_pause: bool = False,
    install_signals: bool = True,
    on_ready: Callable[[Job], None] | None = None,
    on_signal: Callable[[str], None] | None = None,
    metrics: bool = True,
) -> int:
    """Run the job printing one progress line per active dataset every ``run.progress_interval_s``.
    ``on_signal`` is also called with each signal's name (chained extraction stops with it).
    With ``[run] metrics_port`` (and ``metrics``; a chained run serves its own), the Prometheus
    endpoint (:mod:`engine.report.metricsserver`) serves the run's snapshots from before ``prepare``
    until the end.

    Returns the exit code (see module docstring).

    Raises:
        engine.report.metricsserver.MetricsError: the metrics port cannot be bound (nothing started).
    """
    safe = out if isinstance(out, SafeOut) else SafeOut(out)
    jobs: list[Job] = []
    server = open_metrics(cfg.run, run=lambda: jobs[0].controller.snapshot() if jobs else None) if metrics else None

    def ready(job: Job) -> None:
        jobs.append(job)
        if on_ready is not None:
            on_ready(job)

    async with serving(server, printer(safe)):
        return await _run_headless(cfg, safe, exit_on_pause=exit_on_pause, install_signals=install_signals,
                                   on_ready=ready, on_signal=on_signal)


async def _run_headless(cfg: Config, out: TextOut, *, exit_on_pause: bool, install_signals: bool,
                        on_ready: Callable[[Job], None], on_signal: Callable[[str], None] | None) -> int:
    job = await prepare(cfg, out)
    sched = job.scheduler
    loop = asyncio.get_running_loop()
    signals_seen = 0
    drains: list[asyncio.Future] = []

    def handle_signal(signame: str) -> None:
        nonlocal signals_seen
        if on_signal is not None:
            on_signal(signame)
        action = interrupt_action(signame, signals_seen > 0 or run_stopping(sched))
        signals_seen += 1
        # Act first: the terminal may be gone (SIGHUP, a closed pipe) and printing may fail.
        if action == "continue":
            log.warning("%s received: the stop in progress continues (again with SIGINT/SIGTERM to abort)", signame)
        elif action == "drain":
            n, usd = sched.snapshot().in_flight, sched.ending.cost_in_flight_usd()
            drains.append(asyncio.ensure_future(sched.ending.drain(reason=f"{signame}: interrupted", exit_code=130)))
            say(f"{signame}: draining {n:,} in-flight request(s) (est. ${usd:.4f}, up to "
                f"{fmt_limit(sched.ending.drain_limit_s())}); again to abort")
        else:
            say(f"{signame}: aborting in-flight requests")
            sched.ending.stop(f"{signame}: interrupted (abort)", exit_code=130, abort=True)

    def say(line: str) -> None:
        try:
            print(line, file=out, flush=True)
        except (OSError, ValueError):  # stdout closed: keep running, the file log has everything
            log.info("%s", line)

    if install_signals:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                loop.add_signal_handler(sig, handle_signal, sig.name)
            except (NotImplementedError, RuntimeError):
                pass

    async def reporter() -> None:
        printed_final: set[str] = set()
        while True:
            await asyncio.sleep(cfg.run.progress_interval_s)
            snap = sched.snapshot()
            for line in format_progress(snap, printed_final):
                say(line)
            if snap.drain_left_s is not None:
                say(drain_line(snap))

    async def announce() -> None:  # guard pauses get their own line at once, like a user's pause
        seen = 0
        while True:
            await asyncio.sleep(0.25)
            lines, seen = format_notices(sched.telemetry.notices, seen)
            for line in lines:
                say(line)

    rep = asyncio.create_task(reporter())
    note = asyncio.create_task(announce())
    on_ready(job)
    try:
        code = await run_job(job, exit_on_pause=exit_on_pause, stop_on_auth=True, out=out)
    finally:
        rep.cancel()
        note.cancel()
        for d in drains:
            d.cancel()
        await asyncio.gather(rep, note, *drains, return_exceptions=True)
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass
    for line in final_report(sched.snapshot(), job.store_where()):
        say(line)
    return code
