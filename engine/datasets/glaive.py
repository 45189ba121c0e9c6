"""Glaive function-calling text (B1, glaiveai/glaive-function-calling-v2) -> OpenAI messages and tools.

A glaive row is two flat strings:

* ``system``: ``"SYSTEM: <text> Use them if required -\\n{schema}\\n\\n{schema}\\n"``, where each
  schema is a pretty-printed JSON function definition (``{"name", "description", "parameters"}``);
  rows without functions say e.g. ``"SYSTEM: You are a helpful assistant, with no access to
  external functions."``.
* ``chat``: turns separated by ``"\\n\\n\\n"``, each starting ``USER: ``, ``ASSISTANT: `` or
  ``FUNCTION RESPONSE: ``; assistant turns end with `` <|endoftext|>``. A tool call is written
  ``ASSISTANT: <functioncall> {"name": "f", "arguments": '{"a": 1}'}``: the arguments are a
  *single-quoted* JSON string, so the payload is not JSON.

Tool calls get the model's native ids ``functions.{name}:{index}`` (index: calls before it, 0-based;
:mod:`engine.datasets.tool_calls`, the same scheme as ShareGPT ``function_call`` turns), and each
``FUNCTION RESPONSE`` becomes a ``tool`` message answering the latest call (glaive makes one call per
turn). :func:`parse_call` also reads ShareGPT ``function_call`` values written in glaive's shape.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from engine.datasets.tool_calls import arguments_json, make_call

__all__ = ["arguments_json", "parse_call", "parse_glaive", "parse_system", "split_chat"]

_SYSTEM_PREFIX = "SYSTEM:"
_FUNCTIONS_MARKER = "Use them if required -"
_TURN = re.compile(r"(?:\A|\n\n\n)(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_ROLE = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
_END = "<|endoftext|>"
_CALL_TAG = "<functioncall>"
_CALL_SHAPE = re.compile(
    r"""\A\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*'(.*)'\s*\}\Z""", re.DOTALL
)
_JSON = json.JSONDecoder()


def parse_system(system: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a glaive ``system`` string into (system text, OpenAI tools).

    The leading ``"SYSTEM: "`` is removed; the text up to and including ``"Use them if required -"``
    is the system text (stripped); the JSON objects after it become
    ``{"type": "function", "function": schema}`` tools, in order.

    Raises:
        ValueError: a function schema is not a JSON object with a ``name``.
    """
    text = system.strip()
    if text.startswith(_SYSTEM_PREFIX):
        text = text[len(_SYSTEM_PREFIX):].strip()
    cut = text.find(_FUNCTIONS_MARKER)
    if cut < 0:
        return text, []
    head, rest = text[: cut + len(_FUNCTIONS_MARKER)].strip(), text[cut + len(_FUNCTIONS_MARKER):]
    tools: list[dict[str, Any]] = []
    i = 0
    while True:
        while i < len(rest) and rest[i].isspace():
            i += 1
        if i >= len(rest):
            return head, tools
        try:
            schema, i = _JSON.raw_decode(rest, i)
        except json.JSONDecodeError as e:
            raise ValueError(f"system: function schema {len(tools) + 1} is not JSON: {e.msg} (char {e.pos})") from None
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
            raise ValueError(f"system: function schema {len(tools) + 1} is not an object with a 'name'")
        tools.append({"type": "function", "function": schema})


def split_chat(chat: str) -> list[tuple[str, str]]:
    """Split a glaive ``chat`` string into ``(role, text)`` turns (OpenAI role names, text stripped).

    A turn's text keeps any ``"\\n\\n\\n"`` that is not followed by a turn prefix.

    Raises:
        ValueError: the chat has text before its first turn prefix; a USER or FUNCTION RESPONSE turn
            holds ``<|endoftext|>`` (glaive's end of an ASSISTANT turn: turn prefixes not separated by
            glaive's blank lines, so several turns would become one).
    """
    matches = list(_TURN.finditer(chat))
    lead = chat[: matches[0].start()] if matches else chat
    if lead.strip():
        raise ValueError(f"chat: text before the first USER:/ASSISTANT:/FUNCTION RESPONSE: prefix: {lead[:40]!r}")
    turns = []
    for k, m in enumerate(matches):
        end = matches[k + 1].start() if k + 1 < len(matches) else len(chat)
        text = chat[m.end():end].strip()
        role = _ROLE[m.group(1)]
        if role == "assistant":
            while text.endswith(_END):
                text = text[: -len(_END)].rstrip()
        elif _END in text:
            raise ValueError(f"message {k + 1}: {m.group(1)} turn holds {_END!r}, which ends an ASSISTANT turn: turns "
                             f"must be separated by a blank line before their prefix ('\\n\\n\\nASSISTANT:')")
        turns.append((role, text))
    return turns


def parse_glaive(system: str | None, chat: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Turn a glaive row into ``(messages, tools, offset)``; ``offset`` is 1 when a system message leads.

    The whole conversation is returned (the caller applies the prompt rule,
    ``docs/prompt-construction.md``: a final assistant turn is cut, a conversation ending on a function
    response is kept whole); the final assistant turn(s) (the trailing run the rule cuts) are kept as
    plain text, so a malformed call there cannot spoil the row.

    Raises:
        ValueError: bad function schema, text before the first turn, or an unparseable
            ``<functioncall>`` in an assistant turn the prompt keeps (message number 1-based in ``chat``).
    """
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    if system is not None and system.strip():
        text, tools = parse_system(system)
        if text:
            messages.append({"role": "system", "content": text})
    offset = len(messages)
    turns = split_chat(chat)
    final_run = len(turns)  # the trailing run of assistant turns: cut by the prompt rule, never parsed
    while final_run > 0 and turns[final_run - 1][0] == "assistant":
        final_run -= 1
    calls = 0
    pending: str | None = None
    for k, (role, text) in enumerate(turns):
        msg: dict[str, Any] = {"role": role, "content": text}
        if role == "assistant" and k < final_run and _CALL_TAG in text:
            before, _, payload = text.partition(_CALL_TAG)
            try:
                name, arguments = parse_call(payload)
            except ValueError as e:
                raise ValueError(f"message {k + 1}: {e}") from None
            call = make_call(name, arguments, calls)
            calls += 1
            pending = call["id"]
            msg = {"role": "assistant", "content": before.strip(), "tool_calls": [call]}
        elif role == "tool" and pending is not None:
            msg["tool_call_id"] = pending
        messages.append(msg)
    return messages, tools, offset


def parse_call(payload: str) -> tuple[str, str]:
    """Parse a tool-call payload ``{"name": ..., "arguments": ...}`` into (name, arguments JSON string).

    Accepts real JSON (arguments as an object or a JSON string), Python-literal style (glaive's
    single-quoted arguments string, ``\\'`` escapes included), and as a last resort the glaive shape
    matched textually. Arguments are returned as JSON text when they can be read as JSON, else as
    the raw text found in the source.

    Raises:
        ValueError: no function name can be found.
    """
    payload = payload.strip()
    obj: Any = None
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError):
        try:
            obj = ast.literal_eval(payload)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            obj = None
    if isinstance(obj, dict) and isinstance(obj.get("name"), str):
        return obj["name"], arguments_json(obj.get("arguments", {}))
    m = _CALL_SHAPE.match(payload)
    if m:
        try:
            name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            name = m.group(1)
        return name, arguments_json(m.group(2))
    raise ValueError(f"unparseable {_CALL_TAG} payload: {payload[:60]!r}")
