"""One message object of a row's turn list -> the start of an OpenAI-shape message (pure).

Shared by the formats whose rows hold OpenAI-like message objects (``openai`` ``messages``, SWE-agent
``history``): the object must be a dict with a known ``role`` (``engine.prompts.ROLES``); ``content`` is
copied when present (its type is checked later, by ``engine.datasets.rule.cut_prompt``).
"""

from __future__ import annotations

from typing import Any

from engine.prompts import ROLES

_MISSING = object()


def base_message(n: int, m: Any) -> dict[str, Any]:
    """``{"role": ..., "content": ...}`` of message ``n`` (1-based, for reasons); other keys are the
    caller's to copy.

    Raises:
        ValueError: ``"message N: a T, expected an object"``, ``"message N: missing field 'role'"``,
            ``"message N: unknown role R"``.
    """
    if not isinstance(m, dict):
        kind = "null" if m is None else f"a {type(m).__name__}"
        raise ValueError(f"message {n}: {kind}, expected an object")
    role = m.get("role", _MISSING)
    if role is _MISSING:
        raise ValueError(f"message {n}: missing field 'role'")
    if role not in ROLES:
        raise ValueError(f"message {n}: unknown role {role!r}")
    msg: dict[str, Any] = {"role": role}
    if "content" in m:
        msg["content"] = m["content"]
    return msg
