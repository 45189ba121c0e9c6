"""Several replicas of one model (``[provider] base_urls``): which endpoint takes the next request,
and each endpoint's health.

Pure logic: no I/O, no clock of its own (every method that needs the time takes ``now``, monotonic
seconds), no import from the rest of the project. The I/O around it (HTTP clients, health probes) is
:mod:`engine.client.fleet`.

**Selection** (:meth:`EndpointSet.pick`): among the ``healthy`` endpoints below their concurrency
cap, the one with the fewest requests in flight; ties go to the lowest index (the order of
``base_urls``), so light traffic keeps reusing the same warm connections. None when every healthy
endpoint is at its cap (the caller waits for a slot) or none is healthy.

**Health** (states ``healthy`` / ``draining`` / ``down``):

========================================================  ==========================================
event                                                     effect
========================================================  ==========================================
the endpoint could not be reached (connection refused,    ``down``: no new requests; probed after
reset before any response, a failed health probe)         ``probe_s``, doubling to ``probe_max_s``
``error_streak`` health errors in a row (5xx, timeout,    ``draining``: no new requests, those in
stall, protocol, a disconnect the endpoint survived)      flight finish; probed after the backoff
a probe answered                                          ``healthy`` again (streak reset)
a request completed                                       streak reset; the backoff back to
                                                          ``probe_s``
========================================================  ==========================================

Errors that say nothing about the endpoint's health (429, 4xx) are counted but leave the streak
alone. The backoff is reset only by a completed request, so an endpoint that answers its probe but
keeps failing requests is drained for longer each time.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["EndpointSet", "EndpointSnapshot", "EndpointState", "HEALTH_ERRORS", "HealthPolicy", "Endpoint",
           "StateChange"]

#: Error classes (:class:`engine.client.types.ErrorClass` values) that count toward an endpoint's
#: error streak: the server failed the request. ``connect`` takes the endpoint down at once instead.
HEALTH_ERRORS = frozenset({"server", "timeout", "stall", "protocol", "midstream", "disconnect"})

#: Latencies kept per endpoint for the percentiles (the most recent successes).
LATENCY_WINDOW = 500
#: Seconds of completed tokens kept for an endpoint's tokens/s.
RATE_WINDOW_S = 60.0


class EndpointState(str, enum.Enum):
    """An endpoint's health state (the value is what snapshots and ``status --json`` show)."""

    HEALTHY = "healthy"  # takes new requests
    DRAINING = "draining"  # an error streak: no new requests, those in flight finish; probed later
    DOWN = "down"  # unreachable: no new requests; probed with backoff

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """When an endpoint is drained and how soon it is probed again.

    Attributes:
        error_streak: health errors in a row (:data:`HEALTH_ERRORS`) that drain an endpoint (>= 1).
        probe_s: seconds before the first probe of an endpoint taken out of rotation (> 0).
        probe_max_s: the probe interval doubles after each failed probe (and each drain of an endpoint
            that has not completed a request since) up to this many seconds.
    """

    error_streak: int = 5
    probe_s: float = 1.0
    probe_max_s: float = 60.0

    def __post_init__(self) -> None:
        if self.error_streak < 1 or self.probe_s <= 0 or self.probe_max_s < self.probe_s:
            raise ValueError("error_streak >= 1, probe_s > 0 and probe_max_s >= probe_s")


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """One endpoint's figures at one moment (the dashboard's providers pane, ``status --json`` ``endpoints``).

    Attributes:
        url: the endpoint's API root (``base_urls`` entry).
        state: ``healthy`` | ``draining`` | ``down``; reason: why it is not healthy ("" when healthy).
        in_flight: requests on it now; concurrency: its cap (None: only the class limits).
        requests: requests sent to it since start (completed + failed); errors: failed ones by error class.
        error_rate: errors / requests (0.0 to 1.0).
        latency_p50_s / latency_p95_s: whole-request latency of its recent successes (s; None before one).
        tok_per_s: completion tokens per second it returned over the last 60 s.
        completion_tokens: completion tokens of its successes since start.
        state_for_s: seconds in the current state.
    """

    url: str
    state: str
    reason: str
    in_flight: int
    concurrency: int | None
    requests: int
    errors: dict[str, int]
    error_rate: float
    latency_p50_s: float | None
    latency_p95_s: float | None
    tok_per_s: float
    completion_tokens: int
    state_for_s: float


@dataclass(frozen=True, slots=True)
class StateChange:
    """An endpoint changed state: ``old`` -> ``new`` (:class:`EndpointState`) because of ``reason``."""

    url: str
    old: EndpointState
    new: EndpointState
    reason: str


@dataclass
class Endpoint:
    """The mutable state of one endpoint (owned by its :class:`EndpointSet`).

    Attributes:
        index: position in ``base_urls``; url: its API root; cap: its concurrency cap or None.
        state, reason, since: health state, why, and when it was entered (monotonic s).
        in_flight, requests, errors, completion_tokens: counters (see :class:`EndpointSnapshot`).
        streak: health errors in a row; backoff_s: the next probe interval; probe_at: when the next
            probe is due (monotonic s; only while not healthy).
    """

    index: int
    url: str
    cap: int | None
    state: EndpointState = EndpointState.HEALTHY
    reason: str = ""
    since: float = 0.0
    in_flight: int = 0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    completion_tokens: int = 0
    streak: int = 0
    backoff_s: float = 0.0
    probe_at: float = 0.0
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    tokens: deque = field(default_factory=deque)  # (monotonic s, completion tokens) of recent successes

    @property
    def usable(self) -> bool:
        """Healthy and below its cap: may take a new request now."""
        return self.state is EndpointState.HEALTHY and (self.cap is None or self.in_flight < self.cap)


def _quantile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank quantile (the definition of :mod:`engine.metrics.stats`), None when empty."""
    if not sorted_values:
        return None
    return sorted_values[max(1, math.ceil(q * len(sorted_values) - 1e-9)) - 1]


class EndpointSet:
    """The endpoints of one run, their selection and health.

    Args:
        endpoints: ``(url, cap)`` per endpoint, in ``base_urls`` order (cap None: no per-endpoint cap).
        policy: when to drain and probe (:class:`HealthPolicy`).
        now: monotonic seconds at creation (every endpoint starts ``healthy`` then).

    Raises:
        ValueError: no endpoint, a repeated url, or a cap below 1.
    """

    def __init__(self, endpoints: list[tuple[str, int | None]], policy: HealthPolicy | None = None,
                 now: float = 0.0) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint is needed")
        urls = [u for u, _ in endpoints]
        if len(set(urls)) != len(urls):
            raise ValueError("endpoint urls must be distinct")
        if any(c is not None and c < 1 for _, c in endpoints):
            raise ValueError("an endpoint's concurrency cap must be >= 1")
        self.policy = policy or HealthPolicy()
        self.endpoints = [Endpoint(i, u, c, since=now, backoff_s=self.policy.probe_s)
                          for i, (u, c) in enumerate(endpoints)]

    def __len__(self) -> int:
        return len(self.endpoints)

    # ---- selection ---------------------------------------------------------------------------
    def pick(self) -> Endpoint | None:
        """The healthy endpoint below its cap with the fewest requests in flight (ties: lowest index);
        None when there is none."""
        best: Endpoint | None = None
        for ep in self.endpoints:
            if ep.usable and (best is None or ep.in_flight < best.in_flight):
                best = ep
        return best

    def any_healthy(self) -> bool:
        """Whether any endpoint is healthy (at its cap or not): a request may wait for a slot."""
        return any(ep.state is EndpointState.HEALTHY for ep in self.endpoints)

    def start(self, ep: Endpoint) -> None:
        """A request was sent to ``ep`` (after :meth:`pick`)."""
        ep.in_flight += 1
        ep.requests += 1

    def finish(self, ep: Endpoint) -> None:
        """A request of ``ep`` ended, whatever its outcome (pairs with :meth:`start`)."""
        ep.in_flight -= 1

    # ---- outcomes ----------------------------------------------------------------------------
    def on_success(self, ep: Endpoint, now: float, latency_s: float, completion_tokens: int) -> None:
        """A request of ``ep`` completed in ``latency_s`` seconds with ``completion_tokens`` tokens."""
        ep.streak = 0
        ep.backoff_s = self.policy.probe_s
        ep.latencies.append(max(0.0, float(latency_s)))
        ep.completion_tokens += max(0, int(completion_tokens))
        ep.tokens.append((now, max(0, int(completion_tokens))))
        self._trim(ep, now)

    def on_error(self, ep: Endpoint, now: float, error_class: str) -> StateChange | None:
        """A request of ``ep`` failed with ``error_class`` (an :class:`~engine.client.types.ErrorClass`
        value) and the endpoint was reachable. Counts it; a streak of health errors drains a healthy
        endpoint. Returns the state change, if any."""
        ep.errors[error_class] = ep.errors.get(error_class, 0) + 1
        if error_class not in HEALTH_ERRORS:
            return None
        ep.streak += 1
        if ep.streak >= self.policy.error_streak and ep.state is EndpointState.HEALTHY:
            return self._leave(ep, now, EndpointState.DRAINING,
                               f"{ep.streak} errors in a row (last: {error_class})")
        return None

    def on_unreachable(self, ep: Endpoint, now: float, error_class: str, reason: str) -> StateChange | None:
        """A request of ``ep`` failed because the endpoint could not be reached (``reason``, e.g.
        "connection refused"): counted as ``error_class``, and the endpoint is ``down``."""
        ep.errors[error_class] = ep.errors.get(error_class, 0) + 1
        return self.mark_down(ep, now, reason)

    def mark_down(self, ep: Endpoint, now: float, reason: str) -> StateChange | None:
        """Take ``ep`` out of rotation as unreachable (``reason``); probed after its backoff."""
        if ep.state is EndpointState.DOWN:
            ep.reason = reason
            return None
        return self._leave(ep, now, EndpointState.DOWN, reason)

    def on_probe(self, ep: Endpoint, now: float, ok: bool, reason: str = "") -> StateChange | None:
        """The health probe of ``ep`` answered (``ok``) or failed (``reason``). A healthy endpoint's
        failed probe takes it down; a probed endpoint that answered is healthy again."""
        if ok:
            if ep.state is EndpointState.HEALTHY:
                return None
            old = ep.state
            ep.state, ep.reason, ep.since, ep.streak = EndpointState.HEALTHY, "", now, 0
            return StateChange(ep.url, old, EndpointState.HEALTHY, "health probe answered")
        if ep.state is EndpointState.HEALTHY:
            return self._leave(ep, now, EndpointState.DOWN, reason or "health probe failed")
        old = ep.state
        ep.probe_at = now + ep.backoff_s
        ep.backoff_s = min(ep.backoff_s * 2, self.policy.probe_max_s)
        ep.reason = reason or ep.reason
        if old is EndpointState.DRAINING:
            ep.state, ep.since = EndpointState.DOWN, now
            return StateChange(ep.url, old, EndpointState.DOWN, ep.reason)
        return None

    def _leave(self, ep: Endpoint, now: float, new: EndpointState, reason: str) -> StateChange:
        """Take ``ep`` out of rotation (``draining`` or ``down``); its probe is due after the backoff,
        which doubles for the next time."""
        old = ep.state
        ep.state, ep.reason, ep.since = new, reason, now
        ep.probe_at = now + ep.backoff_s
        ep.backoff_s = min(ep.backoff_s * 2, self.policy.probe_max_s)
        return StateChange(ep.url, old, new, reason)

    # ---- probes ------------------------------------------------------------------------------
    def due(self, now: float) -> list[Endpoint]:
        """The endpoints out of rotation whose probe is due at ``now``."""
        return [ep for ep in self.endpoints if ep.state is not EndpointState.HEALTHY and ep.probe_at <= now]

    def next_due(self) -> float | None:
        """When the next probe is due (monotonic s), or None when every endpoint is healthy."""
        times = [ep.probe_at for ep in self.endpoints if ep.state is not EndpointState.HEALTHY]
        return min(times) if times else None

    # ---- figures -----------------------------------------------------------------------------
    def _trim(self, ep: Endpoint, now: float) -> None:
        while ep.tokens and ep.tokens[0][0] < now - RATE_WINDOW_S:
            ep.tokens.popleft()

    def snapshot(self, now: float, start: float | None = None) -> tuple[EndpointSnapshot, ...]:
        """Every endpoint's figures at ``now`` (monotonic s), in ``base_urls`` order. ``start``: when
        counting began (tokens/s is over ``min(60 s, now - start)``; None: 60 s)."""
        out = []
        for ep in self.endpoints:
            self._trim(ep, now)
            lat = sorted(ep.latencies)
            span = RATE_WINDOW_S if start is None else min(RATE_WINDOW_S, max(now - start, 1e-9))
            n_err = sum(ep.errors.values())
            out.append(EndpointSnapshot(
                url=ep.url, state=ep.state.value, reason=ep.reason, in_flight=ep.in_flight, concurrency=ep.cap,
                requests=ep.requests, errors=dict(ep.errors), error_rate=n_err / ep.requests if ep.requests else 0.0,
                latency_p50_s=_quantile(lat, 0.5), latency_p95_s=_quantile(lat, 0.95),
                tok_per_s=sum(n for _, n in ep.tokens) / span, completion_tokens=ep.completion_tokens,
                state_for_s=max(0.0, now - ep.since),
            ))
        return tuple(out)
