"""Tool calls inside dataset rows: native call ids, arguments as JSON text, calls paired with results.

Formats that write tool calls without ids (ShareGPT ``function_call`` turns, glaive's
``<functioncall>``) get ids here, in the target model's native form (:data:`CALL_ID_FORMAT`,
``functions.{name}:{index}``, the default ``[tokenizer] tool_id_format``): ``index`` is the number of
tool calls before this one in the conversation, 0-based, so the ids in a prompt are the ones Kimi-K2.5
itself would have written, and the generated turn's calls (rebuilt by ``engine.tokens.reconstruct``
with the same scheme, counting the prompt's calls) continue the numbering. Rows that carry their own
ids (OpenAI ``messages``, SWE-agent ``history``) keep them.

:class:`CallQueue` pairs results with calls first in, first out: each result answers the oldest call
not yet answered. See ``docs/dataset-rows.md`` for the per-format rules.

Functions here are pure (no I/O).
"""

from __future__ import annotations

import ast
import json
from collections import deque
from typing import Any

#: The native call id; ``{name}`` is the function name, ``{index}`` the calls before it (0-based).
#: Equal to the default of ``[tokenizer] tool_id_format`` (``engine.config.TokenizerSection``).
CALL_ID_FORMAT = "functions.{name}:{index}"
#: Stored texts that mean "no value" in a field :func:`read_literal` reads (compared lower-cased, stripped).
NONE_TEXTS = frozenset({"", "none", "null", "[]"})


def native_call_id(name: str, index: int) -> str:
    """The native id of a call to ``name`` with ``index`` calls before it: ``"functions.get_price:0"``."""
    return CALL_ID_FORMAT.format(name=name, index=index)


def arguments_json(arguments: Any) -> str:
    """Return tool-call arguments as a JSON string: objects are serialised (``json.dumps``, default
    separators, non-ASCII kept), JSON text kept verbatim, text with ``\\'`` escapes unescaped if that
    makes it JSON, anything else kept raw."""
    if not isinstance(arguments, str):
        return json.dumps(arguments, ensure_ascii=False)
    for candidate in (arguments, arguments.replace("\\'", "'")):
        try:
            json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        return candidate
    return arguments


def make_call(name: str, arguments: Any, index: int) -> dict[str, Any]:
    """An OpenAI-shape call ``{"id", "type": "function", "function": {"name", "arguments"}}`` with its
    native id (``index``: calls before it in the conversation) and arguments as JSON text."""
    return {"id": native_call_id(name, index), "type": "function",
            "function": {"name": name, "arguments": arguments_json(arguments)}}


class CallQueue:
    """The calls of a conversation not yet answered, oldest first.

    Adapters :meth:`add` the calls of each assistant turn as they meet them and :meth:`take` one per
    result turn; :meth:`clear` forgets the unanswered ones when the conversation moves on (a user or
    assistant text turn), so a later result never answers a call from before it.

    Attributes:
        made: how many calls were added so far (the next native index).
    """

    def __init__(self) -> None:
        self._pending: deque[tuple[str, int]] = deque()  # (call id, turn number)
        self._turns: list[tuple[int, Any]] = []  # per turn: (calls, tag)
        self.made = 0

    def add(self, calls: list[dict[str, Any]], tag: Any = None) -> None:
        """Queue the calls of one assistant turn; each needs an ``id``. ``tag``: anything the caller
        wants back from :meth:`head_turn` (e.g. how the turn was written)."""
        self._turns.append((len(calls), tag))
        for call in calls:
            self._pending.append((call["id"], len(self._turns) - 1))
        self.made += len(calls)

    def __len__(self) -> int:
        return len(self._pending)

    def head_turn(self) -> tuple[int, int, Any]:
        """For the turn of the oldest unanswered call: ``(unanswered calls, calls, tag)``;
        ``(0, 0, None)`` when every call is answered."""
        if not self._pending:
            return 0, 0, None
        turn = self._pending[0][1]
        size, tag = self._turns[turn]
        return sum(1 for _, t in self._pending if t == turn), size, tag

    def take(self, call_id: str | None = None) -> str | None:
        """Answer a call and return its id: ``call_id`` when given (removed from the queue if there;
        returned even if not), else the oldest unanswered call's id (None when there is none)."""
        if call_id is not None:
            for k, (cid, _) in enumerate(self._pending):
                if cid == call_id:
                    del self._pending[k]
                    break
            return call_id
        return self._pending.popleft()[0] if self._pending else None

    def clear(self) -> int:
        """Forget the unanswered calls; return how many there were."""
        n = len(self._pending)
        self._pending.clear()
        return n


def read_literal(value: Any) -> Any:
    """A field that may hold its value as JSON text or as a Python repr: the parsed value.

    Non-strings are returned as they are; a string is parsed as JSON, else with
    :func:`ast.literal_eval` (literals only). ``""``, ``"None"``, ``"null"`` and ``"[]"`` give None.

    Raises:
        ValueError: the string is neither JSON nor a Python literal (the parser's reason).
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in NONE_TEXTS:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        detail = e.msg if isinstance(e, SyntaxError) and e.msg else str(e) or type(e).__name__
        raise ValueError(f"neither JSON nor a Python literal ({detail}): {text[:60]!r}") from None


def pair_openai_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill the ids an OpenAI-shape conversation leaves out, so each result answers its own call.

    - An assistant call without an ``id`` gets its native id (:func:`native_call_id`, index = calls
      before it in the conversation); a call that is not an object with a ``function.name`` is left
      as it is (the render check at ingest judges it).
    - A ``tool`` message without ``tool_call_id`` answers the oldest unanswered call
      (:class:`CallQueue`); one that names an id keeps it, known or not (the row's own data).
    - A ``user`` turn closes the unanswered calls.

    Returns new message dicts where something was filled (the input is not mutated); the same list
    contents otherwise. Pure. See ``docs/dataset-rows.md``.
    """
    queue = CallQueue()
    out: list[dict[str, Any]] = []
    for m in messages:
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if isinstance(calls, list) and calls:
            filled = []
            for k, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(c, dict) and not c.get("id") and isinstance(fn, dict) and isinstance(fn.get("name"), str):
                    c = {**c, "id": native_call_id(fn["name"], queue.made + k)}
                filled.append(c)
            if filled != calls:
                m = {**m, "tool_calls": filled}
            queue.add([c if isinstance(c, dict) and c.get("id") else {"id": None} for c in filled])
        elif m.get("role") == "tool":
            cid = m.get("tool_call_id")
            got = queue.take(cid if isinstance(cid, str) and cid else None)
            if not cid and got is not None:
                m = {**m, "tool_call_id": got}
        elif m.get("role") == "user":
            queue.clear()
        out.append(m)
    return out
