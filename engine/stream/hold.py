"""What a pause or skip holds back: the run's hold state, as the stream workers apply it.

A :class:`Hold` names what may not leave: every request (the run paused) or those of some datasets
(paused, skipped, budget met). The run sends the whole state to each worker in one ``hold`` frame
(:meth:`engine.stream.pool.StreamWorkerPool.hold`); the worker cuts the requests it covers whose
bytes have not started to go out (:mod:`engine.stream.worker`). Plain values, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.client.types import ChatRequest


@dataclass(frozen=True, slots=True)
class Hold:
    """The hold state. ``run``: every request is held; ``datasets``: the requests of these datasets
    are (``ChatRequest.ref[1]``). ``Hold()`` holds nothing (the release)."""

    run: bool = False
    datasets: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return self.run or bool(self.datasets)

    def covers(self, req: ChatRequest) -> bool:
        """Whether ``req`` is held: the run is, or its dataset is (a request without ``ref`` only by the run's)."""
        return self.run or (bool(self.datasets) and req.ref is not None and req.ref[1] in self.datasets)


__all__ = ["Hold"]
