"""ShareGPT turns (``conversations: [{from, value}]``) -> OpenAI messages, tool calls paired with results.

Rules (``docs/dataset-rows.md``, section "ShareGPT"):

* Speakers: human/user -> ``user``; gpt/assistant/chatgpt/bing/bard/model -> ``assistant``;
  ``system``; observation/function/tool -> ``tool``; ``function_call`` -> ``assistant`` with
  ``tool_calls`` (LLaMA-Factory's convention). ``{role, content}`` turns are read the same way.
* A ``function_call`` value is one call ``{"name", "arguments"}`` or a list of them (parallel calls,
  a JSON array); JSON text, a Python literal, or an already parsed object/array. Each call gets the
  native id ``functions.{name}:{index}`` (:mod:`engine.datasets.tool_calls`; ``index`` counts the calls
  before it, from the first user turn on). Consecutive ``function_call`` turns stay separate
  messages here; role normalisation (:mod:`engine.datasets.roles`) merges them into ONE assistant turn
  whose ``tool_calls`` are concatenated in order: the parallel calls an OpenAI assistant message has.
* Results pair with calls first in, first out: each observation answers the oldest unanswered call
  and becomes one ``tool`` message with that call's id. An observation whose value is a JSON array
  with as many elements as a list-valued ``function_call`` made calls (two or more), all of them still
  unanswered, is split: one ``tool`` message per element (an element that is a string is kept as is,
  any other is written as JSON), each with its own call's id. Anything else is one ``tool`` message.
* A user, assistant (text) or system turn closes the calls before it: a call never answered is kept
  (Kimi's template renders a call without result), and a later observation cannot answer it.
* An observation with no unanswered call is an error (``"message N: observation without a preceding
  function_call"``) in a row that writes its calls as ``function_call`` turns. A row with no
  ``function_call`` turn at all (Hermes-style rows write the call inside the gpt text) keeps its
  result turns as ``tool`` messages without an id.

Functions here are pure (no I/O); errors are ``ValueError`` with the row-relative reason.
"""

from __future__ import annotations

import json
from typing import Any

from engine.datasets.glaive import parse_call
from engine.datasets.kinds import kind_of
from engine.datasets.messages import text_content
from engine.datasets.tool_calls import CallQueue, make_call, read_literal

#: ShareGPT speaker (lower case) -> OpenAI role.
SPEAKERS = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "bard": "assistant", "model": "assistant",
    "system": "system",
    "tool": "tool", "function": "tool", "observation": "tool",
    "function_call": "assistant",
}
_MISSING = object()
_LISTED = "list"  # CallQueue tag of a list-valued function_call turn


def sharegpt_messages(turns: list[Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """Turn a row's ``conversations`` list into OpenAI messages.

    Args:
        turns: the row's turns (``{from, value}`` or ``{role, content}`` objects).

    Returns:
        ``(messages, numbers)``: OpenAI-shape messages and, per message, the 1-based number of the
        turn it came from (a split observation gives several messages the same number).

    Raises:
        ValueError: ``"message N: ..."``: not an object, missing ``from``/``value``, unknown role, a
            ``function_call`` that is not a call or a list of calls, an observation without a
            preceding ``function_call``.
    """
    structured = any(isinstance(t, dict) and _speaker(t) == "function_call" for t in turns)
    first_user = next((k for k, t in enumerate(turns) if isinstance(t, dict) and _speaker(t) in ("human", "user")),
                      len(turns))
    queue = CallQueue()
    lead = 0  # calls before the first user turn
    messages: list[dict[str, Any]] = []
    numbers: list[int] = []
    for k, turn in enumerate(turns):
        n = k + 1
        if not isinstance(turn, dict):
            raise ValueError(f"message {n}: {kind_of(turn)}, expected an object")
        speaker = turn.get("from", turn.get("role", _MISSING))
        if speaker is _MISSING:
            raise ValueError(f"message {n}: missing field 'from'")
        role = SPEAKERS.get(speaker.lower()) if isinstance(speaker, str) else None
        if role is None or not isinstance(speaker, str):
            raise ValueError(f"message {n}: unknown role {speaker!r}")
        value = turn.get("value", turn.get("content", _MISSING))
        if value is _MISSING:
            raise ValueError(f"message {n}: missing field 'value'")
        if speaker.lower() != "function_call":  # a list of text parts: joined (a call list stays a list)
            value = text_content(n, value, cut=n == len(turns) and role == "assistant")
        if speaker.lower() == "function_call":
            try:
                pairs, listed = parse_calls(value)
            except ValueError as e:
                raise ValueError(f"message {n}: {e}") from None
            base = queue.made - lead
            calls = [make_call(name, args, base + i) for i, (name, args) in enumerate(pairs)]
            if k < first_user:  # dropped by role normalisation: not counted in later calls' index
                lead += len(pairs)
            queue.add(calls, _LISTED if listed else None)
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            numbers.append(n)
            continue
        if role != "tool":
            queue.clear()
            messages.append({"role": role, "content": value})
            numbers.append(n)
            continue
        for msg in _results(n, value, turn.get("tool_call_id"), queue, structured):
            messages.append(msg)
            numbers.append(n)
    return messages, numbers


def _speaker(turn: dict[str, Any]) -> str:
    s = turn.get("from", turn.get("role"))
    return s.lower() if isinstance(s, str) else ""


def _results(n: int, value: Any, given: Any, queue: CallQueue, structured: bool) -> list[dict[str, Any]]:
    """The ``tool`` message(s) of observation turn ``n`` (see the module rules)."""
    if isinstance(given, str) and given:
        return [{"role": "tool", "content": value, "tool_call_id": queue.take(given)}]
    if not queue:
        if structured:
            raise ValueError(f"message {n}: observation without a preceding function_call")
        return [{"role": "tool", "content": value}]
    parts = _array(value)
    unanswered, size, tag = queue.head_turn()
    if tag == _LISTED and parts is not None and len(parts) == size == unanswered >= 2:
        return [{"role": "tool", "content": part if isinstance(part, str) else json.dumps(part, ensure_ascii=False),
                 "tool_call_id": queue.take()} for part in parts]
    return [{"role": "tool", "content": value, "tool_call_id": queue.take()}]


def _array(value: Any) -> list[Any] | None:
    """``value`` read as a JSON array (None when it is not one)."""
    if not isinstance(value, str) or not value.lstrip().startswith("["):
        return None
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, list) else None


def parse_calls(value: Any) -> tuple[list[tuple[str, Any]], bool]:
    """Read a ``function_call`` value as calls.

    Args:
        value: JSON text or a Python literal (glaive-style single-quoted arguments included) of a call
            ``{"name", "arguments"}`` or of a list of calls; or the already parsed object / list. A
            call may also be written OpenAI-style, ``{"type": "function", "function": {"name",
            "arguments"}}``. Missing arguments are ``{}``.

    Returns:
        ``([(name, arguments), ...], listed)``: one pair per call (arguments as found: an object or
        text; :func:`engine.datasets.tool_calls.arguments_json` makes them JSON text), and whether the
        value was a list.

    Raises:
        ValueError: ``"function_call is not a call or a list of calls ..."``, ``"function_call holds
            no calls"``, ``"function_call call K: ..."`` (K 1-based in a list).
    """
    obj = value
    if isinstance(value, str):
        try:
            obj = [] if value.strip() == "[]" else read_literal(value)
        except ValueError:
            obj = None
        if obj is None:
            try:
                return [parse_call(value)], False  # glaive's textual shape
            except ValueError:
                raise ValueError(f"function_call is not a call or a list of calls ({{name, arguments}}): "
                                 f"{value.strip()[:60]!r}") from None
    if isinstance(obj, dict):
        return [_call(obj, None)], False
    if isinstance(obj, list):
        if not obj:
            raise ValueError("function_call holds no calls (an empty list)")
        return [_call(c, k) for k, c in enumerate(obj, 1)], True
    raise ValueError(f"function_call is {kind_of(obj)}, expected a call or a list of calls ({{name, arguments}})")


def _call(obj: Any, k: int | None) -> tuple[str, Any]:
    where = "function_call" if k is None else f"function_call call {k}"
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is {kind_of(obj)}, expected an object {{name, arguments}}")
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        got = "missing" if name is None else "empty" if isinstance(name, str) else kind_of(name)
        raise ValueError(f"{where}: function name is {got}, expected a non-empty string")
    return name, obj.get("arguments", {})
