"""Reading provider credits and late costs: OpenRouter's ``/key``, ``/credits`` and ``/generation``.

Shapes from docs/openrouter.md ("Account endpoints"): ``GET /key`` ->
``{"data": {"limit", "limit_remaining", "usage", ...}}`` (works with an ordinary key);
``GET /credits`` -> ``{"data": {"total_credits", "total_usage"}}`` (newer accounts answer 403 to an
ordinary key: fall back to ``/key``); ``GET /generation?id=`` -> ``{"data": {"total_cost", ...}}``,
often 404 for a few seconds after a generation ends.

With several endpoints (``[provider] base_urls``) every endpoint is asked and the readings summed
(:func:`read_credits_each`); one that gives none makes the reading partial.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from engine.client.types import ErrorClass, RequestError
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


#: Error classes that, without an HTTP status, mean the server could not be asked at all (not "this
#: endpoint is not offered").
_UNREACHABLE = frozenset({ErrorClass.CONNECT, ErrorClass.DISCONNECT, ErrorClass.TIMEOUT, ErrorClass.STALL})


def _answered(e: RequestError) -> bool:
    return e.status != 0 or e.error_class not in _UNREACHABLE


async def _read(get_json) -> tuple[float | None, float | None, str, bool]:
    """``(remaining, usage, source, answered)`` of one server: ``/key``, else ``/credits`` (see
    :func:`read_credits`); ``answered`` is False when neither request reached it."""
    remaining = usage = None
    source = "key"
    answered = False
    try:
        remaining, usage = parse_key(await get_json("/key"))
        answered = True
    except RequestError as e:
        answered = _answered(e)
    if remaining is None:
        try:
            bal, cu = parse_credits(await get_json("/credits"))
            answered = True
            if bal is not None:
                remaining, source = bal, "credits"
                usage = usage if usage is not None else cu
        except RequestError as e:
            answered = answered or _answered(e)
    return remaining, usage, source, answered


async def read_credits(get_json, clock=time.monotonic) -> CreditsReading | None:
    """Read credits with ``get_json(path)`` (e.g. ``ChatClient.get_json``); None when neither endpoint works.

    Uses ``/key`` (``limit_remaining``, ``usage``); when the key has no limit, asks ``/credits`` for
    the account balance (a 403 there is expected for ordinary keys and ignored).
    """
    remaining, usage, source, _ = await _read(get_json)
    if remaining is None and usage is None:
        return None
    return CreditsReading(remaining, usage, source, clock())


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


async def read_credits_each(endpoints: Sequence[tuple[str, Any]], clock=time.monotonic) -> CreditsReading | None:
    """Credits of several endpoints (``[provider] base_urls``), each asked at once with its own
    ``get_json`` as :func:`read_credits` asks one server, and summed: each replica is its own
    account (its own ``/key``), while the run's spend is summed over all of them.

    Args:
        endpoints: ``(url as shown, get_json)`` per endpoint (:meth:`engine.client.fleet.EndpointFleet.getters`).
        clock: monotonic clock (s) for the reading's time.

    Returns:
        None when no endpoint offers credits and every one answered (nothing to track); else a
        reading whose ``remaining_usd`` is the sum (None: some endpoint reports no limit) and whose
        ``usage_usd`` is the sum when every endpoint gave its usage. An endpoint that gave none
        (unreachable, or no ``/key`` nor ``/credits``) is in ``missing``: the reading is partial,
        ``remaining_usd`` covers the others only and ``usage_usd`` is None (no spend drift from it).
    """
    got = await asyncio.gather(*(_read(g) for _, g in endpoints))
    offered = [(r, u, src) for r, u, src, _ in got if r is not None or u is not None]
    if not offered and all(answered for *_, answered in got):
        return None
    missing = tuple(url for (url, _), (r, u, _, _) in zip(endpoints, got, strict=True) if r is None and u is None)
    sources = {src for _, _, src in offered}
    return CreditsReading(
        _sum([r for r, _, _ in offered]) if offered else None,
        None if missing else _sum([u for _, u, _ in offered]),
        sources.pop() if len(sources) == 1 else "+".join(sorted(sources)) or "key", clock(),
        endpoints=len(endpoints), missing=missing)


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
