"""The anomaly guard: a dataset's error rate judged over attempts in dispatch order.

Pure logic: no I/O, no clocks. Errors often come back in a fraction of a second while successes
stream for seconds, so the first *outcomes* of a run are mostly errors: a window of outcomes in
completion order overstates the error rate (survivorship by duration). The guard therefore gives
each attempt a dispatch sequence number (:meth:`AnomalyGuard.dispatch`) and only counts an attempt
once every attempt dispatched before it has resolved too (:meth:`AnomalyGuard.resolve`): the
window holds the last ``window`` counted attempts of the fully resolved prefix of the dispatch
order, i.e. those dispatched before the oldest attempt still in flight. Whether an attempt is in
that prefix does not depend on its outcome, so the rate is unbiased.

Attempts resolved as ``None`` (rate limits, connect failures, run-wide errors, aborts, internal
errors) close their place in the dispatch order without being counted.
"""

from __future__ import annotations

from engine.metrics.stats import ErrorRateWindow


class _Key:
    """Dispatch-order bookkeeping of one key (dataset)."""

    __slots__ = ("next_seq", "frontier", "floor", "outcomes", "window")

    def __init__(self, window: int) -> None:
        self.next_seq = 0  # the sequence number the next dispatch gets
        self.frontier = 0  # the lowest sequence number not yet committed to the window
        self.floor = 0  # attempts below this were dispatched before a reset: never counted
        self.outcomes: dict[int, bool | None] = {}  # resolved, not yet committed (a gap before them)
        self.window = ErrorRateWindow(window)


class AnomalyGuard:
    """Fires once per key when the error rate of its resolved attempts is abnormal.

    Args:
        threshold: error fraction that must be *exceeded* (0.2 = 20%).
        window: counted attempts per key the rate is measured over (``spend.anomaly_window``).
        min_requests: counted attempts that must be in the window before the guard may fire.

    Raises:
        ValueError: threshold outside ``[0, 1)``, ``window < 1`` or ``min_requests`` outside
            ``[1, window]``.
    """

    def __init__(self, threshold: float = 0.2, window: int = 200, min_requests: int = 50) -> None:
        if not 0.0 <= threshold < 1.0:
            raise ValueError("threshold must be in [0, 1)")
        if window < 1:
            raise ValueError("window must be >= 1")
        if not 1 <= min_requests <= window:
            raise ValueError("min_requests must be in [1, window]")
        self.threshold = threshold
        self.window = window
        self.min_requests = min_requests
        self._keys: dict[str, _Key] = {}
        self._fired: set[str] = set()

    def _key(self, key: str) -> _Key:
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = _Key(self.window)
        return k

    def dispatch(self, key: str) -> int:
        """Note that an attempt of ``key`` was sent; returns its sequence number (0, 1, 2, ...),
        to be passed to :meth:`resolve` exactly once when its outcome is known."""
        k = self._key(key)
        seq = k.next_seq
        k.next_seq += 1
        return seq

    def resolve(self, key: str, seq: int, is_error: bool | None) -> str | None:
        """Record the outcome of attempt ``seq`` of ``key``: True (an error that counts), False (a
        success) or None (closes its place without counting). Resolving an attempt twice, or one
        never dispatched, changes nothing (the first resolution wins).

        Returns:
            A reason such as ``"error rate 34% over the last 200 attempts in dispatch order
            exceeds 20%"`` the first time the rate over the window (holding >= ``min_requests``
            counted attempts) exceeds the threshold; None otherwise, including every later call
            until :meth:`reset`.
        """
        k = self._key(key)
        if seq < k.frontier or seq >= k.next_seq or seq in k.outcomes:
            return None
        k.outcomes[seq] = is_error
        while k.frontier in k.outcomes:
            outcome = k.outcomes.pop(k.frontier)
            if outcome is not None and k.frontier >= k.floor:
                k.window.add(outcome)
            k.frontier += 1
        return self._judge(key, k.window)

    def record(self, key: str, is_error: bool) -> str | None:
        """Dispatch and resolve one attempt at once (an outcome with nothing else in flight); see
        :meth:`resolve`."""
        return self.resolve(key, self.dispatch(key), is_error)

    def _judge(self, key: str, w: ErrorRateWindow) -> str | None:
        if key in self._fired or w.count < self.min_requests or w.rate <= self.threshold:
            return None
        self._fired.add(key)
        limit = f"{self.threshold:.0%}"
        shown = f"{w.rate:.0%}"
        if shown == limit:  # 20.2% must not read "20% exceeds 20%"
            shown = f"{w.rate:.1%}"
        return f"error rate {shown} over the last {w.count} attempts in dispatch order exceeds {limit}"

    def rate(self, key: str) -> float:
        """Current windowed error fraction for ``key`` (0.0 when nothing counted)."""
        k = self._keys.get(key)
        return k.window.rate if k is not None else 0.0

    def pending(self, key: str) -> int:
        """Attempts of ``key`` dispatched but not yet counted or skipped (in flight, or resolved
        behind one still in flight)."""
        k = self._keys.get(key)
        return 0 if k is None else k.next_seq - k.frontier

    def reset(self, key: str) -> None:
        """Re-arm the guard for ``key`` and forget its window (a resumed run is measured afresh):
        attempts dispatched before the reset are never counted."""
        self._fired.discard(key)
        k = self._keys.get(key)
        if k is not None:
            k.window = ErrorRateWindow(self.window)
            k.floor = k.next_seq


__all__ = ["AnomalyGuard"]
