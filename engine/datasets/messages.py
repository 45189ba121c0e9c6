"""One message object of a row's turn list -> the start of an OpenAI-shape message (pure).

Shared by the formats whose rows hold OpenAI-like message objects (``openai`` ``messages``, SWE-agent
``history``): the object must be a dict with a known ``role`` (``engine.prompts.ROLES``); ``content`` is
copied when present, a list of text parts joined into one string (:func:`engine.datasets.parts.join_text_parts`);
its type is checked later, by ``engine.datasets.rule.cut_prompt``.
"""

from __future__ import annotations

from typing import Any

from engine.datasets.kinds import kind_of
from engine.datasets.parts import join_text_parts
from engine.prompts import ROLES

_MISSING = object()


def base_message(n: int, m: Any, final: bool = False) -> dict[str, Any]:
    """``{"role": ..., "content": ...}`` of message ``n`` (1-based, for reasons); other keys are the
    caller's to copy. ``final``: the row's last message; a final assistant message is cut from the
    prompt (``docs/prompt-construction.md``), so content parts it cannot join are kept as they are.

    Raises:
        ValueError: ``"message N: a T, expected an object"``, ``"message N: missing field 'role'"``,
            ``"message N: unknown role R"``, ``"message N: content part K has type 'image_url'; ..."``
            (and the other reasons of :func:`engine.datasets.parts.join_text_parts`).
    """
    if not isinstance(m, dict):
        raise ValueError(f"message {n}: {kind_of(m)}, expected an object")
    role = m.get("role", _MISSING)
    if role is _MISSING:
        raise ValueError(f"message {n}: missing field 'role'")
    if role not in ROLES:
        raise ValueError(f"message {n}: unknown role {role!r}")
    msg: dict[str, Any] = {"role": role}
    if "content" in m:
        msg["content"] = text_content(n, m["content"], final and role == "assistant")
    return msg


def text_content(n: int, content: Any, cut: bool = False) -> Any:
    """Message ``n``'s ``content`` with its text parts joined (:func:`engine.datasets.parts.join_text_parts`);
    ``cut``: the message is cut from the prompt, so content that cannot be joined is returned unchanged.

    Raises:
        ValueError: ``"message N: content part K ..."`` (unless ``cut``).
    """
    try:
        return join_text_parts(content)
    except ValueError as e:
        if cut:
            return content
        raise ValueError(f"message {n}: {e}") from None
