"""Assembly of streamed tool-call fragments into whole calls.

A streamed tool call arrives as fragments (``delta.tool_calls[*]``): ``{"index", "id"?, "type"?, "function":
{"name"?, "arguments"?}}``. Servers differ in what they repeat and what they key on; the rules, applied to
every fragment and so to every field it carries (id, name, arguments):

1. **Which call** a fragment belongs to:

   * with an ``index``: the call currently at that index; a NEW call (taking over the index) when there is none
     yet, or when the fragment carries an ``id`` different from that call's id (Ollama, dynamo and other
     gateways stream parallel calls all with ``index: 0`` and distinct ids);
   * without an ``index``: the latest call with the fragment's ``id``, else a new call when it has an ``id``;
     a fragment with neither continues the latest call;
   * without an ``id`` (with or without ``index``), a fragment that carries a ``name`` starts a new call when
     the call it would continue already has a name and its arguments are a complete JSON value (servers that
     send each call whole, all at one index, without ids). When such a fragment brings no arguments and
     repeats the previous call's name, the new call stays tentative: it is dropped if no arguments ever
     follow (a server repeating the name on a trailing fragment).

2. **Fields** of the call a fragment belongs to:

   * ``id``: set by the first fragment that has one (an id equal to the call's is a repeat; a different one is
     rule 1's new call, so an id is never concatenated);
   * ``name``: a value equal to the name so far is a repeat (servers that repeat it on every fragment); one
     that extends it (``get_`` -> ``get_weather``) replaces it (cumulative); any other is appended (a name
     split across fragments);
   * ``arguments``: pieces concatenated verbatim (an object instead of a string is kept as JSON text);
   * ``type``: the latest given (default ``function``).

Calls are returned in the order they started. A call whose id never arrived gets ``call_<n>`` (n = position).
Whether each called name is a declared tool is checked after assembly by validation (``unknown_tool``), so a
misassembled call cannot reach a training export unnoticed.
"""

from __future__ import annotations

import json
from typing import Any

from .types import ToolCall

__all__ = ["ToolCallAssembler"]


class _Call:
    __slots__ = ("id", "type", "name", "args", "tentative")

    def __init__(self) -> None:
        self.id = ""
        self.type = "function"
        self.name = ""
        self.args: list[str] = []
        self.tentative = False

    def complete(self) -> bool:
        """Has a name and arguments that parse as one JSON value."""
        if not self.name or not self.args:
            return False
        try:
            json.loads("".join(self.args))
        except ValueError:
            return False
        return True


class ToolCallAssembler:
    """Assembles tool-call fragments (see the module rules) into :class:`ToolCall` s.

    Usage::

        tc = ToolCallAssembler()
        chars = tc.feed(delta["tool_calls"])   # characters of name + arguments received (for estimates)
        calls = tc.calls()                     # tuple[ToolCall, ...] in start order
    """

    __slots__ = ("_calls", "_by_index")

    def __init__(self) -> None:
        self._calls: list[_Call] = []
        self._by_index: dict[int, _Call] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def _new(self, index: int | None) -> _Call:
        c = _Call()
        self._calls.append(c)
        if index is not None:
            self._by_index[index] = c
        return c

    def _locate(self, index: int | None, tid: str, name: str, has_args: bool) -> _Call:
        if index is not None:
            call = self._by_index.get(index)
            if call is None or (tid and call.id and tid != call.id):
                return self._new(index)
        elif tid:
            for c in reversed(self._calls):
                if c.id == tid:
                    return c
            return self._new(None)
        else:
            call = self._calls[-1] if self._calls else None
            if call is None:
                return self._new(None)
        if not tid and name and call.complete():
            new = self._new(index)
            # A bare repeat of the name with no arguments may be a trailing echo: keep it tentatively.
            new.tentative = not has_args and name == call.name
            return new
        return call

    def feed(self, fragments: Any) -> int:
        """Consume one delta's ``tool_calls`` list; return the characters of names and arguments received.

        Malformed entries (not objects) are skipped.
        """
        if not isinstance(fragments, list):
            return 0
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
            call = self._locate(idx, tid, name, bool(args))
            if tid and not call.id:
                call.id = tid
            ttype = tc.get("type")
            if isinstance(ttype, str) and ttype:
                call.type = ttype
            if name and name != call.name:
                if call.name and not name.startswith(call.name):
                    call.name += name
                    got += len(name)
                else:
                    got += len(name) - len(call.name)
                    call.name = name
            if args:
                call.args.append(args)
                call.tentative = False
                got += len(args)
        return got

    def calls(self) -> tuple[ToolCall, ...]:
        """The assembled calls in start order (tentative calls that never got arguments are dropped)."""
        out = [c for c in self._calls if not c.tentative]
        return tuple(
            ToolCall(id=c.id or f"call_{i}", name=c.name, arguments="".join(c.args), type=c.type)
            for i, c in enumerate(out)
        )
