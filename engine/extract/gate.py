"""What a worker checks between batches: the control file (:mod:`engine.extract.control`) and the
drain/abort its signals asked for. Pausing flushes the shards in hand first, so a paused worker holds
no unwritten batch."""

from __future__ import annotations

import logging
import threading
from typing import Any

from engine.extract.control import ControlReader
from engine.extract.snapshot import WorkerState
from engine.extract.status import StatusWriter

log = logging.getLogger("engine.extract.worker")

#: How often a paused worker re-reads the control file (seconds).
PAUSE_POLL_S = 0.2


class Gate:
    """What a worker checks between batches: the control file, plus the signals' drain/abort flags.

    Args:
        reader: the job's :class:`ControlReader`; status: the worker's status writer.
        stop: set on abort (the writer drops what it has not started; a disk wait ends).
        drain: set by the first SIGTERM/SIGINT (same as a ``drain`` quit).
    """

    def __init__(self, reader: ControlReader, status: StatusWriter, stop: threading.Event,
                 drain: threading.Event | None = None) -> None:
        self.reader, self.status, self.stop = reader, status, stop
        self.drain = drain or threading.Event()
        self.skipped: set[str] = set()

    def _read(self) -> Any:
        c = self.reader.read()
        for ds in c.skip:
            if ds not in self.skipped:
                self.skipped.add(ds)
                self.status.skip_dataset(ds)
                log.info("dataset %s skipped: its pending samples are dropped", ds)
        if c.quit == "abort":
            self.stop.set()
        if c.quit == "drain":
            self.drain.set()
        return c

    def aborting(self) -> bool:
        """True when an abort was asked (never waits: for the batch in hand, which is written before any pause)."""
        self._read()
        return self.stop.is_set()

    def check(self, flush: Any = None) -> str | None:
        """Before a batch: ``"abort"``/``"drain"`` when the worker should stop, else None. While the
        control says paused, ``flush()`` the shards in hand, report ``paused`` and wait."""
        c = self._read()
        if self.stop.is_set():
            return "abort"
        if self.drain.is_set():
            return "drain"
        if not c.paused:
            return None
        if flush is not None:
            flush()
        self.status.set_state(WorkerState.PAUSED, "paused by user")
        while True:
            if self.stop.wait(PAUSE_POLL_S):
                return "abort"
            c = self._read()
            if self.stop.is_set():
                return "abort"
            if self.drain.is_set():
                return "drain"
            if not c.paused:
                self.status.set_state(WorkerState.RUNNING)
                return None


__all__ = ["Gate", "PAUSE_POLL_S"]
