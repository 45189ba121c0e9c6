"""Incremental Server-Sent-Events parser for OpenAI-compatible streams (OpenRouter dialect).

The parser follows the HTML standard's "event stream interpretation" algorithm
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation) rule by rule:

=====  ==========================================================================================================
rule   what the parser does
=====  ==========================================================================================================
BOM    one U+FEFF BOM (``EF BB BF``) at the very start of the stream is skipped (also when split across reads);
       a BOM anywhere else is data
EOL    lines end with CRLF, LF or CR; a CR that ends one read and an LF that starts the next are ONE line break
blank  an empty line dispatches the event being built
``:``  a line starting with ``:`` is a comment (keep-alive such as ``: OPENROUTER PROCESSING``): ignored
colon  ``field:value`` splits at the FIRST colon; a single leading space of the value is removed (only one)
name   a line without a colon is a field name with an empty value (``data`` alone appends an empty line)
data   ``data`` appends the value and ``\\n`` to the data buffer; the dispatched data has the final ``\\n`` removed,
       so several ``data`` lines are joined with ``\\n``
event  ``event`` sets the event type (default ``message``; reset after each dispatch)
id     ``id`` sets the last event id unless the value contains U+0000; it persists across events
retry  ``retry`` with ASCII digits only sets the reconnection time (ms); any other value is ignored
other  any other field name (names are case-sensitive: ``Data`` is not ``data``) is ignored
empty  an event whose data buffer is empty (no ``data`` line) is not dispatched (its type is reset)
EOF    at end of stream a pending, unterminated event is discarded, never dispatched (:meth:`SSEParser.flush`)
=====  ==========================================================================================================

The parser works on raw bytes (``feed``): every rule above is about ASCII bytes, which never occur inside a
multi-byte UTF-8 sequence, so no text-decoding layer is needed on the hot path (``json.loads`` accepts UTF-8
bytes). Decoding an event's data is the application's step (:func:`decode_payload`): a JSON chunk, or
:data:`DONE` for ``[DONE]``; invalid UTF-8 is replaced with U+FFFD as the standard's UTF-8 decode does.
Events whose data is empty or only whitespace carry no chunk and are skipped (counted in
:attr:`SSEParser.empty_events`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from engine.errors import DatagenError

__all__ = ["DONE", "Event", "SSEDecodeError", "SSEParser", "decode_payload"]


class _Done:
    """Sentinel type for the ``data: [DONE]`` terminator."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"


DONE: Any = _Done()
"""Returned in place of a chunk when the stream's ``[DONE]`` marker arrives."""

_BOM = b"\xef\xbb\xbf"


class Event(NamedTuple):
    """One dispatched event.

    Attributes:
        type: the ``event`` field's value, ``"message"`` when none was given.
        data: the data buffer (raw UTF-8 bytes, ``data`` lines joined with ``\\n``).
        last_event_id: the last event id at dispatch time (``""`` when none was set).
    """

    type: str
    data: bytes
    last_event_id: str


class SSEDecodeError(DatagenError, ValueError):
    """A ``data:`` event whose payload is neither JSON nor ``[DONE]``.

    Attributes:
        payload: the first 200 bytes of the offending payload (for diagnostics; never contains request data).
    """

    def __init__(self, message: str, payload: bytes) -> None:
        super().__init__(message)
        self.payload = payload[:200]


def decode_payload(payload: bytes | str) -> Any:
    """Decode one event's data: the JSON object, or :data:`DONE` for ``[DONE]``.

    Invalid UTF-8 is decoded with U+FFFD replacement characters (the standard's UTF-8 decode).
    The hot path is ``orjson.loads`` (several times faster than ``json.loads``; the same values for
    valid JSON in UTF-8); whatever it refuses (invalid UTF-8, ``NaN``, integers past 64 bits, lone
    surrogates, ``[DONE]``, two chunks in one event) takes the standard library's path below, so
    what is accepted and how is unchanged.

    Raises:
        SSEDecodeError: the payload is not valid JSON (and not ``[DONE]``).
    """
    try:
        return _fast_loads(payload)
    except ValueError:  # orjson.JSONDecodeError is a ValueError
        pass
    try:
        return json.loads(payload)
    except UnicodeDecodeError:
        assert isinstance(payload, bytes)  # only bytes can fail to decode
        return decode_payload(payload.decode("utf-8", "replace"))
    except ValueError:
        raw = payload.encode() if isinstance(payload, str) else payload
        stripped = raw.strip()
        if stripped == b"[DONE]":
            return DONE
        # Some servers omit the blank line between events, so two JSON chunks end up joined by "\n" in one
        # event. Only as a fallback (the normal path is a single json.loads), try each line on its own.
        if b"\n" in stripped:
            parts = [p for p in stripped.split(b"\n") if p.strip()]
            try:
                return _Multi(decode_payload(p) for p in parts)
            except SSEDecodeError:
                pass
        raise SSEDecodeError(f"undecodable SSE data event ({len(raw)} bytes)", raw) from None


_fast_loads: Callable[[bytes | str], Any]
try:
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency; the standard library still decodes
    _fast_loads = json.loads


class _Multi(list):
    """Several payloads recovered from one malformed event (see :func:`decode_payload`)."""

    __slots__ = ()


class SSEParser:
    """Incremental SSE parser (the HTML standard's algorithm, see the module table).

    Feed it raw bytes as they arrive: :meth:`feed` returns the decoded payloads of the events completed so far
    (a ``dict`` per JSON chunk, :data:`DONE` for ``[DONE]``); :meth:`feed_events` returns the :class:`Event` s
    themselves. Call :meth:`flush` at end of stream: it discards an unterminated event (and says whether there
    was one in :attr:`discarded`).

    Example::

        p = SSEParser()
        p.feed(b": OPENROUTER PROCESSING\\n\\ndata: {\\"a\\": 1}\\n\\ndata: [DONE]\\n\\n")  # -> [{"a": 1}, DONE]
    """

    __slots__ = ("_buf", "_data", "_type", "_id", "_id_text", "_pending_cr", "_start", "events", "comments", "empty_events",
                 "last_event_id", "retry_ms", "discarded")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._type = b""
        self._id = b""
        self._id_text = ""  # self._id decoded (what a dispatch sets last_event_id to)
        self._pending_cr = False
        self._start: bytes | None = b""  # bytes held at stream start until the BOM question is decided (None once decided)
        self.events = 0
        """Number of events dispatched so far (including empty-data ones)."""
        self.comments = 0
        """Number of comment (keep-alive) lines skipped so far."""
        self.empty_events = 0
        """Dispatched events whose data was empty or whitespace (skipped by :meth:`feed`)."""
        self.last_event_id = ""
        """The last event id (``id`` field) as of the last dispatch."""
        self.retry_ms: int | None = None
        """Reconnection time from the last valid ``retry`` field (ms), or None."""
        self.discarded = False
        """True when :meth:`flush` found an unterminated event (or a partial line) and discarded it."""

    # -- bytes interface -------------------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Any]:
        """Consume raw bytes; return the decoded payloads of the events they complete (possibly none).

        Raises:
            SSEDecodeError: a completed event's data is not JSON.
        """
        lines = self._lines(data)
        if not lines:
            return []
        # The hot path (one call per network read; ~1 event per token or per few tokens): the rules of
        # :meth:`_line` and :meth:`_dispatch` fused into one loop for ``data:`` and blank lines, the payload
        # decoded as it is dispatched; every other line takes :meth:`_line`.
        out: list[Any] = []
        buf = self._data
        for line in lines:
            if line:
                if line[:5] == b"data:":
                    buf.append(line[6:] if line[5:6] == b" " else line[5:])
                else:
                    self._line(line, [])  # a blank line never reaches it: it dispatches nothing
                continue
            self.last_event_id = self._id_text
            self._type = b""
            if not buf:
                continue
            payload = buf[0] if len(buf) == 1 else b"\n".join(buf)
            buf = self._data = []
            self.events += 1
            if not payload or payload.isspace():
                self.empty_events += 1
                continue
            try:
                out.append(_fast_loads(payload))
            except ValueError:  # not plain JSON: [DONE], or the standard library's cases
                obj = decode_payload(payload)
                if type(obj) is _Multi:
                    out.extend(obj)
                else:
                    out.append(obj)
        return out

    def feed_events(self, data: bytes) -> list[Event]:
        """Consume raw bytes; return the :class:`Event` s they complete (possibly none), data undecoded."""
        return [Event(t.decode("utf-8", "replace") or "message", d, i) for t, d, i in self._feed(data)]

    def flush(self) -> list[Any]:
        """End of stream: discard a trailing partial line and any unterminated event (never dispatched).

        Returns an empty list (kept for callers that extend their output with it); :attr:`discarded` tells
        whether anything was pending.
        """
        self.discarded = bool(self._buf or self._data or self._type or self._start)
        self._buf = b""
        self._data = []
        self._type = b""
        self._start = None
        self._pending_cr = False
        return []

    def feed_line(self, line: bytes | str) -> list[Any]:
        """Consume one line (without its line break, e.g. from ``response.aiter_lines()``); return the decoded
        payloads of the events it completes."""
        if isinstance(line, str):
            line = line.encode()
        evs: list[tuple[bytes, bytes, str]] = []
        self._line(line.rstrip(b"\r\n"), evs)
        out: list[Any] = []
        for ev in evs:
            self._decode_into(ev[1], out)
        return out

    # -- internals -------------------------------------------------------------------------------------------

    def _decode_into(self, payload: bytes, out: list[Any]) -> None:
        if not payload or payload.isspace():
            self.empty_events += 1
            return
        obj = decode_payload(payload)
        if type(obj) is _Multi:
            out.extend(obj)
        else:
            out.append(obj)

    def _feed(self, data: bytes) -> list[tuple[bytes, bytes, str]]:
        out: list[tuple[bytes, bytes, str]] = []
        for line in self._lines(data):
            self._line(line, out)
        return out

    def _lines(self, data: bytes) -> list[bytes]:
        """The complete lines ``data`` ends (line breaks removed, BOM and CR rules applied); the partial
        last line stays buffered."""
        if not data:
            return []
        if self._start is not None:
            # Stream start: skip one BOM, possibly split across reads.
            data = self._start + data
            if len(data) < 3 and _BOM.startswith(data):
                self._start = data
                return []
            self._start = None
            if data.startswith(_BOM):
                data = data[3:]
                if not data:
                    return []
        if self._pending_cr:
            # A CR ended the previous read; if this read starts with LF it is the same CRLF line break.
            self._pending_cr = False
            if data[:1] == b"\n":
                data = data[1:]
                if not data:
                    return []
        if b"\r" in data:
            if data[-1:] == b"\r":
                self._pending_cr = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + data if self._buf else data
        if b"\n" not in buf:
            self._buf = buf
            return []
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        return lines

    def _line(self, line: bytes, out: list[tuple[bytes, bytes, str]]) -> None:
        if not line:
            self._dispatch(out)
            return
        first = line[0]
        if first == 0x3A:  # ":" comment / keep-alive
            self.comments += 1
            return
        if first == 0x64 and line[:5] == b"data:":  # fast path for "data:"
            value = line[5:]
            if value[:1] == b" ":
                value = value[1:]
            self._data.append(value)
            return
        field, sep, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value)
        elif field == b"event":
            self._type = value
        elif field == b"id":
            if b"\x00" not in value:
                self._id = value
                self._id_text = value.decode("utf-8", "replace")
        elif field == b"retry":
            if value.isdigit():  # bytes.isdigit: ASCII digits only, False when empty
                self.retry_ms = int(value)
        # any other field is ignored

    def _dispatch(self, out: list[tuple[bytes, bytes, str]]) -> None:
        self.last_event_id = self._id_text
        data = self._data
        etype = self._type
        self._type = b""
        if not data:
            return
        self._data = []
        self.events += 1
        out.append((etype, data[0] if len(data) == 1 else b"\n".join(data), self.last_event_id))
