"""Assembly of streamed tool-call fragments into whole calls.

A streamed tool call arrives as fragments (``delta.tool_calls[*]``): ``{"index"?, "id"?, "type"?, "function":
{"name"?, "arguments"?}}``. Servers differ in what they repeat and what they key on. An ``id`` that is
missing, ``""``, an object or a list counts as absent (another value is read as its text); so does a ``name``
that is not a non-empty string (DashScope and Gemini proxies send ``"id": ""`` and ``"name": ""`` on
continuations) and an ``index`` that is not an integer. The rules, applied to every fragment in order:

1. **The current call** ``C`` of a fragment: with an ``index``, the call at that index (none before the first
   fragment there); without an ``index``, the latest call that has the fragment's ``id`` (as its id or as a
   changed id, rule 2) -- the fragment continues that call and rule 2 is skipped -- else the latest call.

2. **Which call** the fragment belongs to (the first case that applies):

   a. with an ``index`` and an ``id`` that ``C`` does not have, when the latest call that has it was started
      by an earlier delta (an earlier :meth:`~ToolCallAssembler.feed`; LocalAI emitting the same call again
      at another index, or an earlier call's id coming back at its index): ``tool_call_ambiguous``; the
      fragment is ignored, and so are later fragments that continue it at that index (a new call may still
      start there by these rules); the calls already assembled are kept as they are. Within one delta,
      entries at different indexes are different calls even with equal ids (a non-streamed message's
      ``tool_calls`` list is fed as one delta);
   b. no ``C``: a new call;
   c. an ``id`` that ``C`` does not have, ``C`` having one:

      * the fragment has a ``name``: a new call (Ollama, dynamo and other gateways stream parallel calls all
        with ``index: 0`` and distinct ids, each whole). With an ``index``, when ``C`` is not complete the
        fragment could also be ``C`` continued under a new id: ``tool_call_ambiguous`` as well;
      * else, ``C`` complete: a new call; while it has neither a name nor arguments it is tentative (dropped
        if neither ever arrives: a server putting a fresh id on a trailing fragment);
      * else (``C`` not complete): ``C`` continues, its first id is kept and the new one is remembered as
        ``C``'s (rule 1). ``tool_id_changed`` when ``C`` has a name (vLLM generating a new id per chunk);
        ``tool_call_ambiguous`` when it has none (it could as well be a new call);
   d. a ``name``, with no ``id`` or ``C`` having none, and ``C`` complete: a new call (servers that send each
      call whole, all at one index, without ids). When the fragment brings no arguments and repeats ``C``'s
      name, the new call is tentative: dropped if no arguments ever follow (a trailing echo of the name);
   e. otherwise ``C``. So argument fragments that arrive before the call's id and name (at one index, or
      without any index) are joined by the fragment that brings them: ``C`` has no id and no name yet.

   *Complete* means: has a name and its arguments so far parse as one JSON value.

3. **Fields** of the call a fragment belongs to:

   * ``id``: set by the first fragment that has one; an id equal to the call's is a repeat; a different one
     is handled by rule 2, so an id is never concatenated;
   * ``name``: a value equal to the name so far is a repeat (servers that repeat it on every fragment); one
     that extends it (``get_`` -> ``get_weather``) replaces it (cumulative); any other is appended (a name
     split across fragments);
   * ``arguments``: pieces concatenated verbatim. A piece that is not whitespace, for a call whose arguments
     are already one complete JSON value, is appended too but raises ``tool_call_ambiguous`` (a repeat or a
     second call cannot be told apart). An object instead of a string is kept as JSON text
     (``json.dumps``) and raises ``tool_args_object`` (the re-serialised text may not be the model's);
   * ``type``: the latest non-empty string given (default ``function``).

Calls are returned in the order they started. A call whose id never arrived gets ``call_<n>`` (n = position).
:attr:`ToolCallAssembler.flags` names what was not plain: ``tool_id_changed`` is a note (the call is exact);
``tool_call_ambiguous`` and ``tool_args_object`` are failures (:mod:`engine.client.conformance`: the record is
kept out of training). Whether each called name is a declared tool and the arguments are valid JSON is
checked after assembly by validation (``unknown_tool``, ``bad_tool_args``), so a misassembled call cannot
reach a training export unnoticed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .types import ToolCall

__all__ = ["ToolCallAssembler"]

ID_CHANGED = "tool_id_changed"
AMBIGUOUS = "tool_call_ambiguous"
ARGS_OBJECT = "tool_args_object"

_JSON_MARK = re.compile(r'[\\"{}\[\]]')


class _Call:
    __slots__ = ("id", "ids", "type", "name", "args", "tentative", "discard", "delta",
                 "_depth", "_in_str", "_esc", "_checked", "_ok")

    def __init__(self) -> None:
        self.id = ""
        self.ids: set[str] = set()  # the first id and any changed ids (rule 2c)
        self.type = "function"
        self.name = ""
        self.args: list[str] = []
        # "" no; "args": dropped unless arguments arrive; "content": dropped unless a name or arguments arrive
        self.tentative = ""
        self.discard = False  # rule 2a: a sink for ignored fragments, never returned
        self.delta = 0  # the number of the feed() that started it
        # incremental bracket scan of the arguments, so that completeness is not re-parsed on every piece
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._checked = 0
        self._ok = False

    def has_id(self, tid: str) -> bool:
        return tid in self.ids

    def set_id(self, tid: str) -> None:
        if not self.id:
            self.id = tid
        self.ids.add(tid)

    def add_args(self, piece: str) -> None:
        self.args.append(piece)
        skip = 0 if self._esc else -1  # position of a character escaped by a backslash
        self._esc = False
        for m in _JSON_MARK.finditer(piece):
            i = m.start()
            if i == skip:
                continue
            ch = piece[i]
            if self._in_str:
                if ch == "\\":
                    if i + 1 == len(piece):
                        self._esc = True  # escapes the next piece's first character
                    else:
                        skip = i + 1
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1

    def args_complete(self) -> bool:
        """The arguments so far parse as one JSON value."""
        n = len(self.args)
        if n != self._checked:
            self._checked = n
            ok = False
            if n and not self._in_str and self._depth <= 0:
                try:
                    json.loads("".join(self.args))
                    ok = True
                except ValueError:
                    pass
            self._ok = ok
        return self._ok

    def complete(self) -> bool:
        """Has a name and arguments that parse as one JSON value."""
        return bool(self.name) and self.args_complete()


class ToolCallAssembler:
    """Assembles tool-call fragments (see the module rules) into :class:`ToolCall` s.

    Usage::

        tc = ToolCallAssembler()
        chars = tc.feed(delta["tool_calls"])   # characters of name + arguments received (for estimates)
        calls = tc.calls()                     # tuple[ToolCall, ...] in start order
        flags = tc.flags                       # ("tool_id_changed", ...) what was not plain, each once
    """

    __slots__ = ("_calls", "_by_index", "_flags", "_delta")

    def __init__(self) -> None:
        self._calls: list[_Call] = []
        self._by_index: dict[int, _Call] = {}
        self._flags: dict[str, None] = {}
        self._delta = 0  # feed() calls so far

    def __bool__(self) -> bool:
        return bool(self._calls)

    @property
    def flags(self) -> tuple[str, ...]:
        """The flags raised so far, each once, in the order first raised.

        ``tool_id_changed`` (a note: a call's id changed after its first fragment; the first id is kept),
        ``tool_call_ambiguous`` (a failure: fragments whose assembly could not be decided with certainty,
        module rules 2a, 2c and 3) and ``tool_args_object`` (a failure: arguments came as a JSON object and
        were re-serialised). Names as in :mod:`engine.client.conformance`.
        """
        return tuple(self._flags)

    def _flag(self, name: str) -> None:
        self._flags.setdefault(name, None)

    def _new(self, index: int | None, tentative: str = "") -> _Call:
        c = _Call()
        c.tentative = tentative
        c.delta = self._delta
        self._calls.append(c)
        if index is not None:
            self._by_index[index] = c
        return c

    def _owner(self, tid: str) -> _Call | None:
        """The latest call that has ``tid`` (as its id or a changed id)."""
        for c in reversed(self._calls):
            if c.has_id(tid):
                return c
        return None

    def _locate(self, index: int | None, tid: str, name: str, has_args: bool) -> _Call:
        """Module rules 1 and 2: the call this fragment belongs to (created if new)."""
        if index is not None:
            call = self._by_index.get(index)
            owner = self._owner(tid) if tid and (call is None or not call.has_id(tid)) else None
            if owner is not None and owner.delta < self._delta:  # 2a
                self._flag(AMBIGUOUS)
                sink = _Call()
                sink.discard = True
                sink.set_id(tid)
                self._by_index[index] = sink
                return sink
        elif tid:
            call = self._owner(tid)
            if call is not None:
                return call
            call = self._calls[-1] if self._calls else None
        else:
            call = self._calls[-1] if self._calls else None
        if call is None:  # 2b
            return self._new(index)
        if tid and call.id and not call.has_id(tid):  # 2c
            if name:
                if index is not None and not call.complete():
                    self._flag(AMBIGUOUS)
                return self._new(index)
            if call.complete():
                return self._new(index, "" if has_args else "content")
            call.set_id(tid)
            self._flag(ID_CHANGED if call.name else AMBIGUOUS)
            return call
        if (not tid or not call.id) and name and call.complete():  # 2d
            return self._new(index, "args" if not has_args and name == call.name else "")
        return call  # 2e

    def feed(self, fragments: Any) -> int:
        """Consume one delta's ``tool_calls`` list; return the characters of names and arguments received.

        Malformed entries (not objects) are skipped; so are the characters of ignored fragments (rule 2a).
        """
        if not isinstance(fragments, list):
            return 0
        self._delta += 1
        got = 0
        for tc in fragments:
            if not isinstance(tc, dict):
                continue
            idx = tc.get("index")
            if type(idx) is not int:
                idx = None
            tid = tc.get("id")
            tid = str(tid) if tid not in (None, "") and not isinstance(tid, (dict, list)) else ""
            fn = tc.get("function")
            fn = fn if isinstance(fn, dict) else {}
            name = fn.get("name")
            name = name if isinstance(name, str) else ""
            args = fn.get("arguments")
            if args is not None and not isinstance(args, str):  # an object instead of a string: keep it as JSON
                args = json.dumps(args, ensure_ascii=False)
                self._flag(ARGS_OBJECT)
            call = self._locate(idx, tid, name, bool(args))
            if tid and not call.id:
                call.set_id(tid)
            ttype = tc.get("type")
            if isinstance(ttype, str) and ttype:
                call.type = ttype
            n = 0
            if name and name != call.name:
                if call.name and not name.startswith(call.name):
                    call.name += name
                    n += len(name)
                else:
                    n += len(name) - len(call.name)
                    call.name = name
                if call.tentative == "content":
                    call.tentative = ""
            if args:
                if call.args and args.strip() and call.args_complete():
                    self._flag(AMBIGUOUS)
                call.add_args(args)
                call.tentative = ""
                n += len(args)
            if not call.discard:
                got += n
        return got

    def calls(self) -> tuple[ToolCall, ...]:
        """The assembled calls in start order (tentative calls that never got what they waited for are dropped)."""
        out = [c for c in self._calls if not c.tentative]
        return tuple(
            ToolCall(id=c.id or f"call_{i}", name=c.name, arguments="".join(c.args), type=c.type)
            for i, c in enumerate(out)
        )
