"""A top-level JSON array, decoded element by element from a byte stream (plain or decompressing).

The stream is read in chunks and decoded as UTF-8 (a leading byte-order mark dropped); only the
element being decoded and one chunk are held in memory, so a multi-gigabyte ``.json.gz`` array is
never decompressed whole. Each element is parsed with :meth:`json.JSONDecoder.raw_decode`; an element
that ends where the text read so far ends is parsed again once more text is in (a number such as
``12`` could go on as ``12.5``), so the result is what ``json.loads`` of the whole text would give.

Rejects (sources ``"{shown}:{n}"``, ``n`` the element's 1-based index) and their wording are those of
``engine.datasets.readers``: ``"truncated JSON array at element N: ..."`` when the file does not end
with ``]``, else ``"invalid JSON array at element N: ...; rest of file skipped"``; an element holding
an undecodable byte is ``"not UTF-8: undecodable byte in array element N"``. Character positions in
reasons count from the start of the text (after the byte-order mark).
"""

from __future__ import annotations

import codecs
import io
import json
import re
from collections.abc import Iterator
from typing import Any

from engine.prompts import Reject

_WS_CHARS = " \t\n\r"
_WS = re.compile(r"[ \t\n\r]*")
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # what surrogateescape turns undecodable bytes into
_CHUNK = 1 << 18


class _Text:
    """The decoded text of a byte stream, held from the parse position on.

    ``buf[k]`` is character ``base + k`` of the whole text; :meth:`more` appends the next chunk
    (as much again as the incomplete element read so far, so a long element costs few passes), :meth:`drop` forgets the text
    before a position once it is far behind.
    """

    def __init__(self, fh: io.BufferedReader) -> None:
        self.fh = fh
        self.dec = codecs.getincrementaldecoder("utf-8-sig")(errors="surrogateescape")
        self.buf = ""
        self.base = 0
        self.eof = False
        self.dropped_last = ""  # the last non-space character of the text dropped so far
        self.error: BaseException | None = None  # raised by the stream after it gave data: raised next time

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes of the stream (fewer only at its end). A stream that raises after giving
        some bytes gives them first, and the exception at the next call (a decompressing stream that
        refuses to go past its checked data must not cost the elements before that point)."""
        if self.error is not None:
            raise self.error
        got: list[bytes] = []
        size = 0
        while size < n:
            try:
                data = self.fh.read1(n - size)  # one read of the raw stream at most
            except Exception as e:
                if not got:
                    raise
                self.error = e
                break
            if not data:
                break
            got.append(data)
            size += len(data)
        return b"".join(got)

    def more(self, at_least: int = _CHUNK) -> bool:
        """Read and decode the next chunk; False (and ``eof``) at the end of the stream."""
        if self.eof:
            return False
        data = self.read(max(_CHUNK, at_least))
        if not data:
            self.buf += self.dec.decode(b"", final=True)
            self.eof = True
            return False
        self.buf += self.dec.decode(data)
        return True

    def skip_ws(self, i: int) -> int:
        """The position of the first non-space character at or after ``i`` (``len(buf)`` at the end)."""
        while True:
            m = _WS.match(self.buf, i)
            assert m is not None  # the pattern matches the empty string
            i = m.end()
            if i < len(self.buf) or not self.more():
                return i

    def drop(self, i: int) -> int:
        """Forget the text before ``i`` when it is over a chunk long; returns ``i`` in the new buffer."""
        if i < _CHUNK:
            return i
        self.dropped_last = self.buf[:i].rstrip(_WS_CHARS)[-1:] or self.dropped_last
        self.buf = self.buf[i:]
        self.base += i
        return 0

    def ends_with_bracket(self) -> bool:
        """Whether the whole text's last non-space character is ``]`` (reads the rest of the stream,
        keeping only its last non-space character)."""
        last = self.buf.rstrip(_WS_CHARS)[-1:] or self.dropped_last
        while not self.eof:
            data = self.read(_CHUNK)
            tail = (self.dec.decode(data) if data else self.dec.decode(b"", final=True)).rstrip(_WS_CHARS)
            self.eof = not data
            last = tail[-1:] or last
        return last == "]"


def iter_array(fh: io.BufferedReader, shown: str) -> Iterator[tuple[str, Any] | Reject]:
    """Yield ``(source, value)`` per element of the JSON array in ``fh`` (which starts, after a
    byte-order mark and spaces, with ``[``), then stop at ``]``; at the first element that cannot
    be decoded, yield one ``Reject`` and stop (the module docstring lists the reasons).

    Raises:
        whatever ``fh.read1`` raises (``OSError``; a decompressing stream's error), once the elements
        decoded from the bytes it gave before are yielded.
    """
    t = _Text(fh)
    decoder = json.JSONDecoder()
    i = t.skip_ws(0) + 1  # just past "["
    i = t.skip_ws(i)
    if t.buf.startswith("]", i):
        return
    n = 0
    while True:
        n += 1
        source = f"{shown}:{n}"
        i = t.drop(i)
        while True:
            try:
                value, end = decoder.raw_decode(t.buf, i)
            except json.JSONDecodeError as e:
                if t.more(len(t.buf) - i):
                    continue  # maybe only cut off by the end of the text read so far
                yield Reject(source, _array_break(not t.ends_with_bracket(), n, f"{e.msg} (char {t.base + e.pos})"))
                return
            except RecursionError:
                yield Reject(source, _array_break(not t.ends_with_bracket(), n, "nested too deeply"))
                return
            if end < len(t.buf) or not t.more(len(t.buf) - i):
                break
        if _ESCAPED_BYTE.search(t.buf, i, end):
            yield Reject(source, f"not UTF-8: undecodable byte in array element {n}")
        else:
            yield source, value
        i = t.skip_ws(end)
        if i < len(t.buf) and t.buf[i] == ",":
            i = t.skip_ws(i + 1)
            continue
        if i < len(t.buf) and t.buf[i] == "]":
            return
        what = "end of file" if i >= len(t.buf) else f"{t.buf[i]!r} at char {t.base + i}"
        detail = f"expected ',' or ']' after element {n}, found {what}"
        yield Reject(f"{shown}:{n + 1}", _array_break(not t.ends_with_bracket(), n + 1, detail))
        return


def _array_break(truncated: bool, n: int, detail: str) -> str:
    if truncated:
        return f"truncated JSON array at element {n}: {detail}"
    return f"invalid JSON array at element {n}: {detail}; rest of file skipped"
