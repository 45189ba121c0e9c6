"""Whether a stream worker runs: its heartbeat, and the time its own loop was not running.

Two views of one fact, a worker process that stops (``SIGSTOP``, a debugger, a host under memory
pressure swapping it out, a loop blocked by a long call):

- **From the run** (:mod:`engine.stream.pool`): every worker sends a heartbeat frame every
  :data:`HEARTBEAT_S`; a live worker not heard from for :data:`SILENT_S` is *frozen*: shown so in
  the pool's figures (``status``, ``status --json``, the dashboard's header), warned about once per
  silence, and given no new request while it lasts. It is not replaced: its streams' bytes wait in
  its sockets, and it reads them when it runs again.
- **Inside the worker** (:mod:`engine.stream.worker`): its loop's clock counts only the time the
  loop ran (:class:`FreezeClock`). Every timeout of the worker (the stall timeout, ``no bytes for
  stall_s``, and the total timeout) is measured on that clock, so a stream is judged stalled by its
  socket's silence while the worker could read it, never by the time the process was stopped; on
  wake-up the bytes that arrived meanwhile are read before any timer is due.

Pure: no I/O, the caller gives the times (``time.monotonic()`` seconds).
"""

from __future__ import annotations

#: Seconds between a worker's heartbeat frames.
HEARTBEAT_S = 1.0
#: A live worker not heard from for this long (s) is shown frozen (several heartbeats missed).
SILENT_S = 5.0
#: A gap of this many seconds in which the worker's loop did not run (stopped, or blocked) is
#: left out of its clock: below it, the gap is ordinary scheduling and counts.
FREEZE_S = 1.0


class FreezeClock:
    """The time an event loop was not running, found from around each wait for I/O.

    The loop calls :meth:`observe` after every wait (``select``) with the monotonic times before and
    after it and the timeout it asked for. The loop was not running for the time between two waits
    (its callbacks, normally milliseconds) plus whatever a wait overslept its timeout; a gap of at
    least ``threshold_s`` is added to :attr:`frozen_s`. A loop always has a timer due within a
    second (the heartbeat), so a wait never legitimately lasts longer than that.

    Attributes:
        frozen_s: total seconds the loop was found not running. freezes: how many such gaps.
        last_gap_s: the latest gap (s).
    """

    __slots__ = ("threshold_s", "frozen_s", "freezes", "last_gap_s", "_last")

    def __init__(self, threshold_s: float = FREEZE_S) -> None:
        self.threshold_s = threshold_s
        self.frozen_s = 0.0
        self.freezes = 0
        self.last_gap_s = 0.0
        self._last: float | None = None

    def observe(self, before: float, after: float, timeout: float | None) -> float:
        """One wait for I/O from ``before`` to ``after`` (s) asked to last at most ``timeout`` (s;
        None: no limit). Returns the gap added to :attr:`frozen_s` (0.0 when none)."""
        last, self._last = self._last, after
        if last is None:
            return 0.0
        over = (after - before) - timeout if timeout is not None else 0.0
        gap = max(0.0, before - last) + max(0.0, over)
        if gap < self.threshold_s:
            return 0.0
        self.frozen_s += gap
        self.freezes += 1
        self.last_gap_s = gap
        return gap


def is_silent(now: float, heard: float, limit_s: float = SILENT_S) -> bool:
    """Whether a worker last heard at ``heard`` is frozen at ``now`` (monotonic s)."""
    return now - heard >= limit_s


__all__ = ["FREEZE_S", "HEARTBEAT_S", "SILENT_S", "FreezeClock", "is_silent"]
