"""Retry timing for failed requests, built on ``tenacity``.

:class:`RetryPolicy` decides WHETHER (only :attr:`RequestError.retryable` errors: never AUTH, CREDITS, BAD_REQUEST,
FORBIDDEN or OTHER) and HOW LONG to wait: the server's ``retry_after_s`` when it gave one (``Retry-After`` /
``X-RateLimit-Reset``), otherwise tenacity's full-jitter exponential wait
(``uniform(min_s, min(max_s, base_s * 2 ** (attempt - 1)))``).

:func:`call_with_retries` runs one request function under a policy, reporting every attempt to a callback so the
scheduler can record attempts and spend; the sleep is injectable for tests.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_random_exponential

from .types import RequestError

__all__ = ["RetryPolicy", "call_with_retries", "OnAttempt"]

T = TypeVar("T")

OnAttempt = Callable[[int, "RequestError | None", "float | None"], "Awaitable[None] | None"]
"""``on_attempt(attempt_no, error_or_none, wait_s)``: called after EVERY attempt.

``attempt_no`` counts from 1; ``error_or_none`` is the attempt's :class:`RequestError` (None on success); ``wait_s``
is the sleep before the next attempt, or None when no attempt follows (success, non-retryable error, attempts
exhausted). May be a plain function or a coroutine function.
"""


class _AttemptState:
    """Minimal stand-in for tenacity's RetryCallState (its waits read only ``attempt_number``)."""

    __slots__ = ("attempt_number",)

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry.

    Attributes:
        max_attempts: total attempts including the first (>= 1).
        base_s: exponential backoff multiplier (s): the random wait after attempt n is drawn from
            ``[min_s, min(max_s, base_s * 2 ** (n - 1))]`` (tenacity ``wait_random_exponential``, "full jitter").
        max_s: cap of the exponential wait (s).
        min_s: floor of the exponential wait (s).
        retry_after_jitter: when the server gave ``retry_after_s``, the wait is
            ``retry_after_s * (1 + uniform(0, retry_after_jitter))``: never earlier than asked; the small spread
            keeps thousands of requests told the same ``X-RateLimit-Reset`` from returning in one instant.
            0 gives the exact server value.
        max_retry_after_s: cap on a server-requested wait (s).
        endpoint_retries: retries, per call, of errors that are an endpoint's fault
            (:attr:`~engine.client.types.RequestError.endpoint_fault`: with several endpoints, one could not
            be reached or went down mid-request), made at once and NOT counted against ``max_attempts``;
            past this many they count like any other error. 0 (the default, one endpoint): none.
    """

    max_attempts: int = 6
    base_s: float = 1.0
    max_s: float = 60.0
    min_s: float = 0.0
    retry_after_jitter: float = 0.1
    max_retry_after_s: float = 300.0
    endpoint_retries: int = 0
    _exp: Any = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.base_s < 0 or self.max_s < 0 or self.min_s < 0 or self.retry_after_jitter < 0 or self.endpoint_retries < 0:
            raise ValueError("retry waits must be >= 0")
        object.__setattr__(
            self, "_exp", wait_random_exponential(multiplier=self.base_s, max=self.max_s, min=self.min_s)
        )

    def should_retry(self, exc: BaseException) -> bool:
        """True for a retryable :class:`RequestError`; False for anything else (incl. cancellation)."""
        return isinstance(exc, RequestError) and exc.retryable

    def wait_s(self, attempt_no: int, error: BaseException | None) -> float:
        """Seconds to wait after failed attempt ``attempt_no`` (1-based) that raised ``error``."""
        ra = getattr(error, "retry_after_s", None)
        if ra is not None:
            ra = min(max(float(ra), 0.0), self.max_retry_after_s)
            if self.retry_after_jitter:
                ra *= 1.0 + random.uniform(0.0, self.retry_after_jitter)
            return ra
        return float(self._exp(_AttemptState(attempt_no)))


async def _notify(on_attempt: OnAttempt | None, n: int, err: RequestError | None, wait: float | None) -> None:
    if on_attempt is None:
        return
    r = on_attempt(n, err, wait)
    if inspect.isawaitable(r):
        await r


async def call_with_retries(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy | None = None,
    on_attempt: OnAttempt | None = None,
    *,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> T:
    """Await ``fn()`` until it succeeds, retrying retryable :class:`RequestError` under ``policy``.

    Args:
        fn: zero-argument coroutine function doing ONE attempt (e.g. ``lambda: client.complete(req)``).
        policy: the :class:`RetryPolicy` (default ``RetryPolicy()``).
        on_attempt: see :data:`OnAttempt`; called after each attempt, before any sleep.
        sleep: the sleep coroutine function (injectable for tests).

    Returns:
        ``fn``'s result.

    An error that is an endpoint's fault (``endpoint_fault``) is retried at once and does not count against
    ``policy.max_attempts``, up to ``policy.endpoint_retries`` times per call; the backoff of the other errors
    grows with the attempts that count.

    Raises:
        RequestError: a non-retryable error at once, or the LAST error once ``policy.max_attempts`` are used; its
            ``attempts`` attribute holds the number of attempts made (endpoint retries included).
        asyncio.CancelledError: propagated unchanged (never retried); other exceptions propagate unchanged too.
    """
    policy = policy or RetryPolicy()
    attempts = 0
    counted = 0  # attempts that count against policy.max_attempts
    free = 0  # endpoint-fault retries used
    last_free = False  # the latest attempt failed for its endpoint, within policy.endpoint_retries

    async def _attempt() -> T:
        nonlocal attempts, counted, free, last_free
        attempts += 1
        last_free = False
        try:
            return await fn()
        except RequestError as e:
            if e.endpoint_fault and free < policy.endpoint_retries:
                free += 1
                last_free = True
            else:
                counted += 1
            raise

    def _wait(rs: RetryCallState) -> float:
        if last_free:
            return 0.0
        exc = rs.outcome.exception() if rs.outcome is not None and rs.outcome.failed else None
        return policy.wait_s(counted, exc)

    async def _before_sleep(rs: RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome is not None else None
        await _notify(on_attempt, rs.attempt_number, exc if isinstance(exc, RequestError) else None, rs.upcoming_sleep)

    retrying = AsyncRetrying(
        stop=lambda rs: counted >= policy.max_attempts,
        wait=_wait,
        retry=retry_if_exception(policy.should_retry),
        sleep=sleep,
        before_sleep=_before_sleep,
        reraise=True,
    )
    try:
        result: T = await retrying(_attempt)
    except RequestError as e:
        e.attempts = attempts
        await _notify(on_attempt, attempts, e, None)
        raise
    await _notify(on_attempt, attempts, None, None)
    return result
