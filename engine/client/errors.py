"""Classification of OpenRouter error responses into :class:`RequestError` (see ``docs/openrouter.md``).

Only the RESPONSE (status, response headers, response body) is ever read here, never the request, so the API key
cannot leak into a message from this module. :class:`~engine.client.chat.ChatClient` additionally scrubs its key
from every message it raises, in case a server echoes it back.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

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


def _to_float(value: str) -> float | None:
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
        secs = _to_float(ra)
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
            v = _to_float(reset)
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


# ---- OpenRouter's in-flight spending budget: the HTTP 402 variants ---------------------------------------------------

IN_FLIGHT_EXHAUSTED = "in_flight_budget_exhausted"
"""``error.metadata.reason`` of a 402 (``limit_source`` ``openrouter_in_flight_budget``): the account's running and
recently settled paid requests fill its in-flight spending budget. Transient; the response carries ``Retry-After``.
Classified ``RATE_LIMIT`` (retried after ``Retry-After`` like a 429; never pauses the run)."""

WEIGHT_EXCEEDS = "weight_exceeds_budget"
"""``error.metadata.reason`` of a 402 (``limit_source`` ``openrouter_credits``): this ONE request's estimated cost
(prompt + ``max_tokens`` at the endpoint's prices) is larger than the whole in-flight budget, so retrying it cannot
help. Classified ``BAD_REQUEST``: it fails its prompt, with the ``max_tokens`` that would fit when it can be
computed (:func:`for_request`); it never pauses the run."""

_IN_FLIGHT_SOURCE = "openrouter_in_flight_budget"
#: Lower-case phrases of a message about the in-flight budget when the metadata does not say which case it is.
_IN_FLIGHT_PHRASES = ("in-flight budget", "in flight budget", "in-flight spending budget", "in-flight requests settle",
                      "given your current in-flight requests")
#: Hint of a weight_exceeds_budget message that :func:`for_request` completes with the request's class.
_LOWER_HINT = "lower max_tokens for this class"

# Metadata fields that may carry the numbers of a weight_exceeds_budget (none is documented; read when present).
_FIT_KEYS = ("max_tokens_that_fit", "fit_max_tokens", "affordable_max_tokens", "max_affordable_tokens",
             "max_tokens_allowed", "affordable_tokens")
_BUDGET_KEYS = ("in_flight_budget_usd", "budget_usd", "in_flight_budget", "budget", "available_usd")
_ESTIMATE_KEYS = ("estimated_cost_usd", "request_weight_usd", "weight_usd", "estimate_usd", "estimated_cost",
                  "request_cost_usd", "weight")
_PROMPT_KEYS = ("estimated_prompt_cost_usd", "prompt_cost_usd", "input_cost_usd", "estimated_input_cost_usd")
_MAX_TOKENS_KEYS = ("requested_max_tokens", "request_max_tokens", "max_tokens")

_AFFORD_RE = re.compile(r"can only afford (\d[\d,]*)", re.I)
_REQUESTED_RE = re.compile(r"requested up to (\d[\d,]*) tokens", re.I)
_NUM = r"([0-9][0-9.eE+-]*)"
_NUMBERS_RE = re.compile(rf"estimated cost \${_NUM}(?: \(prompt \${_NUM}\))? > in-flight budget \${_NUM}")


def _meta_number(meta: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for k in keys:
        v = meta.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            continue
        f = _to_float(str(v))
        if f is not None and f >= 0:
            return f
    return None


def _text_of(err: Any, text: str) -> str:
    """Lower-case text of an error object's message, code, type and string metadata, plus ``text``."""
    parts = [text]
    if isinstance(err, dict):
        parts += [str(err.get(k)) for k in ("message", "code", "type") if isinstance(err.get(k), str)]
        meta = err.get("metadata")
        if isinstance(meta, dict):
            parts += [v for v in meta.values() if isinstance(v, str)]
    return " ".join(parts).lower()


def budget_402_reason(err: Any, text: str = "", *, retry_after: bool = False) -> str | None:
    """Which in-flight budget 402 an error is: :data:`IN_FLIGHT_EXHAUSTED`, :data:`WEIGHT_EXCEEDS`, or None (a
    plain 402: credits or the key's limit exhausted, ``CREDITS``).

    Args:
        err: the ``error`` object of the body (``{code, message, metadata: {reason, limit_source, ...}}``), or None.
        text: the message or body text (read too, for servers or proxies that keep only the message).
        retry_after: whether the response asked for a wait (``Retry-After``).

    ``metadata.reason`` decides when it names a case; then ``limit_source`` ``openrouter_in_flight_budget``; then
    the reason's name anywhere in the message or metadata. A message that only mentions the in-flight budget is
    the too-expensive request when ``limit_source`` is ``openrouter_credits``, the transient case when there is no
    ``limit_source`` but a ``Retry-After``, and a plain 402 otherwise (pausing the run is the safe side).
    """
    meta = err.get("metadata") if isinstance(err, dict) and isinstance(err.get("metadata"), dict) else {}
    reason = str(meta.get("reason") or "").strip().lower()
    source = str(meta.get("limit_source") or "").strip().lower()
    if reason in (IN_FLIGHT_EXHAUSTED, WEIGHT_EXCEEDS):
        return reason
    if source == _IN_FLIGHT_SOURCE:
        return IN_FLIGHT_EXHAUSTED
    low = _text_of(err, text)
    if WEIGHT_EXCEEDS in low:
        return WEIGHT_EXCEEDS
    if IN_FLIGHT_EXHAUSTED in low or _IN_FLIGHT_SOURCE in low:
        return IN_FLIGHT_EXHAUSTED
    if any(p in low for p in _IN_FLIGHT_PHRASES):
        if source == "openrouter_credits":
            return WEIGHT_EXCEEDS
        if not source and retry_after:
            return IN_FLIGHT_EXHAUSTED
    return None


def _fit_max_tokens(max_tokens: int, estimate: float, budget: float, prompt: float | None) -> int | None:
    """The largest ``max_tokens`` whose estimate fits ``budget`` (USD), the estimate being linear in ``max_tokens``
    (``prompt + max_tokens * price``): exact with the prompt's part known, else an upper bound. None: no basis."""
    p = prompt if prompt is not None and prompt < estimate else 0.0
    if max_tokens <= 0 or estimate <= p:
        return None
    per_token = (estimate - p) / max_tokens
    return max(0, math.floor((budget - p) / per_token + 1e-9))


def _fit_text(fit: int, exact: bool) -> str:
    if fit < 1:
        return "no max_tokens fits: the prompt's own estimated cost exceeds the budget (shorten it or add credits)"
    return f"max_tokens <= {fit:,} would fit" + ("" if exact else " at most (less by the prompt's share of the estimate)")


def _weight_message(err: Any, message: str) -> str:
    """The message of a weight_exceeds_budget 402: what it means, the ``max_tokens`` that would fit when the body
    lets us compute it (or the numbers :func:`for_request` needs, or the plain advice), then OpenRouter's words."""
    meta = err.get("metadata") if isinstance(err, dict) and isinstance(err.get("metadata"), dict) else {}
    fit = _meta_number(meta, _FIT_KEYS)
    m = _AFFORD_RE.search(message)
    if fit is None and m:
        fit = float(m.group(1).replace(",", ""))
    asked = _meta_number(meta, _MAX_TOKENS_KEYS)
    m = _REQUESTED_RE.search(message)
    if asked is None and m:
        asked = float(m.group(1).replace(",", ""))
    budget, estimate = _meta_number(meta, _BUDGET_KEYS), _meta_number(meta, _ESTIMATE_KEYS)
    prompt = _meta_number(meta, _PROMPT_KEYS)
    if fit is not None:
        hint = _fit_text(int(fit), True)
    elif budget is not None and estimate is not None and asked:
        fit_n = _fit_max_tokens(int(asked), estimate, budget, prompt)
        hint = _fit_text(fit_n, prompt is not None) if fit_n is not None else _LOWER_HINT
    elif budget is not None and estimate is not None:
        pp = f" (prompt ${prompt:.6g})" if prompt is not None else ""
        hint = f"{_LOWER_HINT} (estimated cost ${estimate:.6g}{pp} > in-flight budget ${budget:.6g})"
    else:
        hint = f"{_LOWER_HINT} (or shorten the prompt, or add credits)"
    if asked and "max_tokens <=" in hint:
        hint += f"; the request asked for {int(asked):,}"
    return truncate(f"{WEIGHT_EXCEEDS}: this one request's estimated cost is larger than the whole OpenRouter "
                    f"in-flight budget, so retrying it will not help; {hint}. OpenRouter: {message}")


def is_weight_exceeds_budget(e: Any) -> bool:
    """Whether a :class:`RequestError` (or its message) is a weight_exceeds_budget 402 as classified here."""
    msg = e if isinstance(e, str) else getattr(e, "message", "")
    return f"{WEIGHT_EXCEEDS}: this one request" in msg


def for_request(e: RequestError, max_tokens: int, cls: str) -> RequestError:
    """Complete the message of a weight_exceeds_budget error with the request that got it: its class ``cls`` and
    its ``max_tokens``, and the ``max_tokens`` that would fit when the body gave the estimate and the budget but
    not the request's ``max_tokens``. Any other error is returned unchanged. Mutates and returns ``e``.

    The numbers travel in the message (an error crosses from a stream worker as plain fields)."""
    if not is_weight_exceeds_budget(e) or f"class '{cls}'" in e.message:
        return e
    msg = e.message
    m = _NUMBERS_RE.search(msg)
    start = msg.find(_LOWER_HINT)
    if start >= 0:
        end = start + len(_LOWER_HINT)
        if msg.startswith(" (", end):  # through the matching ")" of the hint's note
            depth = 0
            for i in range(end + 1, len(msg)):
                depth += {"(": 1, ")": -1}.get(msg[i], 0)
                if depth == 0:
                    end = i + 1
                    break
        fit = None
        if m is not None:
            est, prompt, budget = (_to_float(g) if g else None for g in m.groups())
            if est is not None and budget is not None:
                fit = _fit_max_tokens(max_tokens, est, budget, prompt)
        if fit is not None:
            hint = f"{_fit_text(fit, m.group(2) is not None)}; class '{cls}' sends max_tokens {max_tokens:,}"
        else:
            hint = f"lower max_tokens for class '{cls}' (now {max_tokens:,}; or shorten the prompt, or add credits)"
        msg = msg[:start] + hint + msg[end:]
    else:
        i = msg.find(". OpenRouter: ")
        i = i if i >= 0 else len(msg)
        said = "the request asked for" in msg[:i]
        msg = f"{msg[:i]} (class '{cls}'{'' if said else f' sends max_tokens {max_tokens:,}'}){msg[i:]}"
    e.message = truncate(msg)
    e.args = (f"{e.error_class.value}{f' HTTP {e.status}' if e.status else ''}: {e.message}",)
    return e


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
            message = _weight_message(err, message)
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
    meta = err.get("metadata") if isinstance(err.get("metadata"), dict) else {}
    headers: dict[str, str] = {}
    h = meta.get("headers")
    if isinstance(h, dict):
        headers.update({str(k): str(v) for k, v in h.items() if isinstance(v, (str, int, float))})
    if get_header(headers, "Retry-After") is None:
        for obj in (err, meta):
            for k in ("retry_after", "retry_after_s", "retry_after_seconds", "retryAfter"):
                v = obj.get(k)
                if isinstance(v, (int, float, str)) and not isinstance(v, bool) and _to_float(str(v)) is not None:
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
            if isinstance(d, str) and d.endswith("s") and _to_float(d[:-1]) is not None:
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
