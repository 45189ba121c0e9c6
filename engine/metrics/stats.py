"""Windowed statistics: quantiles, error rates, per-provider figures (the error-rate guard is
:mod:`engine.run.anomaly`).

Pure logic: no I/O, no clocks (durations are passed in, in seconds). Every window keeps the last
``size`` values so a figure shown as "p95 latency" always means "over the last N requests"; the
all-time counters (requests, errors, cost) are kept apart and named as such.

Quantiles use the **nearest-rank** definition: for ``n`` sorted values ``v[1] <= ... <= v[n]`` the
``q``-quantile is ``v[max(1, ceil(q * n))]``, always one of the observed values (no interpolation).
So the p90 of ``1..100`` is ``90`` and the median of ``[1, 2, 3, 4]`` is ``2``.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

UNKNOWN_PROVIDER = "(unknown)"
"""Provider name used for results/errors that carry no provider."""


def nearest_rank(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank ``q``-quantile of already-sorted values; None when empty.

    Raises:
        ValueError: ``q`` outside ``[0, 1]``.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q!r}")
    n = len(sorted_values)
    if n == 0:
        return None
    # The epsilon keeps float noise (0.07 * 100 = 7.000000000000001) from bumping the rank.
    rank = max(1, math.ceil(q * n - 1e-9))
    return sorted_values[rank - 1]


class QuantileWindow:
    """The last ``size`` values, kept sorted for quantiles (``O(log size)`` search per add, plus a
    ``memmove`` of at most ``size`` pointers; cheap for the sizes used here).

    Args:
        size: number of most recent values kept (>= 1).

    Raises:
        ValueError: ``size < 1``.
    """

    __slots__ = ("size", "_fifo", "_sorted", "_sum")

    def __init__(self, size: int = 1000) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self.size = int(size)
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []
        self._sum = 0.0

    def add(self, x: float) -> None:
        """Add one value (any unit); evicts the oldest once ``size`` values are held.

        Raises:
            ValueError: ``x`` is NaN or infinite.
        """
        x = float(x)
        if not math.isfinite(x):
            raise ValueError(f"value must be finite, got {x!r}")
        if len(self._fifo) == self.size:
            old = self._fifo.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
            self._sum -= old
        self._fifo.append(x)
        insort(self._sorted, x)
        self._sum += x

    def quantile(self, q: float) -> float | None:
        """Nearest-rank ``q``-quantile (``0 <= q <= 1``) of the window; None when empty.

        Raises:
            ValueError: ``q`` outside ``[0, 1]``.
        """
        return nearest_rank(self._sorted, q)

    @property
    def count(self) -> int:
        """Number of values in the window (<= ``size``)."""
        return len(self._fifo)

    @property
    def mean(self) -> float | None:
        """Mean of the values in the window; None when empty."""
        if not self._fifo:
            return None
        return self._sum / len(self._fifo)


class ErrorRateWindow:
    """The last ``size`` request outcomes (error or not).

    Args:
        size: number of most recent outcomes kept (>= 1).

    Raises:
        ValueError: ``size < 1``.
    """

    __slots__ = ("size", "_fifo", "_errors")

    def __init__(self, size: int = 200) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self.size = int(size)
        self._fifo: deque[bool] = deque()
        self._errors = 0

    def add(self, is_error: bool) -> None:
        """Record one outcome; evicts the oldest once ``size`` are held."""
        if len(self._fifo) == self.size:
            self._errors -= self._fifo.popleft()
        self._fifo.append(bool(is_error))
        self._errors += bool(is_error)

    @property
    def rate(self) -> float:
        """Fraction of errors in the window (0.0 to 1.0; 0.0 when empty)."""
        return self._errors / len(self._fifo) if self._fifo else 0.0

    @property
    def count(self) -> int:
        """Outcomes in the window (<= ``size``)."""
        return len(self._fifo)

    @property
    def full(self) -> bool:
        """True once ``size`` outcomes are held."""
        return len(self._fifo) == self.size


@dataclass(frozen=True)
class ProviderSnapshot:
    """Figures for one provider at one moment.

    Counters (``requests``, ``errors``, ``cost_usd``, ``mean_completion_tokens``) are since start;
    percentiles are nearest-rank over the last :attr:`ProviderStats.window` successes. Fields are
    None when no success has been recorded (or, for TTFT, none carried a TTFT).

    Attributes:
        name: provider name as reported by OpenRouter, or ``"(unknown)"``.
        requests: successes + errors.
        errors: error count per error class.
        error_rate: errors / requests (0.0 to 1.0).
        latency_p50_s / latency_p95_s: whole-request latency (seconds).
        ttft_p50_s / ttft_p95_s: time to first token (seconds).
        tok_per_s_per_stream: median completion tokens per second of streaming, per request.
        mean_completion_tokens: mean completion tokens per success (tokens).
        cost_usd: everything the provider billed since start (USD): successes' reported cost plus
            failed and aborted attempts (``/generation`` true-ups included).
        excluded: whether the provider is on the exclusion list.
        flags: wire-conformance flags its responses raised since start, ``{flag: responses}``
            (names: ``engine.client.conformance``; a provider that sends odd shapes stands out).
        fidelity: its fidelity verdict object (docs/fidelity.md: ``verdict``, ``records``, ``reason``...;
            :func:`engine.fidelity.looks.combined`), None before the first look.
    """

    name: str
    requests: int
    errors: dict[str, int]
    error_rate: float
    latency_p50_s: float | None
    latency_p95_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tok_per_s_per_stream: float | None
    mean_completion_tokens: float | None
    cost_usd: float
    excluded: bool
    flags: dict[str, int] = field(default_factory=dict)
    fidelity: dict[str, Any] | None = None


class _Provider:
    __slots__ = ("successes", "errors", "latency", "ttft", "tps", "completion_tokens", "cost_usd", "flags")

    def __init__(self, window: int) -> None:
        self.successes = 0
        self.errors: dict[str, int] = {}
        self.latency = QuantileWindow(window)
        self.ttft = QuantileWindow(window)
        self.tps = QuantileWindow(window)
        self.completion_tokens = 0
        self.cost_usd = 0.0
        self.flags: dict[str, int] = {}


class ProviderStats:
    """Per-provider request figures.

    Args:
        window: successes per provider kept for the latency/TTFT/throughput percentiles.
    """

    def __init__(self, window: int = 1000) -> None:
        self.window = window
        self._providers: dict[str, _Provider] = {}
        self._excluded: set[str] = set()

    def _get(self, provider: str | None) -> _Provider:
        name = provider or UNKNOWN_PROVIDER
        p = self._providers.get(name)
        if p is None:
            p = self._providers[name] = _Provider(self.window)
        return p

    def record_success(
        self,
        provider: str | None,
        latency_s: float,
        ttft_s: float | None,
        completion_tokens: int,
        cost_usd: float | None,
        stream_s: float | None = None,
        flags: tuple[str, ...] = (),
    ) -> None:
        """Record one completed request.

        Args:
            provider: provider name; None or ``""`` counts under ``"(unknown)"``.
            latency_s: request start to last byte (seconds).
            ttft_s: request start to first token (seconds); None when unknown.
            completion_tokens: completion tokens of the response (tokens).
            cost_usd: reported cost (USD); None when unknown (not added).
            stream_s: streaming duration (seconds) used for tokens/s; when None it is
                ``latency_s - ttft_s`` (or ``latency_s`` without a TTFT). Requests whose
                streaming duration is <= 0 add no tokens/s sample.
            flags: the response's wire-conformance flags (each counted once for this response).

        Raises:
            ValueError: negative or non-finite latency/TTFT/tokens.
        """
        if latency_s < 0 or completion_tokens < 0 or (ttft_s is not None and ttft_s < 0):
            raise ValueError("latency, ttft and completion_tokens must be >= 0")
        p = self._get(provider)
        p.successes += 1
        p.latency.add(latency_s)
        if ttft_s is not None:
            p.ttft.add(ttft_s)
        if stream_s is None:
            stream_s = latency_s - (ttft_s or 0.0)
        if stream_s > 0:
            p.tps.add(completion_tokens / stream_s)
        p.completion_tokens += completion_tokens
        if cost_usd is not None:
            p.cost_usd += cost_usd
        for f in flags:
            p.flags[f] = p.flags.get(f, 0) + 1

    def record_cost(self, provider: str | None, cost_usd: float) -> None:
        """Add ``cost_usd`` (USD) billed for an attempt without a result (failed, aborted, or a late
        ``/generation`` true-up); a missing provider counts under ``"(unknown)"``."""
        self._get(provider).cost_usd += cost_usd

    def record_error(self, provider: str | None, error_class: str) -> None:
        """Record one failed request of ``error_class`` (e.g. ``"429"``, ``"timeout"``);
        a missing provider counts under ``"(unknown)"``."""
        p = self._get(provider)
        p.errors[error_class] = p.errors.get(error_class, 0) + 1

    def exclude(self, name: str) -> None:
        """Mark ``name`` as excluded (shown in snapshots; routing is the caller's job)."""
        self._excluded.add(name)

    def include(self, name: str) -> None:
        """Undo :meth:`exclude` (no-op when not excluded)."""
        self._excluded.discard(name)

    @property
    def excluded(self) -> frozenset[str]:
        """Names currently excluded."""
        return frozenset(self._excluded)

    def snapshot(self) -> tuple[ProviderSnapshot, ...]:
        """One :class:`ProviderSnapshot` per provider, by requests descending, then name."""
        out = []
        for name, p in self._providers.items():
            n_err = sum(p.errors.values())
            requests = p.successes + n_err
            out.append(
                ProviderSnapshot(
                    name=name,
                    requests=requests,
                    errors=dict(p.errors),
                    error_rate=n_err / requests if requests else 0.0,
                    latency_p50_s=p.latency.quantile(0.5),
                    latency_p95_s=p.latency.quantile(0.95),
                    ttft_p50_s=p.ttft.quantile(0.5),
                    ttft_p95_s=p.ttft.quantile(0.95),
                    tok_per_s_per_stream=p.tps.quantile(0.5),
                    mean_completion_tokens=(
                        p.completion_tokens / p.successes if p.successes else None
                    ),
                    cost_usd=p.cost_usd,
                    excluded=name in self._excluded,
                    flags=dict(p.flags),
                )
            )
        out.sort(key=lambda s: (-s.requests, s.name))
        return tuple(out)
