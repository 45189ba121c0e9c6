"""Adapters: one parsed dataset row (a dict) -> one prompt, for each supported row format.

Each adapter turns a row into a :class:`Conversation` (the whole conversation in OpenAI message
shape, the row's own answer included when it has one, plus tools) or raises :class:`AdapterError`
with a precise reason. After the role normalisation (``engine.datasets.rule.normalise_conversation``),
``engine.datasets.rule.cut_prompt`` applies the ONE prompt rule shared by all formats (``docs/prompt-construction.md``):
a conversation ending on a ``user`` or ``tool`` turn IS the prompt, whole; one ending on an
``assistant`` turn is cut just before that final turn; any other conversation is rejected. Then the
reasoning of every assistant turn kept in the prompt is moved out of ``content`` into
``reasoning_content`` (:mod:`engine.datasets.reasoning`). ``engine.datasets.row_to_prompt`` runs all.

Formats (``docs/datasets.md`` describes each dataset and the bundled samples):

=================== =============================================================================
``openai``          ``messages: [{role, content, ...}]`` (+ ``tools``): B4 Mixture-of-Thoughts,
                    B6 ultrachat_200k, any OpenAI-shape chat data.
``sharegpt``        ``conversations: [{from, value}]`` (+ ``system``, ``tools``): B7 ShareGPT,
                    B5 OpenThoughts-114k / OpenThoughts3.
``instruction``     ``instruction`` (+ ``input``, + ``system``) (+ ``response``/``output``): B3 Magicoder
                    Evol-Instruct, Alpaca.
``oss_instruct``    ``problem`` as the user turn (+ ``solution``): B3 Magicoder OSS-Instruct.
``opencodeinstruct`` ``input`` as the user turn (+ ``output``): B2 nvidia/OpenCodeInstruct.
``glaive``          ``system`` + ``chat`` flat strings: B1 glaive-function-calling-v2.
``swe_agent``       ``history: [{role, content, tool_calls, tool_call_ids, ...}]``: B8 ``.traj``; the
                    same messages as JSON text in ``messages`` (SWE-smith trajectories on the Hub);
                    ``trajectory: [{role: system|user|ai, text, ...}]`` (nebius/SWE-agent-trajectories).
``ultrachat``       ``data: [str, ...]`` alternating user/assistant: B6 stingning/ultrachat.
``text``            ``prompt`` string as the user turn.
=================== =============================================================================

Message numbers in reasons (``"message N: ..."``) are 1-based positions in the row's own turn list
(``messages``, ``conversations``, ``history``, ``trajectory``, ``data``, or the turns of a glaive ``chat``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.datasets.glaive import parse_glaive
from engine.datasets.kinds import kind_of
from engine.datasets.messages import base_message
from engine.datasets.reasoning import REASONING_FIELDS
from engine.datasets.sharegpt import sharegpt_messages
from engine.datasets.swe_agent import decode_messages, nebius_messages, parse_tool_calls, swe_agent_messages
from engine.datasets.tool_calls import pair_openai_results
from engine.errors import DatagenError

#: Canonical field names a ``fields`` mapping may rename (canonical name -> source column).
FIELD_KEYS = frozenset({"messages", "conversations", "system", "prompt", "instruction", "input", "tools"})

_MISSING = object()
_OPENAI_KEYS = ("name", "tool_calls", "tool_call_id")


class AdapterError(DatagenError, ValueError):
    """A row that cannot become a prompt; ``str(err)`` is the reject reason."""


class MissingField(AdapterError):
    """A required top-level field is absent; ``name`` is its canonical name (before ``fields``)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"missing field {name!r}")
        self.name = name


@dataclass(slots=True)
class Conversation:
    """A whole conversation from one row.

    Attributes:
        messages: OpenAI-shape messages (``role`` always in ``engine.prompts.ROLES``).
        tools: OpenAI-shape tool definitions.
        offset: how many messages were added in front of the row's own turn list (e.g. a system
            message from a separate ``system`` field); used to number messages in reasons.
        numbers: each message's 1-based number in the row's own turn list (None for an added
            message); set by ``engine.datasets.rule.normalise_conversation``, or by an adapter whose
            messages are not one per turn (a split ShareGPT observation); None: numbers follow from ``offset``.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    offset: int = 0
    numbers: list[int | None] | None = None

    def label(self, i: int) -> str:
        """How reasons name message ``i`` (0-based in :attr:`messages`): ``"message N"`` (1-based in
        the row's own turn list) or ``"the 'system' field"`` for a message the adapter added."""
        n = self.numbers[i] if self.numbers is not None else (i - self.offset + 1 if i >= self.offset else None)
        return "the 'system' field" if n is None else f"message {n}"


# ----------------------------------------------------------------------------- field helpers


def _get(row: Mapping[str, Any], name: str) -> Any:
    if name not in row:
        raise MissingField(name)
    return row[name]


def _string(row: Mapping[str, Any], name: str) -> str:
    value = _get(row, name)
    if not isinstance(value, str):
        raise AdapterError(f"field {name!r} is {kind_of(value)}, expected a string")
    return value


def _list(row: Mapping[str, Any], name: str) -> list[Any]:
    value = _get(row, name)
    if not isinstance(value, list):
        raise AdapterError(f"field {name!r} is {kind_of(value)}, expected a list")
    return value


def _system(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An optional ``system`` field as a leading system message (none if absent, null or blank)."""
    value = row.get("system")
    if value is None:
        return []
    if not isinstance(value, str):
        raise AdapterError(f"field 'system' is {kind_of(value)}, expected a string")
    return [{"role": "system", "content": value}] if value.strip() else []


def _tools(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An optional ``tools`` field: a list (or JSON string of a list) of OpenAI tools or bare schemas."""
    value = row.get("tools")
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise AdapterError(f"field 'tools' is a string but not JSON: {e}") from None
    if not isinstance(value, list):
        raise AdapterError(f"field 'tools' is {kind_of(value)}, expected a list")
    tools = []
    for n, tool in enumerate(value, 1):
        if not isinstance(tool, dict):
            raise AdapterError(f"tool {n}: {kind_of(tool)}, expected an object")
        if "function" not in tool and isinstance(tool.get("name"), str):
            tool = {"type": "function", "function": tool}  # a bare function schema
        _check_tool(n, tool)
        tools.append(tool)
    return tools


def _check_tool(n: int, tool: Mapping[str, Any]) -> None:
    """Reject a tool definition every OpenAI-compatible API would answer with a 400 (one failed
    request per prompt otherwise): not ``type: function``, no function name, or ``parameters`` that
    are not a JSON Schema object."""
    kind = tool.get("type", "function")
    if kind != "function":
        raise AdapterError(f"tool {n}: type {kind!r}, expected 'function'")
    fn = tool.get("function", _MISSING)
    if fn is _MISSING:
        raise AdapterError(f"tool {n}: missing field 'function' (or a bare schema with a 'name')")
    if not isinstance(fn, dict):
        raise AdapterError(f"tool {n}: field 'function' is {kind_of(fn)}, expected an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        got = "missing" if name is None else f"{kind_of(name)}" if not isinstance(name, str) else "empty"
        raise AdapterError(f"tool {n}: function name is {got}, expected a non-empty string")
    params = fn.get("parameters")
    if params is None:
        return
    if not isinstance(params, dict):
        raise AdapterError(f"tool {n} ({name}): 'parameters' is {kind_of(params)}, expected a JSON Schema object")
    ptype = params.get("type", "object")
    if ptype != "object":
        raise AdapterError(f"tool {n} ({name}): 'parameters' has type {ptype!r}, expected 'object'")
    props = params.get("properties")
    if props is not None and not isinstance(props, dict):
        raise AdapterError(f"tool {n} ({name}): 'parameters.properties' is {kind_of(props)}, expected an object")


# ----------------------------------------------------------------------------- adapters


def adapt_openai(row: Mapping[str, Any]) -> Conversation:
    """``{"messages": [{role, content, name?, tool_calls?, tool_call_id?, reasoning_content?}], "tools"?}``.

    Only the OpenAI message keys are kept; keys with null values (as Parquet structs produce) drop.
    A ``content`` list of text parts is joined into one string as Kimi's template joins it, no separator
    (:mod:`engine.datasets.parts`); a non-text part (``image_url``, ...) rejects the row.
    ``tool_calls`` stored as a string (JSON text, or a Python repr as some exports write it) is parsed
    and checked like SWE-agent's (:func:`engine.datasets.swe_agent.parse_tool_calls`; docs/dataset-rows.md).
    Missing call ids and ``tool_call_id``s are filled (:func:`engine.datasets.tool_calls.pair_openai_results`).
    An assistant turn's reasoning field (``reasoning_content``, or OpenRouter's ``reasoning``) is kept
    (``engine.datasets.rule.cut_prompt`` stores it as ``reasoning_content``; ``docs/prompt-construction.md``).
    """
    messages = []
    turns = _list(row, "messages")
    for n, m in enumerate(turns, 1):
        try:
            msg = base_message(n, m, final=n == len(turns))
        except ValueError as e:
            raise AdapterError(str(e)) from None
        role = msg["role"]
        for key in _OPENAI_KEYS + (REASONING_FIELDS if role == "assistant" else ()):
            if m.get(key) not in (None, [], ""):
                msg[key] = m[key]
        if isinstance(msg.get("tool_calls"), str):  # stored as JSON text or a Python repr
            try:
                calls = parse_tool_calls(msg["tool_calls"])
            except ValueError as e:
                raise AdapterError(f"message {n}: {e}") from None
            if calls:
                msg["tool_calls"] = calls
            else:
                del msg["tool_calls"]
        messages.append(msg)
    return Conversation(pair_openai_results(messages), _tools(row))


def adapt_sharegpt(row: Mapping[str, Any]) -> Conversation:
    """``{"conversations": [{from, value}], "system"?, "tools"?}``; also ``{role, content}`` turns.

    Speakers, ``function_call`` turns (one call or a list of parallel calls, native ids) and how
    observations pair with calls (first in, first out): :mod:`engine.datasets.sharegpt`,
    ``docs/dataset-rows.md``.
    """
    messages = _system(row)
    offset = len(messages)
    try:
        turns, numbers = sharegpt_messages(_list(row, "conversations"))
    except ValueError as e:
        raise AdapterError(str(e)) from None
    return Conversation([*messages, *turns], _tools(row), offset, [None] * offset + numbers)


def adapt_instruction(row: Mapping[str, Any]) -> Conversation:
    """``{"instruction", "input"?, "response"|"output"?, "system"?, "history"?}``.

    The user turn is the instruction, a blank line, then the input (if non-empty); Alpaca-style
    ``history: [[query, answer], ...]`` pairs come before it as user/assistant turns, and the
    answer (``response`` or ``output``), when the row has one, closes the conversation: the prompt
    rule cuts it (``docs/prompt-construction.md``); without one the conversation ends on the
    instruction and is the prompt whole. Either way the prompt ends on the instruction.
    """
    text = _string(row, "instruction")
    extra = row.get("input")
    if extra is not None and not isinstance(extra, str):
        raise AdapterError(f"field 'input' is {kind_of(extra)}, expected a string")
    if extra and extra.strip():
        text = f"{text}\n\n{extra}" if text.strip() else extra  # no blank lines before a lone input
    messages = _system(row)
    offset = len(messages)
    for n, pair in enumerate(row.get("history") or [], 1):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise AdapterError(f"history entry {n}: expected a [query, answer] pair")
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    messages += [{"role": "user", "content": text}, *_answer(row, "response", "output")]
    return Conversation(messages, offset=offset)


def _answer(row: Mapping[str, Any], *names: str) -> list[dict[str, Any]]:
    """The row's own answer (the first of ``names`` present and not null) as a final assistant turn;
    none when the row has no answer. The prompt rule cuts it, so its value is never sent."""
    for name in names:
        if row.get(name) is not None:
            return [{"role": "assistant", "content": row[name]}]
    return []


def adapt_oss_instruct(row: Mapping[str, Any]) -> Conversation:
    """Magicoder OSS-Instruct ``{"problem", "solution", "seed", ...}``: ``problem`` is the user turn,
    ``solution`` (when present) the answer the prompt rule cuts."""
    return Conversation([{"role": "user", "content": _string(row, "problem")}, *_answer(row, "solution")])


def adapt_opencodeinstruct(row: Mapping[str, Any]) -> Conversation:
    """nvidia/OpenCodeInstruct ``{"id", "input", "output", ...}``: ``input`` is the user turn,
    ``output`` (when present) the answer the prompt rule cuts."""
    return Conversation([{"role": "user", "content": _string(row, "input")}, *_answer(row, "output")])


def adapt_glaive(row: Mapping[str, Any]) -> Conversation:
    """glaive-function-calling-v2 ``{"system", "chat"}``; see :mod:`engine.datasets.glaive`."""
    system = row.get("system")
    if system is not None and not isinstance(system, str):
        raise AdapterError(f"field 'system' is {kind_of(system)}, expected a string")
    chat = _string(row, "chat")
    try:
        messages, tools, offset = parse_glaive(system, chat)
    except ValueError as e:
        raise AdapterError(str(e)) from None
    return Conversation(messages, tools, offset)


def adapt_swe_agent(row: Mapping[str, Any]) -> Conversation:
    """SWE-agent trajectories in three forms (``docs/datasets.md``, B8), the first field present wins:

    * ``history``: a ``.traj`` ``{"history": [...], "trajectory", "info", ...}``; tools are not stored;
    * ``messages``: SWE-smith trajectories (the JSON text of the same messages) (+ ``tools``);
    * ``trajectory``: nebius/SWE-agent-trajectories steps ``{role: system|user|ai, text, system_prompt}``.

    ``tool_calls``/``tool_call_ids`` read from JSON or their Python repr, checked, paired:
    :mod:`engine.datasets.swe_agent`, ``docs/dataset-rows.md``.
    """
    try:
        if "history" in row:
            return Conversation(swe_agent_messages(_list(row, "history")))
        if "messages" in row:
            return Conversation(swe_agent_messages(decode_messages(row["messages"])), _tools(row))
        if "trajectory" in row:
            return Conversation(nebius_messages(_list(row, "trajectory")))
    except ValueError as e:
        raise AdapterError(str(e)) from None
    raise AdapterError("missing field 'history' (a SWE-agent .traj), 'messages' (SWE-smith trajectories) or "
                       "'trajectory' (nebius/SWE-agent-trajectories)")


def adapt_ultrachat(row: Mapping[str, Any]) -> Conversation:
    """stingning/ultrachat ``{"id", "data": [str, ...]}``: user, assistant, user, ... by position.

    Even length: ends on an assistant turn, which the prompt rule cuts; odd length: ends on a user
    turn and is the prompt whole (``docs/prompt-construction.md``)."""
    return Conversation(
        [{"role": "user" if n % 2 == 0 else "assistant", "content": text} for n, text in enumerate(_list(row, "data"))]
    )


def adapt_text(row: Mapping[str, Any]) -> Conversation:
    """``{"prompt": str, "system"?}``: the string is the single user turn."""
    system = _system(row)
    return Conversation([*system, {"role": "user", "content": _string(row, "prompt")}], offset=len(system))


#: Format name -> adapter, in the order :func:`detect_format` tries them.
ADAPTERS: dict[str, Callable[[Mapping[str, Any]], Conversation]] = {
    "swe_agent": adapt_swe_agent,
    "glaive": adapt_glaive,
    "openai": adapt_openai,
    "sharegpt": adapt_sharegpt,
    "ultrachat": adapt_ultrachat,
    "instruction": adapt_instruction,
    "oss_instruct": adapt_oss_instruct,
    "opencodeinstruct": adapt_opencodeinstruct,
    "text": adapt_text,
}



def _list_of(kind: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and (not v or isinstance(v[0], kind))


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


#: The key (and a test of its value) that makes :func:`detect_format` pick each format, in order.
_SIGNATURES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "swe_agent": ("history", _list_of(dict)),  # not Alpaca's history: [[q, a], ...]
    "glaive": ("chat", _is_str),
    "openai": ("messages", _list_of(object)),
    "sharegpt": ("conversations", _list_of(object)),
    "ultrachat": ("data", _list_of(str)),
    "instruction": ("instruction", _is_str),
    "oss_instruct": ("problem", _is_str),
    "opencodeinstruct": ("input", _is_str),
    "text": ("prompt", _is_str),
}
#: Human-readable list of the signature keys, for "unrecognised row format" rejects.
EXPECTED_KEYS = "; ".join(f"{key} ({name})" for name, (key, _) in _SIGNATURES.items())
#: What each format's signature key must hold, for rejects of a row whose key has the wrong type.
_SIGNATURE_SHAPES = {
    "swe_agent": "a list of objects", "glaive": "a string", "openai": "a list", "sharegpt": "a list",
    "ultrachat": "a list of strings", "instruction": "a string", "oss_instruct": "a string",
    "opencodeinstruct": "a string", "text": "a string",
}


def wrong_signature_type(row: Mapping[str, Any]) -> str | None:
    """For a row no format fits: the reason when a format's key is present with the wrong type
    (``"field 'chat' is an int, expected a string (glaive)"``); None when no such key is present."""
    for name, (key, _) in _SIGNATURES.items():
        if key in row and not (name == "swe_agent" and "instruction" in row):  # Alpaca's history
            hint = _SMITH_HINT if name == "openai" and isinstance(row[key], str) else ""
            return f"field {key!r} is {kind_of(row[key])}, expected {_SIGNATURE_SHAPES[name]} ({name}){hint}"
    return None


#: Said of a row whose ``messages`` is a string: SWE-smith trajectories store their messages as JSON text.
_SMITH_HINT = "; messages as JSON text (SWE-smith trajectories) are read by format = \"swe_agent\""


def _nebius_steps(value: Any) -> bool:
    """A nebius/SWE-agent-trajectories ``trajectory``: a list of ``{role, text | system_prompt, ...}`` steps
    (a ``.traj``'s own ``trajectory`` holds ``{action, observation, ...}`` steps without a role)."""
    first = value[0] if isinstance(value, list) and value else None
    return isinstance(first, dict) and "role" in first and ("text" in first or "system_prompt" in first)


def detect_format(row: dict) -> str | None:
    """Name the adapter that fits a parsed row, or ``None`` if none does (or ``row`` is not a dict).

    Checked in order, first match wins: ``history`` list of objects -> swe_agent; ``chat`` string
    -> glaive; ``messages`` list -> openai; ``conversations`` list -> sharegpt; ``data`` list of
    strings -> ultrachat;
    ``instruction`` string -> instruction; ``problem`` string -> oss_instruct; ``input`` string ->
    opencodeinstruct; ``prompt`` string -> text; last, ``trajectory`` list of ``{role, text}`` steps ->
    swe_agent (nebius/SWE-agent-trajectories). A ``messages`` string (SWE-smith trajectories) is not
    detected: JSON-text messages of other datasets are OpenAI messages; set ``format = "swe_agent"``.
    """
    if not isinstance(row, dict):
        return None
    for name, (key, fits) in _SIGNATURES.items():
        if key in row and fits(row[key]):
            return name
    return "swe_agent" if _nebius_steps(row.get("trajectory")) else None
