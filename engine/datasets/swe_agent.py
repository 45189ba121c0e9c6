"""SWE-agent trajectory ``history`` -> OpenAI messages; ``tool_calls``/``tool_call_ids`` parsed and checked.

SWE-agent's ``.traj`` files (and datasets built from them, e.g. SWE-smith trajectories) store a
message's ``tool_calls`` and ``tool_call_ids`` either as JSON values or, after a round trip through
``str()``, as their Python repr: ``"[{'function': {'arguments': '{...}', 'name': 'open'}, 'id':
'call_abc123', 'type': 'function'}]"`` and ``"['call_abc123']"``. Rules (``docs/dataset-rows.md``,
section "SWE-agent"):

* Such a string is read as JSON, else as a Python literal (:func:`ast.literal_eval`, which evaluates
  literals only, never code). ``null``, ``""``, ``"None"`` and ``[]`` mean no calls.
* ``tool_calls`` must then be a list of calls ``{"id": str, "type": "function", "function": {"name":
  str, "arguments": str}}`` (``type`` may be absent; ``arguments`` given as an object is written as
  JSON text). Only those keys are kept; the row's own ids are kept. Anything else rejects the row:
  ``"message N: tool_calls is not a list of calls: ..."``.
* A ``tool`` message answers ``tool_call_ids``' single id. SWE-agent writes one observation per call,
  so a message listing several ids (one text for several calls, which no tool message can carry)
  rejects the row: ``"message N: one tool message answers K calls ..."``. A ``tool`` message without
  ids answers the oldest call not yet answered (:class:`engine.datasets.tool_calls.CallQueue`).
* The final history entry, when it is an assistant turn, is the turn the prompt is cut before: its
  ``tool_calls`` are parsed when they can be, and dropped (not an error) when they cannot.
* Agent-internal keys (``agent``, ``message_type``, ``thought``, ``action``, ``is_demo``...) are
  dropped; demonstration messages are kept (they are part of the prompt the agent saw).

The same trajectories as published on the Hugging Face Hub (``docs/datasets.md``, B8):

* SWE-smith trajectories (``SWE-bench/SWE-smith-trajectories``): ``messages`` is the JSON text of the
  message list (SWE-agent history entries in the ``tool`` split; plain ``{role, content}`` turns in the
  ``xml`` and ``ticks`` splits): :func:`decode_messages`, then the rules above.
* nebius/SWE-agent-trajectories: ``trajectory`` is a list of ``{role: system|user|ai, text,
  system_prompt, mask, cutoff_date}`` steps: :func:`nebius_messages` (``ai`` is the assistant; a
  ``system`` step's text is its ``system_prompt``). Actions are text (the thought, then the command in
  a fenced block), observations ``user`` turns: no tool calls.

Functions here are pure (no I/O); errors are ``ValueError`` with the row-relative reason.
"""

from __future__ import annotations

import json
from typing import Any

from engine.datasets.kinds import kind_of
from engine.datasets.messages import base_message
from engine.datasets.tool_calls import NONE_TEXTS, CallQueue, read_literal

_MISSING = object()


def parse_tool_calls(value: Any) -> list[dict[str, Any]]:
    """A message's ``tool_calls`` field -> OpenAI-shape calls (empty list for none).

    Raises:
        ValueError: ``"tool_calls is not a list of calls: ..."`` with what was wrong.
    """
    try:
        calls = read_literal(value)
    except ValueError as e:
        raise ValueError(f"tool_calls is not a list of calls: {e}") from None
    if calls is None or calls == []:
        return []
    if not isinstance(calls, list):
        raise ValueError(f"tool_calls is not a list of calls: {kind_of(calls)}")
    return [_call(k, c) for k, c in enumerate(calls, 1)]


def _call(k: int, call: Any) -> dict[str, Any]:
    bad = f"tool_calls is not a list of calls: call {k}"
    if not isinstance(call, dict):
        raise ValueError(f"{bad} is {kind_of(call)}, expected an object")
    cid = call.get("id")
    if not isinstance(cid, str) or not cid:
        raise ValueError(f"{bad} has no 'id' (a non-empty string)")
    kind = call.get("type", "function")
    if kind != "function":
        raise ValueError(f"{bad} has type {kind!r}, expected 'function'")
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{bad}: 'function' is {kind_of(fn)}, expected an object {{name, arguments}}")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{bad}: function name is {kind_of(name) if name != '' else 'empty'}, expected a non-empty string")
    args = fn.get("arguments", _MISSING)
    if args is _MISSING or args is None:
        raise ValueError(f"{bad} ({name}): missing 'arguments'")
    if isinstance(args, dict):
        args = json.dumps(args, ensure_ascii=False)
    elif not isinstance(args, str):
        raise ValueError(f"{bad} ({name}): 'arguments' is {kind_of(args)}, expected a JSON string")
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def parse_call_ids(value: Any) -> list[str]:
    """A message's ``tool_call_ids`` (a list of ids, its repr, or one bare id) -> the ids.

    Raises:
        ValueError: ``"tool_call_ids is not a list of ids: ..."``.
    """
    if isinstance(value, str) and value.strip() and not value.strip().startswith(("[", "(")):
        text = value.strip()
        return [] if text.lower() in NONE_TEXTS else [text]  # one bare id
    try:
        ids = read_literal(value)
    except ValueError as e:
        raise ValueError(f"tool_call_ids is not a list of ids: {e}") from None
    if ids is None:
        return []
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, str) and i for i in ids):
        raise ValueError(f"tool_call_ids is not a list of ids: {str(ids)[:60]!r}")
    return list(ids)


def swe_agent_messages(history: list[Any]) -> list[dict[str, Any]]:
    """Turn a trajectory's ``history`` into OpenAI messages (one per history entry, in order).

    Returns:
        messages with ``role``, ``content`` (when present), ``tool_calls`` (assistant) and
        ``tool_call_id`` (tool).

    Raises:
        ValueError: ``"message N: ..."``: not an object, missing or unknown role, ``tool_calls`` not a
            list of calls (except on a final assistant entry), ``tool_call_ids`` not a list of ids or
            listing several ids.
    """
    queue = CallQueue()
    messages = []
    for n, m in enumerate(history, 1):
        msg = base_message(n, m, final=n == len(history))
        role = msg["role"]
        try:
            calls = parse_tool_calls(m.get("tool_calls"))
            ids = parse_call_ids(m.get("tool_call_ids")) if role == "tool" else []
        except ValueError as e:
            if not (n == len(history) and role == "assistant"):
                raise ValueError(f"message {n}: {e}") from None
            calls, ids = [], []  # the final assistant turn is cut from the prompt: its calls cannot spoil it
        if calls:
            msg["tool_calls"] = calls
            queue.add(calls)
        if role == "tool":
            if len(ids) > 1:
                raise ValueError(f"message {n}: one tool message answers {len(ids)} calls (tool_call_ids {ids}); "
                                 f"expected one observation per call")
            call_id = queue.take(ids[0] if ids else None)
            if call_id is not None:
                msg["tool_call_id"] = call_id
        elif role == "user":
            queue.clear()
        messages.append(msg)
    return messages


def decode_messages(value: Any) -> list[Any]:
    """SWE-smith trajectories' ``messages`` column -> the message list: JSON text is decoded, a list is
    taken as it is.

    Raises:
        ValueError: ``"field 'messages' is a string but not JSON: ..."``, ``"field 'messages' holds a T,
            expected a list of messages"`` or ``"field 'messages' is a T, expected a list of messages or
            its JSON text"``.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"field 'messages' is a string but not JSON: {e}") from None
        if not isinstance(value, list):
            raise ValueError(f"field 'messages' holds {kind_of(value)}, expected a list of messages")
    elif not isinstance(value, list):
        raise ValueError(f"field 'messages' is {kind_of(value)}, expected a list of messages or its JSON text")
    return value


#: nebius/SWE-agent-trajectories ``trajectory[].role`` -> the OpenAI role.
NEBIUS_ROLES = {"system": "system", "user": "user", "ai": "assistant"}


def nebius_messages(trajectory: list[Any]) -> list[dict[str, Any]]:
    """nebius/SWE-agent-trajectories' ``trajectory`` -> OpenAI messages (one per step, in order).

    A step is ``{role, text, system_prompt, mask, cutoff_date}``: ``text`` is the content (null on the
    ``system`` step, whose content is ``system_prompt``); ``mask`` and ``cutoff_date`` are dropped. The
    content's type is checked later, with every format's (``engine.datasets.rule.cut_prompt``): a null
    one is ``"message N: null content"``.

    Raises:
        ValueError: ``"message N: a T, expected an object"``, ``"message N: missing field 'role'"``
            (with a hint when the step is a ``.traj`` step, ``{action, observation, ...}``),
            ``"message N: unknown role R (nebius roles: 'system', 'user', 'ai')"``.
    """
    messages = []
    for n, step in enumerate(trajectory, 1):
        if not isinstance(step, dict):
            raise ValueError(f"message {n}: {kind_of(step)}, expected an object")
        role = step.get("role", _MISSING)
        if role is _MISSING:
            traj = "action" in step or "observation" in step
            hint = " (a .traj step, not a message: a .traj's messages are its 'history', which this row lacks)"
            raise ValueError(f"message {n}: missing field 'role'" + (hint if traj else ""))
        if role not in NEBIUS_ROLES:
            raise ValueError(f"message {n}: unknown role {role!r} (nebius roles: 'system', 'user', 'ai')")
        text = step.get("text")
        if role == "system" and step.get("system_prompt") is not None:
            text = step["system_prompt"]
        messages.append({"role": NEBIUS_ROLES[role], "content": text})
    return messages
