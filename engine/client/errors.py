"""Classification of OpenRouter error responses into :class:`RequestError` (see ``docs/openrouter.md``).

Only the RESPONSE (status, response headers, response body) is ever read here, never the request, so the API key
cannot leak into a message from this module. :class:`~engine.client.chat.ChatClient` additionally scrubs its key
from every message it raises, in case a server echoes it back.

What the response says is read by :mod:`engine.client.responses` (headers, ``Retry-After``, the ``error`` object's
text); OpenRouter's in-flight budget 402s are told apart by :mod:`engine.client.budget402`. Both are re-exported
here (``__all__``), the names callers have always imported from this module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from .budget402 import (
    IN_FLIGHT_EXHAUSTED,
    WEIGHT_EXCEEDS,
    budget_402_reason,
    for_request,
    is_weight_exceeds_budget,
    weight_message,
)
from .responses import (
    MAX_RETRY_AFTER_S,
    MESSAGE_LIMIT,
    describe_error_object,
    finite_float,
    get_header,
    parse_retry_after,
    truncate,
)
from .types import ErrorClass, RequestError

__all__ = [
    "IN_FLIGHT_EXHAUSTED",
    "MAX_RETRY_AFTER_S",
    "MESSAGE_LIMIT",
    "WEIGHT_EXCEEDS",
    "budget_402_reason",
    "classify_error_object",
    "classify_http_error",
    "class_for_status",
    "error_status",
    "describe_error_object",
    "for_request",
    "get_header",
    "is_weight_exceeds_budget",
    "parse_retry_after",
    "truncate",
]


def class_for_status(status: int) -> ErrorClass:
    """Map an HTTP error status to its :class:`ErrorClass` (see the table in docs/openrouter.md).

    By status alone: a 402 is ``CREDITS`` here; :func:`classify_http_error` reads the body and turns
    OpenRouter's in-flight budget 402s into other classes (see :func:`budget_402_reason`)."""
    if status == 400:
        return ErrorClass.BAD_REQUEST
    if status == 401:
        return ErrorClass.AUTH
    if status == 402:
        return ErrorClass.CREDITS
    if status == 403:
        return ErrorClass.FORBIDDEN
    if status == 404:  # OpenRouter: "No endpoints found [matching your data policy]" / unknown model
        return ErrorClass.ROUTE
    if status in (408, 524):
        return ErrorClass.TIMEOUT
    if status == 429:
        return ErrorClass.RATE_LIMIT
    if 500 <= status <= 599:
        return ErrorClass.SERVER
    return ErrorClass.OTHER



def classify_http_error(
    status: int,
    headers: Mapping[str, str] | None,
    body_text: str | bytes,
    *,
    now: Callable[[], float] = time.time,
    generation_id: str = "",
) -> RequestError:
    """Build the :class:`RequestError` for an HTTP error response.

    Args:
        status: HTTP status (>= 300).
        headers: RESPONSE headers (``Retry-After``, ``X-RateLimit-Reset``).
        body_text: response body; OpenRouter's ``{"error": {code, message, metadata}}`` or anything else (an HTML
            page from a proxy), which is then quoted truncated.
        now: wall clock (epoch s), injectable for tests of ``X-RateLimit-Reset`` / HTTP-date ``Retry-After``.
        generation_id: generation id if known (``X-Generation-Id``).

    ``retry_after_s`` is set from ``Retry-After`` for any status and from ``X-RateLimit-Reset`` for 429 only (other
    responses may carry rate-limit headers that say nothing about when to retry).

    A 402 is ``CREDITS`` (the run pauses) unless its body is one of OpenRouter's in-flight budget variants
    (:func:`budget_402_reason`): ``in_flight_budget_exhausted`` is ``RATE_LIMIT`` (transient, retried after its
    ``Retry-After``), ``weight_exceeds_budget`` is ``BAD_REQUEST`` (fails its prompt; the message says why and
    which ``max_tokens`` would fit).
    """
    if isinstance(body_text, bytes):
        body_text = body_text.decode("utf-8", "replace")
    error_class = class_for_status(status)
    message = ""
    provider = ""
    body: Any = None
    stripped = body_text.strip()
    if stripped[:1] == "{":
        try:
            body = json.loads(stripped)
        except ValueError:
            body = None
    err: Any = None
    if isinstance(body, dict) and body.get("error") is not None:
        err = body["error"]
        message, _meta, provider = describe_error_object(err)
    elif stripped:
        message = truncate(stripped)
    else:
        message = "empty error body"
    if error_class is ErrorClass.OTHER and 300 <= status < 400:
        location = get_header(headers, "Location")
        message = f"unexpected redirect{f' to {truncate(location, 200)}' if location else ''}: {message}"
    retry_after = parse_retry_after(headers, use_ratelimit_reset=(status == 429), now=now)
    if status == 402:
        budget = budget_402_reason(err, message, retry_after=retry_after is not None)
        if budget == IN_FLIGHT_EXHAUSTED:
            error_class = ErrorClass.RATE_LIMIT
            wait = f"after Retry-After {retry_after:g}s" if retry_after is not None else "with backoff"
            message = truncate(f"in-flight budget exhausted (OpenRouter 402 {IN_FLIGHT_EXHAUSTED}: transient, "
                               f"retried {wait} like a rate limit): {message}")
        elif budget == WEIGHT_EXCEEDS:
            error_class = ErrorClass.BAD_REQUEST
            message = weight_message(err, message)
    return RequestError(
        error_class,
        message,
        status=status,
        retry_after_s=retry_after,
        provider=provider,
        generation_id=generation_id,
    )


#: Named error codes / types / gRPC statuses that stand for an HTTP status (OpenAI ``code``, Anthropic-style
#: ``type``, Google ``status``), for error objects whose ``code`` is not a number.
NAMED_STATUS: dict[str, int] = {
    "invalid_request_error": 400, "context_length_exceeded": 400, "invalid_argument": 400, "bad_request": 400,
    "authentication_error": 401, "invalid_api_key": 401, "unauthenticated": 401,
    "payment_required": 402, "insufficient_credits": 402,
    "in_flight_budget_exhausted": 402, "weight_exceeds_budget": 402,
    "permission_error": 403, "permission_denied": 403, "forbidden": 403,
    "not_found_error": 404, "model_not_found": 404, "not_found": 404,
    "request_too_large": 413,
    "rate_limit_exceeded": 429, "rate_limit_error": 429, "too_many_requests": 429, "resource_exhausted": 429,
    "server_error": 500, "internal_error": 500, "internal_server_error": 500, "api_error": 500, "internal": 500,
    "bad_gateway": 502, "unavailable": 503, "service_unavailable": 503, "deadline_exceeded": 504,
    "overloaded_error": 529,
}


def _as_status(v: Any) -> int | None:
    """``v`` as an HTTP error status (400-599): an int, an integral float or a numeric string; else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    if isinstance(v, int) and 400 <= v <= 599:
        return v
    if isinstance(v, str):
        return NAMED_STATUS.get(v.strip().lower())
    return None


def error_status(err: Any) -> int | None:
    """The HTTP status an error object (``{"code", "message", "type"?, "status"?, "metadata"?}``) stands for.

    ``code`` first (an HTTP error status as int / numeric string, or a name in :data:`NAMED_STATUS`), then
    ``type``, then ``status``. None when the object carries no such code (a code-less error, or a code that
    is neither an HTTP error status nor a known name).
    """
    if not isinstance(err, dict):
        return None
    for key in ("code", "type", "status"):
        s = _as_status(err.get(key))
        if s is not None:
            return s
    return None


def _error_headers(err: dict[str, Any]) -> dict[str, str]:
    """Response-header equivalents carried inside an error object: ``metadata.headers`` (OpenRouter puts the
    upstream ``X-RateLimit-*`` / ``Retry-After`` headers there), a numeric ``retry_after`` /
    ``retry_after_s`` / ``retry_after_seconds`` / ``retryAfter`` in the object or its metadata (seconds), or a
    Google ``RetryInfo.retryDelay`` (``"12s"``) inside ``metadata.raw``."""
    meta = _obj if isinstance(_obj := err.get("metadata"), dict) else {}
    headers: dict[str, str] = {}
    h = meta.get("headers")
    if isinstance(h, dict):
        headers.update({str(k): str(v) for k, v in h.items() if isinstance(v, (str, int, float))})
    if get_header(headers, "Retry-After") is None:
        for obj in (err, meta):
            for k in ("retry_after", "retry_after_s", "retry_after_seconds", "retryAfter"):
                v = obj.get(k)
                if isinstance(v, (int, float, str)) and not isinstance(v, bool) and finite_float(str(v)) is not None:
                    headers["Retry-After"] = str(v)
                    break
            if "Retry-After" in headers:
                break
    if get_header(headers, "Retry-After") is None:
        raw = meta.get("raw")
        delay = _retry_delay(raw)
        if delay is not None:
            headers["Retry-After"] = delay
    return headers


def _retry_delay(raw: Any) -> str | None:
    if isinstance(raw, str) and "retryDelay" in raw:
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    stack, seen = [raw], 0
    while stack and seen < 200:
        seen += 1
        x = stack.pop()
        if isinstance(x, dict):
            d = x.get("retryDelay")
            if isinstance(d, str) and d.endswith("s") and finite_float(d[:-1]) is not None:
                return d[:-1]
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return None


def classify_error_object(err: Any, *, generation_id: str = "", now: Callable[[], float] = time.time) -> RequestError:
    """The :class:`RequestError` for an error object that arrived inside a 200 response (an error chunk in a
    stream, or a 200 body with ``error``).

    An object whose code stands for an HTTP status (:func:`error_status`) is classified exactly as that HTTP
    error would be, by :func:`classify_http_error` (429 -> ``RATE_LIMIT``, 402 -> ``CREDITS`` or, for OpenRouter's
    in-flight budget 402s, ``RATE_LIMIT`` / ``BAD_REQUEST``, 401 -> ``AUTH``, 5xx -> ``SERVER``, 400 ->
    ``BAD_REQUEST``, ...), with ``retry_after_s`` read from the header equivalents
    the object carries (see :func:`_error_headers`); ``status`` is then that code and the message says it came
    in a 200 response. A code-less object is ``MIDSTREAM`` (retryable) with ``status`` 200.
    """
    status = error_status(err)
    if status is None:
        message, _meta, provider = describe_error_object(err)
        return RequestError(ErrorClass.MIDSTREAM, message, status=200, provider=provider, generation_id=generation_id)
    e = classify_http_error(status, _error_headers(err), json.dumps({"error": err}), now=now,
                            generation_id=generation_id)
    e.message = truncate(f"{e.message} (error object in an HTTP 200 response)")
    e.args = (f"{e.error_class.value} HTTP {status}: {e.message}",)
    return e
