"""Waiting for a condition, the one way every test does it.

- :func:`wait_for`: poll a plain predicate (subprocesses, files, ``datagen status``, a tmux screen).
- :func:`until`: let a Textual app run under its pilot until a predicate holds.
- :func:`async_wait_for`: poll a predicate from a coroutine (event-loop servers, in-process workers).

Each returns the predicate's first truthy value and fails after ``timeout`` seconds naming ``what``
(and, with ``show``, what was on screen).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


def _suffix(show: Callable[[], Any] | None) -> str:
    return f":\n{show()}" if show is not None else ""


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition",
             show: Callable[[], Any] | None = None, *, interval: float = 0.1) -> Any:
    """Poll ``pred()`` every ``interval`` seconds until it returns a truthy value (returned), for at most
    ``timeout`` seconds; then raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}{_suffix(show)}")
        time.sleep(interval)


async def until(pilot: Any, cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
                show: Callable[[], Any] | None = None, *, step: float = 0.05) -> Any:
    """Let the app run (``pilot.pause(step)``) until ``cond()`` is truthy; return its value (fail after
    ``timeout`` s)."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{_suffix(show)}")
        await pilot.pause(step)


async def async_wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition", *,
                         step: float = 0.02) -> Any:
    """Poll ``pred()`` from a coroutine (``asyncio.sleep(step)`` between tries); return its first truthy value."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(step)
