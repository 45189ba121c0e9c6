"""The stream-worker processes as the run sees them: one record per slot, how a process is started,
and what a dead one left in its journal.

:class:`StreamWorkerPool <engine.stream.pool.StreamWorkerPool>` owns one :class:`WorkerProc` per
slot (``[run] stream_workers``), starts it with :func:`start_process` and, when it dies, answers its
open requests from :func:`journaled`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.client.types import Completion
from engine.errors import DatagenError
from engine.proc.childproc import TERMINAL_SIGNALS
from engine.stream import journal
from engine.stream.wire import encode


class WorkersNotStarted(DatagenError, RuntimeError):
    """The stream workers could not be started: a worker did not answer within the start limit (its
    stderr is in ``RUN_DIR/stream-workers.log``), or ``DATAGEN_STREAM_HTTP`` names no usable library.
    The CLI prints the message as one ``error:`` line."""


def default_stream_workers() -> int:
    """One stream worker per core beyond the first (the first runs the control plane and the
    dashboard), at least 1: ``max(1, usable cores - 1)``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


class WorkerProc:
    """One worker slot: its process, its socket's two ends, the requests it serves, its liveness.

    Attributes:
        slot: index in the pool. proc / pid: the process (None / 0 before it starts).
        in_flight: request ids handed to it and not answered.
        alive: started and not found dead. heard: when a frame of it was last read (monotonic s).
        frozen: silent for :data:`~engine.stream.liveness.SILENT_S` while alive (warned once).
        stopped_s: the time its own loop did not run in all, as its last heartbeat said (s).
        thaw: after a silence, until the heartbeat with the stop's time is read: (the silence as the
            run saw it (s), ``stopped_s`` before the stop (s), heartbeats read since without it).
        unsent: its requests not sent yet, as its last heartbeat said.
    """

    __slots__ = ("slot", "proc", "pid", "reader", "writer", "in_flight", "alive", "task", "heard", "frozen",
                 "stopped_s", "thaw", "unsent")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.in_flight: set[int] = set()
        self.alive = False
        self.task: asyncio.Task | None = None
        self.heard = time.monotonic()
        self.frozen = False
        self.stopped_s = 0.0
        self.thaw: tuple[float, float, int] | None = None
        self.unsent = 0

    def running(self) -> bool:
        """Whether its process exists and was not reaped (starting, up, or dead and not yet noticed)."""
        return self.proc is not None and self.proc.returncode is None

    def send(self, msg: tuple) -> None:
        """Write one frame to it (dropped when its socket is closing)."""
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(encode(msg))


def _stderr(run_dir: Path | None):
    if run_dir is None:
        return subprocess.DEVNULL
    fd = os.open(run_dir / "stream-workers.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab")


def start_process(run_dir: Path | None) -> tuple[subprocess.Popen, socket.socket]:
    """Start one ``python -m engine.stream.worker`` process connected by a socket pair; returns the
    process and the run's end of the socket. The child is born with the terminal's signals blocked
    (a Ctrl-C reaches the run only) and writes its stderr to ``RUN_DIR/stream-workers.log`` (0600;
    discarded without a run directory).

    Raises:
        OSError: the process could not be started."""
    ours, theirs = socket.socketpair()
    err = _stderr(run_dir)
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "engine.stream.worker", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                close_fds=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
        if err is not subprocess.DEVNULL:
            err.close()
    return proc, ours


def journaled(jdir: Path, prefix: str, rids: set[int]) -> dict[int, Completion]:
    """The completions of requests ``rids`` in the journal segments starting with ``prefix``
    (a dead worker's ``w{slot}-{pid}-``); unreadable records are skipped."""
    out: dict[int, Completion] = {}
    for seg in journal.segments(jdir, prefix):
        for rec in journal.read_records(seg):
            rid = rec.get("rid")
            if rid in rids:
                try:
                    out[rid] = journal.completion_from_dict(rec["c"])
                except (KeyError, TypeError, ValueError):
                    continue
    return out


def owned(path: Path, pids: set[int]) -> bool:
    """Whether journal file ``path`` (a segment or a ledger) was written by one of the processes ``pids``."""
    owner = journal.file_owner(path)
    return owner is not None and owner[1] in pids


def open_segment(path: Path, workers: list[WorkerProc]) -> bool:
    """Whether journal segment ``path`` may still be written: the newest segment of one of ``workers``
    whose process exists (starting, up, or dead and not yet reaped), empty or not."""
    owner = journal.file_owner(path)
    if owner is None or not path.name.endswith(".jsonl"):
        return False
    for w in workers:
        if w.pid == owner[1] and w.slot == owner[0] and w.running():
            names = [p.name for p in journal.segments(path.parent, f"w{w.slot}-{w.pid}-")]
            return not names or path.name >= max(names)
    return False


__all__ = ["WorkerProc", "WorkersNotStarted", "default_stream_workers", "journaled", "open_segment", "owned", "start_process"]
