"""Incremental Server-Sent-Events parser for OpenAI-compatible streams (OpenRouter dialect).

Wire facts (``shared/reference/openrouter.md``):

* lines starting with ``:`` are comments / keep-alives (``: OPENROUTER PROCESSING``) and are skipped, never
  parsed as JSON;
* ``data:`` lines carry one JSON chunk each (with or without a space after the colon); an event may span several
  ``data:`` lines (joined with ``\\n`` per the SSE spec) and ends at a blank line;
* line endings may be LF, CRLF or CR;
* the stream ends with ``data: [DONE]``.

The parser works on raw bytes (``feed``) so the hot path avoids a text-decoding layer: ``json.loads`` accepts
UTF-8 bytes directly. ``feed_line`` accepts already-split lines (``str`` or ``bytes``) for callers that use
``response.aiter_lines()``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DONE", "SSEDecodeError", "SSEParser", "decode_payload"]


class _Done:
    """Sentinel type for the ``data: [DONE]`` terminator."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"


DONE: Any = _Done()
"""Returned in place of a chunk when the stream's ``[DONE]`` marker arrives."""


class SSEDecodeError(ValueError):
    """A ``data:`` event whose payload is neither JSON nor ``[DONE]``.

    Attributes:
        payload: the first 200 bytes of the offending payload (for diagnostics; never contains request data).
    """

    def __init__(self, message: str, payload: bytes) -> None:
        super().__init__(message)
        self.payload = payload[:200]


def decode_payload(payload: bytes | str) -> Any:
    """Decode one event's data: the JSON object, or :data:`DONE` for ``[DONE]``.

    Raises:
        SSEDecodeError: the payload is not valid JSON (and not ``[DONE]``).
    """
    try:
        return json.loads(payload)
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


class _Multi(list):
    """Several payloads recovered from one malformed event (see :func:`decode_payload`)."""

    __slots__ = ()


class SSEParser:
    """Incremental SSE parser.

    Feed it raw bytes as they arrive (:meth:`feed`) or complete lines (:meth:`feed_line`); it returns the decoded
    payloads of the events completed so far: a ``dict`` per JSON chunk, :data:`DONE` for ``[DONE]``. Call
    :meth:`flush` at end of stream to dispatch an event left unterminated by a blank line.

    Example::

        p = SSEParser()
        p.feed(b": OPENROUTER PROCESSING\\n\\ndata: {\\"a\\": 1}\\n\\ndata: [DONE]\\n\\n")  # -> [{"a": 1}, DONE]
    """

    __slots__ = ("_buf", "_data", "_pending_cr", "events", "comments")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._pending_cr = False
        self.events = 0
        """Number of data events dispatched so far."""
        self.comments = 0
        """Number of comment (keep-alive) lines skipped so far."""

    # -- bytes interface -------------------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Any]:
        """Consume raw bytes; return the payloads of the events they complete (possibly none).

        Raises:
            SSEDecodeError: a completed event's data is not JSON.
        """
        if not data:
            return []
        if self._pending_cr:
            # A CR ended the previous read; if this read starts with LF it is the same CRLF line break.
            self._pending_cr = False
            if data[:1] == b"\n":
                data = data[1:]
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
        out: list[Any] = []
        for line in lines:
            self._line(line, out)
        return out

    def flush(self) -> list[Any]:
        """End of stream: process a trailing partial line and dispatch any unterminated event."""
        out: list[Any] = []
        if self._buf:
            line, self._buf = self._buf, b""
            self._line(line, out)
        self._line(b"", out)
        return out

    # -- line interface --------------------------------------------------------------------------------------

    def feed_line(self, line: bytes | str) -> list[Any]:
        """Consume one line (without its line break); return the payloads of the events it completes."""
        if isinstance(line, str):
            line = line.encode()
        out: list[Any] = []
        self._line(line.rstrip(b"\r\n"), out)
        return out

    # -- internals -------------------------------------------------------------------------------------------

    def _line(self, line: bytes, out: list[Any]) -> None:
        if not line:
            data = self._data
            if data:
                payload = data[0] if len(data) == 1 else b"\n".join(data)
                self._data = []
                self.events += 1
                obj = decode_payload(payload)
                if type(obj) is _Multi:
                    out.extend(obj)
                else:
                    out.append(obj)
            return
        first = line[0]
        if first == 0x3A:  # ":" comment / keep-alive
            self.comments += 1
            return
        if first == 0x64 and line[:5] == b"data:":  # fast path for "data:"
            value = line[5:]
        else:
            field, sep, value = line.partition(b":")
            if field != b"data":
                # "event:", "id:", "retry:" and unknown fields carry nothing this client needs.
                return
        if value[:1] == b" ":
            value = value[1:]
        self._data.append(value)
