"""OpenAI content parts -> one text string (pure), as Kimi-K2.5's chat template joins them.

Published chat datasets often write a message's ``content`` as a list of parts,
``[{"type": "text", "text": "..."}, ...]``. Kimi-K2.5's template renders such a list by iterating over
the parts and writing each text part's ``text``, with nothing between them (the bundled Kimi-layout
template, :data:`engine.tokens.demo_tokenizer.KIMI_TEMPLATE`, macro ``text``). So a list of text
parts becomes their texts concatenated: the same tokens, and the string is what is sent and stored.
A part of any other type (``image_url``, ``input_audio``, ``file``, ``refusal``, ...) has no text to
send and the row is rejected (``docs/dataset-rows.md``).
"""

from __future__ import annotations

from typing import Any

from engine.datasets.kinds import kind_of


def join_text_parts(content: Any) -> Any:
    """``content`` with a list of text parts joined into one string; any other value unchanged.

    Args:
        content: a message's ``content`` (a string, null, a list of parts, anything).

    Returns:
        ``"".join(part["text"] ...)`` for a list whose every part is ``{"type": "text", "text": str}``
        (other keys of a part, e.g. ``cache_control``, are ignored; an empty list gives ``""``);
        ``content`` itself when it is not a list.

    Raises:
        ValueError: ``"content part K is a T, expected an object"``, ``"content part K has type 'image_url';
            only text parts can be sent as text"``, ``"content part K has no 'type'"``, ``"content part K:
            'text' is a T, expected a string"`` (K 1-based).
    """
    if not isinstance(content, list):
        return content
    texts = []
    for k, part in enumerate(content, 1):
        if not isinstance(part, dict):
            raise ValueError(f"content part {k} is {kind_of(part)}, expected an object")
        kind = part.get("type")
        if kind is None:
            raise ValueError(f"content part {k} has no 'type' (expected 'text')")
        if kind != "text":
            raise ValueError(f"content part {k} has type {kind!r}; only text parts can be sent as text")
        text = part.get("text")
        if not isinstance(text, str):
            got = "missing" if "text" not in part else kind_of(text)
            raise ValueError(f"content part {k}: 'text' is {got}, expected a string")
        texts.append(text)
    return "".join(texts)
