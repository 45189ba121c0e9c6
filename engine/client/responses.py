"""Reading an error response: its headers (``Retry-After``, ``X-RateLimit-Reset``, any header by name) and its
text (an OpenRouter ``error`` object rendered, provider text truncated). :mod:`engine.client.errors` classifies
what these read.

Only the RESPONSE is read here, never the request, so the API key cannot leak into a message from this module.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MAX_RETRY_AFTER_S",
    "MESSAGE_LIMIT",
    "describe_error_object",
    "finite_float",
    "get_header",
    "parse_retry_after",
    "truncate",
]

MAX_RETRY_AFTER_S = 300.0
"""Upper clamp for server-requested waits (s): a bogus or hostile header cannot park a request for hours."""

MESSAGE_LIMIT = 500
"""Messages built from provider text are truncated to about this many characters."""


def truncate(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """Collapse whitespace runs and cut ``text`` to ``limit`` characters (marking the cut with ``...``)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 3)] + "..."


def get_header(headers: Mapping[str, str] | None, name: str) -> str | None:
    """Case-insensitive header lookup on an ``httpx.Headers`` or a plain ``dict``."""
    if not headers:
        return None
    value = headers.get(name)
    if value is not None:
        return value
    lname = name.lower()
    for k, v in headers.items():
        if k.lower() == lname:
            return v
    return None


def finite_float(value: str) -> float | None:
    """``value`` (a header or field) as a finite float; None when it is not a number."""
    try:
        f = float(value.strip())
    except (ValueError, AttributeError):
        return None
    return f if math.isfinite(f) else None


def parse_retry_after(
    headers: Mapping[str, str] | None,
    *,
    use_ratelimit_reset: bool = True,
    now: Callable[[], float] = time.time,
    max_s: float = MAX_RETRY_AFTER_S,
) -> float | None:
    """Seconds the server asks us to wait, clamped to ``[0, max_s]``, or ``None`` when it says nothing.

    ``Retry-After`` wins when present: delta-seconds (``"7"``, ``"1.5"``) or an HTTP date. Otherwise, when
    ``use_ratelimit_reset``, ``X-RateLimit-Reset`` is read as an epoch in MILLISECONDS (OpenRouter's form). As a
    defensive heuristic a value below 1e11 is taken as epoch SECONDS when above 1e9, and as delta-seconds below
    that (other gateways use those forms); no real millisecond epoch is below 1e11 (1973).
    """
    ra = get_header(headers, "Retry-After")
    if ra is not None and ra.strip():
        secs = finite_float(ra)
        if secs is None:
            try:
                dt = email.utils.parsedate_to_datetime(ra.strip())
            except (TypeError, ValueError, IndexError):
                dt = None
            if dt is not None:
                if dt.tzinfo is None:  # RFC 7231 dates are GMT
                    dt = dt.replace(tzinfo=datetime.timezone.utc)
                secs = dt.timestamp() - now()
        if secs is not None:
            return min(max(secs, 0.0), max_s)
    if use_ratelimit_reset:
        reset = get_header(headers, "X-RateLimit-Reset")
        if reset is not None:
            v = finite_float(reset)
            if v is not None:
                if v >= 1e11:
                    secs = v / 1000.0 - now()
                elif v >= 1e9:
                    secs = v - now()
                else:
                    secs = v
                return min(max(secs, 0.0), max_s)
    return None


def describe_error_object(err: Any) -> tuple[str, dict[str, Any], str]:
    """Render an OpenRouter ``error`` object ``{code, message, metadata}``.

    Returns:
        ``(message, metadata, provider_name)``: message is ``error.message`` followed by the code,
        ``metadata.error_type`` and ``metadata.raw`` when present, truncated to :data:`MESSAGE_LIMIT`.
    """
    if not isinstance(err, dict):
        return truncate(str(err)), {}, ""
    meta = err.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    parts: list[str] = []
    msg = err.get("message")
    if msg:
        parts.append(str(msg))
    code = err.get("code")
    error_type = meta.get("error_type")
    tags = []
    if code is not None:
        tags.append(f"code={code}")
    if error_type:
        tags.append(f"error_type={error_type}")
    if tags:
        parts.append(f"[{' '.join(tags)}]")
    raw = meta.get("raw")
    if raw:
        parts.append(f"raw: {raw if isinstance(raw, str) else json.dumps(raw)}")
    provider = meta.get("provider_name") or ""
    return truncate(" ".join(parts) or "error with no message"), meta, str(provider)
