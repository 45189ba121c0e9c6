"""Child processes that survive the terminal: the parent alone decides when they stop.

A terminal sends Ctrl-C (SIGINT), Ctrl-\\ (SIGQUIT) and hang-up (SIGHUP) to its whole foreground
process group, and ``kill -TERM -PGID`` reaches every member: without care, a worker process of the
run dies of the user's Ctrl-C (``BrokenProcessPool``) while the parent is still draining.

- :func:`spawn_context` is a ``multiprocessing`` spawn context whose processes are born with
  :data:`TERMINAL_SIGNALS` blocked (the mask is inherited across fork and exec, so there is no
  window in which a signal can kill the child before it has set up); the child's first act,
  :func:`quiet_child`, ignores those signals, unblocks them and asks the kernel for SIGKILL when
  its parent dies (Linux), so nothing outlives a ``kill -9`` of the run.
- :func:`spawn_guard` wraps anything that may start the ``multiprocessing`` resource tracker
  (creating a pool, its queues or locks): the tracker is born with those signals blocked too, and
  it can be started while a dashboard has replaced ``sys.stderr`` with an object without a real
  file descriptor (``multiprocessing`` passes ``sys.stderr.fileno()`` to the tracker, and ``-1``
  fails with ``ValueError: bad value(s) in fds_to_keep``).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.context
import multiprocessing.popen_spawn_posix  # SpawnProcess needs it on POSIX
import os
import signal
import sys
import threading
from typing import Any, Iterator

#: Signals a terminal or a process-group kill delivers to every member of the group.
TERMINAL_SIGNALS: frozenset[signal.Signals] = frozenset(
    s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")) if s is not None)

_HAVE_MASK = hasattr(signal, "pthread_sigmask")
_guard_lock = threading.RLock()


def _fd_ok(stream: Any) -> bool:
    try:
        fd = stream.fileno()
        if not isinstance(fd, int) or fd < 0:
            return False
        os.fstat(fd)
        return True
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return False


@contextlib.contextmanager
def spawn_guard() -> Iterator[None]:
    """While inside: :data:`TERMINAL_SIGNALS` are blocked in this thread (processes started here
    inherit the mask; a signal sent meanwhile stays pending for the parent and is handled on exit),
    and ``sys.stderr`` has a real file descriptor (``sys.__stderr__`` or ``/dev/null``) when the
    current one has none. Re-entrant; the previous mask and stream are restored on exit."""
    with _guard_lock:
        swapped = None
        devnull = None
        if not _fd_ok(sys.stderr):
            swapped = sys.stderr
            if sys.__stderr__ is not None and _fd_ok(sys.__stderr__):
                sys.stderr = sys.__stderr__
            else:
                devnull = open(os.devnull, "w")  # closed below
                sys.stderr = devnull
        old = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS) if _HAVE_MASK else None
        try:
            # The tracker's own start-up unblocks SIGINT/SIGTERM in this thread when it is done:
            # start it first, then block again for whatever is spawned next.
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
            if _HAVE_MASK:
                signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
            yield
        finally:
            if old is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            if swapped is not None:
                sys.stderr = swapped
            if devnull is not None:
                devnull.close()


def quiet_child(parent_pid: int | None = None) -> None:
    """First call in a child process: ignore :data:`TERMINAL_SIGNALS` (the parent decides when the
    child stops), unblock them (pending ones are discarded), and die with the parent (Linux
    ``PR_SET_PDEATHSIG``; if ``parent_pid`` is given and the parent is already gone, exit now)."""
    for s in TERMINAL_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if _HAVE_MASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINAL_SIGNALS)
    die_with_parent()
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent ends (Linux only; no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class QuietProcess(multiprocessing.context.SpawnProcess):
    """A spawn-context process started under :func:`spawn_guard` (born with terminal signals
    blocked). Its target should call :func:`quiet_child` first (pool initializers do)."""

    def start(self) -> None:
        with spawn_guard():
            super().start()


class QuietSpawnContext(multiprocessing.context.SpawnContext):
    """The spawn context with :class:`QuietProcess` (pass as ``mp_context`` to a pool)."""

    Process = QuietProcess


def spawn_context() -> QuietSpawnContext:
    """A spawn context whose processes are born immune to terminal signals (see module doc)."""
    return QuietSpawnContext()


__all__ = ["TERMINAL_SIGNALS", "QuietSpawnContext", "die_with_parent", "quiet_child", "spawn_context", "spawn_guard"]
