"""The run's watch over its stream workers' liveness: frozen workers, and the line when one
answers again (the rules are :mod:`engine.stream.liveness`'s).

:class:`WorkerWatch` is driven by the pool: :meth:`WorkerWatch.loop` runs as a task, the pool's
reader calls :meth:`WorkerWatch.heard` for every frame and :meth:`WorkerWatch.heartbeat` for each
heartbeat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from engine.stream.liveness import HEARTBEAT_S, SILENT_S
from engine.stream.procs import WorkerProc

#: Heartbeats read after a worker's silence without a grown stopped time before the line saying it
#: answers again is logged anyway (its loop kept running: the silence was elsewhere).
THAW_HEARTBEATS = 3


class WorkerWatch:
    """Marks silent workers frozen and logs when they answer again.

    Args:
        workers: the pool's current workers (called each time: a replaced slot is seen).
        emit: ``emit(level, message)``, the pool's event line.
    """

    def __init__(self, workers: Callable[[], Sequence[WorkerProc]], emit: Callable[[str, str], None]) -> None:
        self._workers = workers
        self._emit = emit

    async def loop(self) -> None:
        """Every heartbeat period: mark the live workers silent for :data:`SILENT_S` frozen (one warning
        each). After a gap in this loop itself (the run's process was stopped), the workers' frames
        queued meanwhile are read first: nobody is judged on that tick."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            now = time.monotonic()
            gap, last = now - last, now
            if gap > 2 * HEARTBEAT_S + 1.0:
                for w in self._workers():
                    w.heard = max(w.heard, now)
                continue
            for w in self._workers():
                if w.alive and not w.frozen and now - w.heard >= SILENT_S:
                    w.frozen = True
                    self._emit("warning", (
                        f"stream worker {w.slot} (pid {w.pid}) has not answered for {now - w.heard:.0f}s "
                        f"(stopped or frozen): its {len(w.in_flight)} stream(s) wait for it, no new request "
                        f"goes to it; a stall is judged by the time it runs, not by this silence"))

    @staticmethod
    def heard(w: WorkerProc) -> None:
        """A frame of ``w`` was read now: a frozen worker gets requests again at once; the line saying
        so waits for the heartbeat that carries its stop's time (:meth:`heartbeat`)."""
        heard, w.heard = w.heard, time.monotonic()
        if w.frozen:
            w.frozen = False
            w.thaw = (w.heard - heard, w.thaw[1] if w.thaw is not None else w.stopped_s, 0)

    def heartbeat(self, w: WorkerProc, stopped_s: float) -> None:
        """Heartbeat of ``w`` saying its loop did not run for ``stopped_s`` seconds in all; after a
        silence, the line saying it answers again (:meth:`thawed`).

        The frames a worker sends first after a stop may come before the heartbeat that carries the
        stop (callbacks of the loop's iteration the stop interrupted run before the loop finds the gap),
        so the line waits for a heartbeat whose figure grew, or :data:`THAW_HEARTBEATS` heartbeats."""
        if w.thaw is not None:
            silent_s, before, n = w.thaw
            if stopped_s > before or n + 1 >= THAW_HEARTBEATS:
                w.thaw = None
                self.thawed(w, silent_s, stopped_s - before)
            else:
                w.thaw = (silent_s, before, n + 1)
        w.stopped_s = stopped_s

    def thawed(self, w: WorkerProc, silent_s: float, stopped_s: float) -> None:
        """Log that ``w`` answers again after ``silent_s`` seconds of silence (as the run saw it), its
        own loop having not run for ``stopped_s`` seconds of it (the worker's figure, this stop's)."""
        own = (f"its own loop did not run for {stopped_s:.1f}s (the worker's figure)" if stopped_s > 0 else
               "its own loop kept running (it was not stopped)")
        self._emit("info", f"stream worker {w.slot} (pid {w.pid}) answers again after {silent_s:.1f}s of silence; "
                           f"{own}, which its streams' stall and total timeouts leave out")


__all__ = ["THAW_HEARTBEATS", "WorkerWatch"]
