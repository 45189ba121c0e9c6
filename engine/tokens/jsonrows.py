"""JSON-lines rows with one schema: the message shape and the JSON-text fields of the JSONL exports.

``datasets.load_dataset("json", ...)`` reads a file in 10 MiB chunks with pyarrow's JSON reader; the
FIRST chunk of the FIRST file fixes the schema and every later chunk and file is cast to it, so a key
that chunk never had, a value typed ``null`` there (every row null, or an empty list), or a value of
another type (a string where it saw an object, a float where it saw an int) fails the whole load
(``Couldn't cast array of type ...``; facts and sources: ``docs/export-loading.md``). The JSONL
exports (``raw``, ``specforge``, ``openai``) are therefore written so that EVERY single row infers
the same schema:

- every row has the same keys at every depth;
- a value without one fixed shape is JSON text (``json.loads`` gives it back exactly): tool JSON
  schemas, tool-call lists (with their argument objects), a content that is not a string;
- a string field some rows lack is ``""`` there, never ``null`` (a chunk of nulls would fix it as
  ``null``), unless every row holds a string in it elsewhere (a message's ``content``: each row's
  user turn has one; ``reasoning_content``: the generated turn always has one).

Functions here are pure (no I/O).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

#: The keys of every exported message, in this order (``specforge`` ``conversations``, ``openai``
#: ``messages``). Other keys of a stored message (ingest stores none) are left out.
MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")


def json_text(value: Any) -> str:
    """``value`` as JSON text (``json.dumps``, default separators, non-ASCII kept): what the exports
    write for a field without one fixed shape; ``json.loads`` gives ``value`` back."""
    return json.dumps(value, ensure_ascii=False)


def export_message(m: Mapping[str, Any]) -> dict[str, Any]:
    """A stored OpenAI-shape message as an exported one: exactly :data:`MESSAGE_KEYS`.

    - ``role``: as stored.
    - ``content``, ``reasoning_content``: the string, or ``null`` when there is none (``content``: an
      assistant turn of tool calls only).
    - ``tool_calls``: JSON text of the list, verbatim (ids, argument objects or strings as stored);
      ``"[]"`` when there is none.
    - ``tool_call_id``, ``name``: the string, ``""`` when there is none.

    A string field holding something else (a ``content`` list of content parts: ingest refuses them,
    only an edited store holds one) is written as its JSON text.
    """
    return {
        "role": m["role"],
        "content": _string(m.get("content"), None),
        "reasoning_content": _string(m.get("reasoning_content"), None),
        "tool_calls": json_text(m.get("tool_calls") or []),
        "tool_call_id": _string(m.get("tool_call_id"), ""),
        "name": _string(m.get("name"), ""),
    }


def _string(value: Any, none: str | None) -> str | None:
    if value is None:
        return none
    return value if isinstance(value, str) else json_text(value)


def assistant_message(content: str | None, reasoning: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The generated assistant turn in the exported message shape (``calls``: its OpenAI-shape tool
    calls, native ids; ``content`` None for a turn of tool calls only, as the ``openai`` format writes)."""
    return export_message({"role": "assistant", "content": content, "reasoning_content": reasoning,
                           "tool_calls": calls})
