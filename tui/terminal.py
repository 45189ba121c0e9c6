"""Signals and the terminal: what the dashboard does when it is told to stop or loses its tty.

Textual installs no SIGTERM/SIGHUP handlers. :class:`TerminalWatch` adds them on the app's loop:
SIGTERM/SIGINT (and the Ctrl-C key) drain and exit like ``q`` but with code 130; while any stop
is in progress (a drain from ``q``, an earlier signal) they abort at once; SIGHUP, or a watchdog that finds
the terminal gone, also stops drawing, stops Textual's input thread (which would spin on a closed
tty) and sends Textual's output nowhere, so the drain finishes and the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from engine.api import interrupt_action

if TYPE_CHECKING:
    from tui.surface import WatchedApp

log = logging.getLogger("datagen.dashboard")


class TerminalWatch:
    """Signal handlers and the terminal watchdog of :class:`tui.app.DashboardApp` (and, through
    :class:`tui.extract.run_app.ExtractTerminalWatch`, of the extraction's app).

    Args:
        app: the dashboard (a :class:`tui.surface.WatchedApp`): its timers, its Textual driver (stopped
            when the terminal goes away), its host (``quit_mode`` and the snapshot's state tell whether a stop is in progress)
            and ``begin_quit``.

    Attributes:
        lost: True once the terminal went away (SIGHUP or the watchdog): nothing is drawn any more.
        signals: the signals whose handlers are installed on the app's loop.
    """

    def __init__(self, app: WatchedApp) -> None:
        self.app = app
        self.lost = False
        self.signals: list[signal.Signals] = []
        self.tty_fds: list[int] = []
        self.signals_seen = 0

    def add_signal_handlers(self) -> None:
        """Handle SIGTERM, SIGINT and SIGHUP on the running loop (:meth:`on_signal`)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            try:
                loop.add_signal_handler(sig, self.on_signal, sig.name)
                self.signals.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    def remove_signal_handlers(self) -> None:
        """Remove the handlers :meth:`add_signal_handlers` installed (no-op without a running loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for sig in self.signals:
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        self.signals.clear()

    def stopping(self) -> bool:
        """True while any stop is in progress: an earlier signal, a quit asked, or the run stopping."""
        if self.signals_seen > 0 or self.app.host.quit_mode is not None:
            return True
        snap = self.app.host.snapshot()
        return snap is not None and snap.state in ("stopping", "stopped")

    def on_signal(self, signame: str) -> None:
        """SIGTERM/SIGINT/Ctrl-C: drain and exit 130 like quit; while any stop is in progress (an
        earlier signal, "Drain, then quit", an exit on pause): abort at once (``engine.run.headless.interrupt_action``).
        SIGHUP: the terminal is gone; stop drawing and reading it, then drain and exit."""
        action = interrupt_action(signame, self.stopping())
        self.signals_seen += 1
        log.warning("%s received: %s", signame, {"drain": "draining", "abort": "aborting"}.get(
            action, "the stop in progress continues"))
        if signame == "SIGHUP":
            self.on_terminal_lost()
        if action != "continue":
            self.app.begin_quit(action, interrupted=signame)

    def start_watchdog(self) -> None:
        """Check every second that the ttys we started with are still terminals."""
        self.tty_fds = [fd for fd in (0, 1, 2) if _is_terminal(fd)]
        if self.tty_fds:
            self.app.set_interval(1.0, self.check_terminal, name="terminal-watchdog")

    def check_terminal(self) -> None:
        """The watchdog's tick: when a tty we started with is gone, stop drawing, drain and exit 130."""
        if self.lost or all(_is_terminal(fd) for fd in self.tty_fds):
            return
        log.warning("terminal went away: draining and exiting")
        self.on_terminal_lost()
        self.app.begin_quit("drain", interrupted="terminal lost")

    def on_terminal_lost(self) -> None:
        """Stop rendering, stop Textual's input thread (it would spin on a closed tty) and send its
        output nowhere (its writer thread dies on the first EIO and its bounded queue would then
        block the event loop on the 31st frame), so the drain runs and the process exits."""
        if self.lost:
            return
        self.lost = True
        driver = self.app._driver
        ev = getattr(driver, "exit_event", None)  # LinuxDriver's (Textual private API); headless has none
        if ev is not None:
            ev.set()
        _detach_output(getattr(driver, "_writer_thread", None))


def _is_terminal(fd: int) -> bool:
    """True when ``fd`` is a tty whose size can be read (a hung-up tty fails with EIO)."""
    try:
        os.get_terminal_size(fd)
        return os.isatty(fd)
    except (OSError, ValueError):
        return False


class _Discard:
    """A queue stand-in that drops what is put into it."""

    def put(self, item: object, *args: object, **kw: object) -> None:
        pass

    def qsize(self) -> int:
        return 0


def _detach_output(writer: Any) -> None:
    """Point Textual's output writer thread at nothing (private API; best effort)."""
    if writer is None or not hasattr(writer, "_queue"):
        return
    old = writer._queue
    writer._queue = _Discard()
    try:
        writer._file = open(os.devnull, "w")  # lives as long as the thread
    except OSError:
        pass
    try:
        old.put_nowait(None)  # a live writer thread ends; a dead one does not need it
    except Exception:  # queue.Full
        pass


def use_real_terminal_size() -> None:
    """Let Textual size itself from the terminal: it asks ``shutil.get_terminal_size()``, which trusts
    exported ``COLUMNS``/``LINES`` (stale after a tmux resize), so they are dropped when stdout is a
    real terminal."""
    try:
        if sys.__stdout__ is None:  # no stdout at all (pythonw, a closed descriptor)
            return
        os.get_terminal_size(sys.__stdout__.fileno())
        for var in ("COLUMNS", "LINES"):
            os.environ.pop(var, None)
    except (OSError, ValueError, AttributeError):
        pass
