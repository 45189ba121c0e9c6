"""Reading provider credits and late costs: OpenRouter's ``/key``, ``/credits`` and ``/generation``.

Shapes from docs/openrouter.md ("Account endpoints"): ``GET /key`` ->
``{"data": {"limit", "limit_remaining", "usage", ...}}`` (works with an ordinary key);
``GET /credits`` -> ``{"data": {"total_credits", "total_usage"}}`` (newer accounts answer 403 to an
ordinary key: fall back to ``/key``); ``GET /generation?id=`` -> ``{"data": {"total_cost", ...}}``,
often 404 for a few seconds after a generation ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from engine.client.types import RequestError
from engine.money.spend import CreditsReading


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def parse_key(doc: Any) -> tuple[float | None, float | None]:
    """``(limit_remaining, usage)`` in USD from a ``/key`` document (None when absent)."""
    data = doc.get("data", {}) if isinstance(doc, dict) else {}
    return _num(data.get("limit_remaining")), _num(data.get("usage"))


def parse_credits(doc: Any) -> tuple[float | None, float | None]:
    """``(balance, total_usage)`` in USD from a ``/credits`` document (None when absent)."""
    data = doc.get("data", {}) if isinstance(doc, dict) else {}
    total, usage = _num(data.get("total_credits")), _num(data.get("total_usage"))
    return (None if total is None or usage is None else total - usage), usage


async def read_credits(get_json, clock=time.monotonic) -> CreditsReading | None:
    """Read credits with ``get_json(path)`` (e.g. ``ChatClient.get_json``); None when neither endpoint works.

    Uses ``/key`` (``limit_remaining``, ``usage``); when the key has no limit, asks ``/credits`` for
    the account balance (a 403 there is expected for ordinary keys and ignored).
    """
    remaining = usage = None
    source = "key"
    try:
        remaining, usage = parse_key(await get_json("/key"))
    except RequestError:
        pass
    if remaining is None:
        try:
            bal, cu = parse_credits(await get_json("/credits"))
            if bal is not None:
                remaining, source = bal, "credits"
                usage = usage if usage is not None else cu
        except RequestError:
            pass
    if remaining is None and usage is None:
        return None
    return CreditsReading(remaining, usage, source, clock())


async def generation_stats(get_json, generation_id: str, *, tries: int = 5, first_wait_s: float = 1.0) -> dict | None:
    """The ``data`` object of ``/generation?id=`` (``total_cost`` USD, ``tokens_*`` /
    ``native_tokens_*`` counts, ...), retrying 404s and transient errors with doubling waits
    (``first_wait_s``, s); None if never known."""
    wait = first_wait_s
    for _ in range(tries):
        await asyncio.sleep(wait)
        try:
            doc = await get_json("/generation", {"id": generation_id})
        except RequestError as e:
            if e.status in (404, 429) or e.retryable:
                wait = min(wait * 2, 30.0)
                continue
            return None
        data = doc.get("data", {}) if isinstance(doc, dict) else {}
        return data if isinstance(data, dict) else None
    return None


async def generation_cost(get_json, generation_id: str, *, tries: int = 5, first_wait_s: float = 1.0) -> float | None:
    """``total_cost`` (USD) of a generation from ``/generation?id=``, retrying 404s; None if never known."""
    data = await generation_stats(get_json, generation_id, tries=tries, first_wait_s=first_wait_s)
    return None if data is None else _num(data.get("total_cost"))
