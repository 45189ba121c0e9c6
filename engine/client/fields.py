"""Reading the fields of one streamed chunk or non-streamed body (``docs/openrouter.md``): the reasoning text under
any of its spellings, whether a ``usage`` object is one, a ``finish_reason`` as the finish it announces.
:class:`engine.client.accumulate.StreamAccumulator` assembles a completion from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .conformance import read_usage
from .types import Usage

__all__ = ["details_text", "finish_value", "parse_usage", "reasoning_text", "usage_present"]


def details_text(details: Any) -> str:
    """The readable text of a ``reasoning_details`` list: ``reasoning.text`` entries' text and
    ``reasoning.summary`` entries' summary, in order (encrypted and unknown kinds carry none)."""
    if not isinstance(details, list):
        return ""
    parts: list[str] = []
    for d in details:
        if not isinstance(d, dict):
            continue
        kind = d.get("type")
        if kind == "reasoning.text" or kind is None:
            t = d.get("text")
        elif kind == "reasoning.summary":
            t = d.get("summary")
        else:  # reasoning.encrypted and unknown kinds carry no readable text
            t = None
        if isinstance(t, str) and t:
            parts.append(t)
    return "".join(parts)


def reasoning_text(obj: Mapping[str, Any]) -> str:
    """Reasoning text of a ``delta`` or ``message``: ``reasoning``, else ``reasoning_content``, else the text of the
    ``reasoning_details`` entries (``reasoning.text`` text, ``reasoning.summary`` summary). Never a sum of two."""
    r = obj.get("reasoning")
    if r and isinstance(r, str):
        return r
    r = obj.get("reasoning_content")
    if r and isinstance(r, str):
        return r
    d = obj.get("reasoning_details")
    if d:
        return details_text(d)
    return ""


def parse_usage(u: Any) -> Usage:
    """Build :class:`Usage` from a ``usage`` object (tolerates missing fields and numeric strings); the
    billed figures as :func:`engine.client.conformance.read_usage` reads them (reasoning reported outside
    ``completion_tokens`` added, BYOK upstream cost counted)."""
    return read_usage(u)[0]


def usage_present(u: Any) -> bool:
    """True when ``u`` is a usage object: a dict with a numeric ``prompt_tokens``, ``completion_tokens`` or
    ``total_tokens`` (``null``, ``{}`` or a usage without token counts is no usage)."""
    if not isinstance(u, dict):
        return False
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        v = u.get(k)
        if v is not None and not isinstance(v, bool):
            try:
                float(v)
            except (TypeError, ValueError):
                continue
            return True
    return False


def finish_value(fr: Any) -> str | None:
    """A chunk's ``finish_reason`` as the finish it announces: None for null, ``""``, whitespace or ``false``
    (not finished), else the value verbatim (a non-string is kept as its ``str``)."""
    if fr is None or fr is False:
        return None
    if type(fr) is str:
        return fr if fr.strip() else None
    return str(fr)
