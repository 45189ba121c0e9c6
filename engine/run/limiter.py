"""A concurrency limiter whose capacity can change while requests are in flight."""

from __future__ import annotations

import asyncio

#: ``+`` and ``datagen ctl concurrency`` may raise a class to this many times its configured concurrency.
CONCURRENCY_FACTOR = 4
#: ... and always to at least this many (a class configured at 2 may still go to 16).
CONCURRENCY_FLOOR_CAP = 16
#: The absolute maximum, the config's own upper bound for ``[classes.NAME] concurrency``.
CONCURRENCY_MAX = 100_000


def concurrency_cap(configured: int) -> int:
    """Highest concurrency a class configured at ``configured`` may be set to while running:
    ``max(4 x configured, 16)``, at most 100,000 (requests). The lowest is 1: stopping dispatch
    is a pause (``P`` / ``datagen ctl RUN pause``), shown as such, not a silent 0."""
    return min(CONCURRENCY_MAX, max(CONCURRENCY_FACTOR * configured, CONCURRENCY_FLOOR_CAP))


def check_concurrency(cls: str, n: int, configured: int) -> None:
    """Raise ``ValueError`` naming the class and the allowed range unless ``1 <= n <= cap``."""
    cap = concurrency_cap(configured)
    if n < 1:
        raise ValueError(f"concurrency of class {cls} must be at least 1, got {n}; to stop dispatching, "
                         f"pause the run or a dataset (P / p in the dashboard, `datagen ctl RUN_DIR pause [DATASET]`)")
    if n > cap:
        raise ValueError(f"concurrency of class {cls} may be at most {cap:,} ({CONCURRENCY_FACTOR}x the configured "
                         f"{configured:,}, at least {CONCURRENCY_FLOOR_CAP}), got {n:,}; raise "
                         f"[classes.{cls}] concurrency in the config to go higher")


class AdjustableLimiter:
    """Like ``asyncio.Semaphore`` but with a live-settable capacity.

    Lowering the capacity never cancels anything: in-flight holders finish and new acquisitions
    wait until ``in_use < capacity``. Fair (FIFO) for waiters.

    Args:
        capacity: maximum holders at once (>= 0; 0 blocks every acquire).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self._capacity = capacity
        self._in_use = 0
        self._cond = asyncio.Condition()

    @property
    def capacity(self) -> int:
        """Current capacity (requests)."""
        return self._capacity

    @property
    def in_use(self) -> int:
        """Current holders (requests in flight)."""
        return self._in_use

    async def set_capacity(self, capacity: int) -> None:
        """Change the capacity; waiters are woken when it grows."""
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        async with self._cond:
            self._capacity = capacity
            self._cond.notify_all()

    async def acquire(self) -> None:
        """Wait until a slot is free and take it."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._in_use < self._capacity)
            self._in_use += 1

    def try_acquire(self) -> bool:
        """Take a slot without waiting; False when full."""
        if self._in_use < self._capacity:
            self._in_use += 1
            return True
        return False

    def release(self) -> None:
        """Give a slot back (synchronous; wakes one waiter on the loop)."""
        if self._in_use <= 0:
            raise RuntimeError("release() without acquire()")
        self._in_use -= 1
        asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        async with self._cond:
            self._cond.notify(1)
