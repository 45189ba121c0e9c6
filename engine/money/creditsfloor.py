"""The credits floor as a run-wide dollar budget checked before each dispatch.

Pure bookkeeping (no I/O, no clocks). ``credits - spend.credits_floor_usd`` is what the run may
still commit: a request is dispatched only when

    credits left - dollars held by requests in flight - this request's expected cost >= floor

where *credits left* is the last credits reading minus what this process accounted as spent since
that reading (USD). Each dispatched request holds its expected cost (the same completion estimate
its budget reservation uses, priced at the best known prices) until it settles or is released.
A request that fits only once the holds of requests in flight are freed waits for them; one that does
not fit even with nothing in flight pauses the run (:class:`CreditsFloorReached`). Before the first
credits reading, or when the provider reports no limit, nothing is refused.
"""

from __future__ import annotations

from engine.errors import DatagenError


class CreditsFloorReached(DatagenError):
    """Dispatching the next request would take credits below ``spend.credits_floor_usd``; the
    message is the run's pause reason (``"credits floor: ..."``)."""


class CreditsHolds:
    """Dollars held by requests in flight against the provider credits left above the floor.

    Args:
        floor_usd: ``spend.credits_floor_usd`` (USD, >= 0).
    """

    def __init__(self, floor_usd: float) -> None:
        self.floor_usd = float(floor_usd)
        self._remaining: float | None = None  # credits at the last reading (USD), None: unknown/unlimited
        self._spent_at_reading = 0.0  # USD accounted by this process when it was taken
        self._open: dict[int, float] = {}
        self._held = 0.0

    @property
    def held_usd(self) -> float:
        """Sum of the holds of requests in flight (USD)."""
        return self._held

    def on_reading(self, remaining_usd: float | None, spent_usd: float) -> None:
        """Record a credits reading: ``remaining_usd`` credits left (USD; None: no limit reported),
        taken when this process had accounted ``spent_usd`` (USD) as spent."""
        self._remaining = remaining_usd
        self._spent_at_reading = spent_usd

    def left_usd(self, spent_usd: float) -> float | None:
        """Credits left now (USD): the last reading minus what was spent since (``spent_usd`` is the
        process's accounted spend now); None before a reading or without a limit."""
        if self._remaining is None:
            return None
        return self._remaining - max(0.0, spent_usd - self._spent_at_reading)

    def check(self, amount_usd: float, spent_usd: float) -> bool:
        """Whether a request of expected cost ``amount_usd`` (USD) fits above the floor now.

        Returns:
            True: ``left - held - amount >= floor`` (or no reading/limit); False: it fits only once
            requests in flight settle and free their holds (wait for them).

        Raises:
            CreditsFloorReached: ``left - amount < floor``: it cannot fit even with nothing in flight
                (message: the pause reason).
        """
        left = self.left_usd(spent_usd)
        if left is None:
            return True
        if left - amount_usd < self.floor_usd:
            raise CreditsFloorReached(
                f"credits floor: ${left:.4f} left minus ${amount_usd:.4f} for the next request is below "
                f"credits_floor_usd ${self.floor_usd:.2f}")
        return left - self._held - amount_usd >= self.floor_usd

    def hold(self, key: int, amount_usd: float) -> None:
        """Hold ``amount_usd`` (USD) for the dispatched request identified by ``key``."""
        amount = max(0.0, float(amount_usd))
        self._open[key] = amount
        self._held += amount

    def close(self, key: int) -> None:
        """Drop the hold of ``key`` (its request settled or was released); no-op when none."""
        amount = self._open.pop(key, None)
        if amount is not None:
            self._held = self._held - amount if self._open else 0.0
