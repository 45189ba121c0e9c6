"""Whether a run's engine is still there, and the live figures ``datagen status`` computes when it
reads the store (not as the engine last wrote them): the engine's liveness from its heartbeat and
the run directory's lock, and the spend rate with the dashboard's definition.
"""

from __future__ import annotations

from typing import Any

from engine.metrics.rates import SPEND_WINDOW_S, window_rate
from engine.proc.pids import pid_alive
from engine.proc.runlock import Holder
from engine.storage.dollars import spend_window
from engine.storage.handle import Handle

#: Seconds without a heartbeat after which a run is considered not running (unless its engine
#: still holds the run directory's lock).
STALE_S = 15.0


def engine_alive(pid: int | None, heartbeat_at: float | None, lock: Holder | None, now: float) -> bool:
    """Whether the run's engine (the ``runtime`` row's ``pid``) is still there: a live process that
    either committed within :data:`STALE_S` of ``now`` (wall clock, s) or holds the run directory's
    lock (``lock``: :func:`engine.proc.runlock.holder`). The lock covers a ``datagen run`` whose run
    has ended while its dashboard stays open ("run ended: press q"): it no longer commits, yet it is
    the live holder, and ``status`` says so (``run.pid``, ``alive``) as it says ``lock``."""
    if pid is None or not pid_alive(pid):
        return False
    fresh = heartbeat_at is not None and now - heartbeat_at < STALE_S
    return fresh or (lock is not None and lock.pid == pid)


def spend_rate(conn: Handle, live: dict[str, Any], now: float, in_flight: int) -> float | None:
    """This engine's spend over the last :data:`~engine.metrics.rates.SPEND_WINDOW_S` seconds (USD
    per hour) at ``now`` (wall clock, s), from the store: results at their ``created_at``, failed and
    aborted attempts at their ``ended_at`` (the bills of :mod:`engine.storage.dollars`), since the
    window's start the engine recorded
    (``spend_rate_since``, its first dispatch); the dashboard's figure
    (:meth:`engine.run.telemetry.Telemetry.spend_rate_usd_per_h`) at the same moment. None while
    nothing was billed since that start and requests are in flight. An engine that recorded no
    start: its own last figure."""
    if "spend_rate_since" not in live:
        return live.get("spend_rate_usd_per_h", 0.0)
    t0 = live["spend_rate_since"]
    if t0 is None:
        return None if in_flight else 0.0
    since = max(t0, now - SPEND_WINDOW_S)
    window, total = spend_window(conn, t0, since)
    if total <= 0:
        return None if in_flight else 0.0
    return window_rate(window, now, t0, SPEND_WINDOW_S) * 3600.0
