"""The stream workers' figures: what the pool (:mod:`engine.stream.pool`) reports for snapshots,
``status --json`` and the dashboard's header. Plain values, no I/O."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerFigures:
    """One worker now: its slot, process id (0 before it exists), whether it is up, requests in
    flight; ``frozen``: up but not heard from for :data:`~engine.stream.liveness.SILENT_S` (stopped,
    or its loop blocked), ``silent_s``: seconds since it was last heard (0.0 while answering);
    ``unsent``: its requests not sent yet (handed to it, bytes not started to go out), as of its
    last heartbeat."""

    slot: int
    pid: int
    alive: bool
    in_flight: int
    frozen: bool = False
    silent_s: float = 0.0
    unsent: int = 0


@dataclass(frozen=True, slots=True)
class PoolFigures:
    """The pool now (for snapshots, ``status --json`` and the header).

    Attributes:
        configured: ``[run] stream_workers``. alive: workers up now. restarts: workers replaced since
        start. lost_requests: requests returned to pending by a worker's death. recovered: completions a
        dead worker had journaled, delivered from its journal. workers: per worker. frozen: workers
        up but silent (see :class:`WorkerFigures`). held_back: requests held unsent by a pause or skip
        (returned to pending, nothing sent). unsent_peak: the most requests one worker had waiting
        unsent at once (between two of its heartbeats), since start.
    """

    configured: int
    alive: int
    restarts: int
    lost_requests: int
    recovered: int
    workers: tuple[WorkerFigures, ...] = ()
    frozen: int = 0
    held_back: int = 0
    unsent_peak: int = 0


__all__ = ["PoolFigures", "WorkerFigures"]
