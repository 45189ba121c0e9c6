"""Signals and the terminal: what the dashboard does when it is told to stop or loses its tty.

Textual installs no SIGTERM/SIGHUP handlers. :class:`TerminalMixin` adds them on the app's loop:
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
from typing import Any

from engine.runner import interrupt_action, run_stopping

log = logging.getLogger("datagen.dashboard")


class TerminalMixin:
    """Signal handlers and the terminal watchdog of :class:`tui.app.DashboardApp`."""

    def _add_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            try:
                loop.add_signal_handler(sig, self.on_signal, sig.name)
                self._signals.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    def _remove_signal_handlers(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for sig in self._signals:
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        self._signals.clear()

    def on_signal(self, signame: str) -> None:
        """SIGTERM/SIGINT/Ctrl-C: drain and exit 130 like quit; while any stop is in progress (an
        earlier signal, "Drain, then quit", an exit on pause): abort at once (``engine.runner.interrupt_action``).
        SIGHUP: the terminal is gone; stop drawing and reading it, then drain and exit."""
        host = self.host
        stopping = (self._signals_seen > 0 or (host is not None and host.quit_mode is not None)
                    or run_stopping(host.scheduler if host is not None else None)
                    or (host is None and self.snapshot is not None and self.snapshot.state in ("stopping", "stopped")))
        action = interrupt_action(signame, stopping)
        self._signals_seen += 1
        log.warning("%s received: %s", signame, {"drain": "draining", "abort": "aborting"}.get(
            action, "the stop in progress continues"))
        if signame == "SIGHUP":
            self.on_terminal_lost()
        if action != "continue":
            self.begin_quit(action, interrupted=signame)

    def action_interrupt(self) -> None:
        """Ctrl-C in the dashboard (a key in raw mode): drain and exit 130 like SIGINT; again: abort."""
        self.on_signal("Ctrl-C")

    def _start_terminal_watchdog(self) -> None:
        """Check every second that the ttys we started with are still terminals."""
        self._tty_fds = [fd for fd in (0, 1, 2) if _is_terminal(fd)]
        if self._tty_fds:
            self.set_interval(1.0, self._watch_terminal, name="terminal-watchdog")  # type: ignore[attr-defined]

    def _watch_terminal(self) -> None:
        if self.terminal_lost or all(_is_terminal(fd) for fd in self._tty_fds):
            return
        log.warning("terminal went away: draining and exiting")
        self.on_terminal_lost()
        self.begin_quit("drain", interrupted="terminal lost")

    def on_terminal_lost(self) -> None:
        """Stop rendering, stop Textual's input thread (it would spin on a closed tty) and send its
        output nowhere (its writer thread dies on the first EIO and its bounded queue would then
        block the event loop on the 31st frame), so the drain runs and the process exits."""
        if self.terminal_lost:
            return
        self.terminal_lost = True
        ev = getattr(self._driver, "exit_event", None)
        if ev is not None:
            ev.set()
        _detach_output(getattr(self._driver, "_writer_thread", None))


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
        writer._file = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the thread
    except OSError:
        pass
    try:
        old.put_nowait(None)  # a live writer thread ends; a dead one does not need it
    except Exception:  # noqa: BLE001 - queue.Full
        pass
