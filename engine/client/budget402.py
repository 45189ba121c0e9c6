"""OpenRouter's in-flight spending budget: the HTTP 402 variants (see ``docs/openrouter.md``).

A 402 is ``CREDITS`` (the run pauses) unless it is one of these: ``in_flight_budget_exhausted`` (transient,
retried like a rate limit) or ``weight_exceeds_budget`` (this one request can never fit: it fails its prompt,
saying which ``max_tokens`` would). :func:`budget_402_reason` tells them apart; :mod:`engine.client.errors`
classifies with it; :func:`for_request` completes the message with the request's class once it is known.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .responses import finite_float, truncate
from .types import RequestError

__all__ = [
    "IN_FLIGHT_EXHAUSTED",
    "WEIGHT_EXCEEDS",
    "budget_402_reason",
    "for_request",
    "is_weight_exceeds_budget",
    "weight_message",
]

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
        f = finite_float(str(v))
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
    meta = _obj if isinstance(err, dict) and isinstance(_obj := err.get("metadata"), dict) else {}
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


def weight_message(err: Any, message: str) -> str:
    """The message of a weight_exceeds_budget 402: what it means, the ``max_tokens`` that would fit when the body
    lets us compute it (or the numbers :func:`for_request` needs, or the plain advice), then OpenRouter's words."""
    meta = _obj if isinstance(err, dict) and isinstance(_obj := err.get("metadata"), dict) else {}
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
        fit, exact = None, False
        if m is not None:
            est, prompt, budget = (finite_float(g) if g else None for g in m.groups())
            if est is not None and budget is not None:
                fit, exact = _fit_max_tokens(max_tokens, est, budget, prompt), m.group(2) is not None
        if fit is not None:
            hint = f"{_fit_text(fit, exact)}; class '{cls}' sends max_tokens {max_tokens:,}"
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
