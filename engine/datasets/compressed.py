"""Compressed dataset files: gzip members and zstd frames decompressed as a stream, and each one's
integrity checked before any of its rows is read.

A gzip file is one or more *members* (``cat a.gz b.gz``, ``bgzip``'s blocks), each
deflate data ending with a CRC-32 and the length of what it decompresses to; a zstd file is one or
more *frames*, each ending with an XXH64 content checksum when it was written with one (zstd's
command line does by default; the ``zstandard`` package only with ``write_checksum=True``). Deflate
has no check of its own before that trailer: flipped bytes inside a member decompress to plausible
garbage until the CRC at its end fails (zstd's decoder catches more, but not all, before the
checksum). So a row is trustworthy only once the member or frame holding it has ended and its
check passed. The rule (``docs/dataset-rows.md``, "Compressed files: what is checked"):

* :func:`check_integrity` decompresses the whole file once, in a streaming pre-pass (bounded
  memory, output discarded), before any row is read;
* a member or frame whose check fails, invalid compressed data, or bytes after a member/frame that
  start neither a new one (nor, for gzip, zero padding): :class:`CorruptData`, a
  :class:`~engine.datasets.sources.DatasetError` naming the file, the member/frame and its byte
  offset: the file is refused, nothing of it is read;
* a file that ends inside a member or frame (truncated): that unit's data were never checked, so
  only the units before it count; the stream opened with the :class:`Integrity` gives their bytes,
  then raises :class:`Unverified` (the reader rejects the rest of the file as one row). A file whose
  *first* unit is cut has nothing checked: :class:`TruncatedData`, refused;
* a zstd frame without a content checksum that ends properly is read as decoded: nothing in it can
  be verified (:attr:`Integrity.unchecked` counts them; the reader notes it).

An empty file has no member and no rows. Skippable zstd frames (``0x184D2A5?`` magic) hold no data.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from engine.datasets.sources import COMPRESSIONS, DatasetError
from engine.errors import DatagenError

_IN = 1 << 16  # compressed bytes read from the file at a time
_OUT = 1 << 18  # decompressed bytes per chunk aimed at (one chunk is held at once)
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_SKIPPABLE_TAIL = b"\x2a\x4d\x18"  # the last three bytes of a skippable frame's magic 0x184D2A5? (little-endian)
_CHECK_TOOL = {"gzip": "gzip -t", "zstd": "zstd -t"}


class CorruptData(DatasetError):
    """A compressed file that is not of its suffix's kind, or whose member/frame check fails (or
    holds invalid compressed data, or is followed by bytes that start no member/frame)."""


class TruncatedData(DatasetError):
    """A compressed file that ends inside a member or frame (before its check). ``detail``: which
    one, e.g. ``"the file ends inside gzip member 2 (which starts at byte 5120), before the CRC-32 at
    its end"``."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class Unverified(DatagenError):
    """Raised by a stream opened with a truncated file's :class:`Integrity` when read past the data of
    its last intact member/frame (the readers turn it into one reject for the rest of the file; not a
    :class:`DatasetError`: the file is not refused). ``reason``: why the rest cannot be read (names the unit)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class UnitEnd:
    """A member or frame ended intact; ``checked``: it carried a checksum (and it matched)."""

    checked: bool


@dataclass(frozen=True, slots=True)
class Integrity:
    """What :func:`check_integrity` found.

    Attributes:
        kind: ``"gzip"`` or ``"zstd"``.
        units: members/frames that ended intact (skippable zstd frames not counted).
        unchecked: of them, zstd frames that carry no content checksum (nothing to verify).
        size: decompressed bytes of those units (bytes).
        truncated: None when the file ends at a unit's end; else why the data from byte ``size`` of
            the decompressed stream on cannot be read (the unit the file ends inside).
    """

    kind: str
    units: int
    unchecked: int
    size: int
    truncated: str | None = None


def chunks(raw: BinaryIO, kind: str, shown: str) -> Iterator[bytes | UnitEnd]:
    """Decompress ``raw`` (``kind`` ``"gzip"`` or ``"zstd"``): yields decompressed chunks (up to about
    256 KiB each) and a :class:`UnitEnd` after each member/frame whose check passed.

    Raises:
        CorruptData: not of ``kind`` at the start, a failed check, invalid data, garbage between units.
        TruncatedData: the file ends inside a member or frame.
        OSError: reading ``raw`` failed.
    """
    return _gzip_chunks(raw, shown) if kind == "gzip" else _zstd_chunks(raw, shown)


def check_integrity(path: Path, kind: str, shown: str) -> Integrity:
    """The streaming pre-pass: decompress all of ``path``, keeping nothing, and check every unit.

    Raises:
        CorruptData: see :func:`chunks` (the file is refused).
        TruncatedData: the file ends inside its first member/frame: nothing in it is checked.
        OSError: the file cannot be read.
    """
    units = unchecked = size = done = 0
    with open(path, "rb") as raw:
        try:
            for item in chunks(raw, kind, shown):
                if isinstance(item, UnitEnd):
                    units, unchecked, done = units + 1, unchecked + (not item.checked), size
                else:
                    size += len(item)
        except TruncatedData as e:
            if units == 0:
                raise TruncatedData(f"{shown}: truncated {kind} data: {e.detail}, so none of it can be verified "
                                    f"and nothing of the file is read; check it with `{_CHECK_TOOL[kind]} {shown}`, "
                                    f"then download or re-create it", e.detail) from None
            return Integrity(kind, units, unchecked, done, e.detail)
    return Integrity(kind, units, unchecked, size)


def open_stream(path: Path, kind: str, shown: str, integrity: Integrity | None = None) -> io.BufferedReader:
    """``path`` decompressed as it is read (buffered: ``readline``/iteration work). With a truncated
    file's ``integrity``, reading past its intact units raises :class:`Unverified`.

    Raises (when read):
        Unverified, CorruptData, TruncatedData (the file changed since it was checked), OSError.
    """
    raw = open(path, "rb")
    limit = None if integrity is None or integrity.truncated is None else (integrity.size, integrity.truncated)
    return io.BufferedReader(_Stream(raw, chunks(raw, kind, shown), limit), buffer_size=1 << 16)


def start_problem(path: Path, shown: str) -> str | None:
    """For config validation: why the first bytes of ``path`` are not of its compression suffix's kind
    (``"FILE: not gzip data (...)"``, as the read would say), else None (also for a file that is not
    compressed, or empty). Reads a few bytes, decompresses nothing.

    Raises:
        OSError: the file cannot be read.
    """
    kind = COMPRESSIONS.get(path.suffix.lower())
    if kind is None:
        return None
    with open(path, "rb") as fh:
        data = fh.read(8)  # as many as the read's own message shows
    magic = _GZIP_MAGIC if kind == "gzip" else _ZSTD_MAGIC
    if not data or data.startswith(magic[:len(data)]) or (kind == "zstd" and _skippable(data)):
        return None
    return str(_not_kind(kind, shown, data, magic))


def _skippable(data: bytes) -> bool:
    """Whether ``data`` starts (or, shorter than 4 bytes, may start) a skippable zstd frame (magic 0x184D2A5?)."""
    return data[0] & 0xF0 == 0x50 and (data[1:4] == _SKIPPABLE_TAIL or _SKIPPABLE_TAIL.startswith(data[1:]))


def unchecked_note(shown: str, integrity: Integrity) -> str | None:
    """The note on a file's zstd frames without a content checksum (None when every unit had one)."""
    if not integrity.unchecked:
        return None
    return (f"{shown}: {integrity.unchecked} of {integrity.units} zstd frame(s) carry no content checksum, so damage "
            f"inside them cannot be detected (read as decoded); zstd's command line writes one by default "
            f"(`zstd --check`), the zstandard package with write_checksum=True")


class _Stream(io.RawIOBase):
    """The decompressed bytes of :func:`chunks`, up to ``limit = (bytes, reason)`` if given."""

    def __init__(self, raw: BinaryIO, items: Iterator[bytes | UnitEnd], limit: tuple[int, str] | None) -> None:
        self._raw, self._items, self._limit = raw, items, limit
        self._buf, self._at, self._pos = b"", 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        room = len(b)
        if self._limit is not None:
            if self._pos >= self._limit[0]:
                raise Unverified(self._limit[1])
            room = min(room, self._limit[0] - self._pos)
        while self._at >= len(self._buf):
            item = next(self._items, None)
            if item is None:
                return 0
            if not isinstance(item, UnitEnd):
                self._buf, self._at = item, 0
        n = min(room, len(self._buf) - self._at)
        b[:n] = memoryview(self._buf)[self._at:self._at + n]
        self._at += n
        self._pos += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def _corrupt(kind: str, shown: str, unit: str, n: int, start: int, what: str) -> CorruptData:
    return CorruptData(f"{shown}: corrupt {kind} data in {unit} {n} (which starts at byte {start} of the file): {what}; "
                       f"the file is refused, nothing of it is read: check it with `{_CHECK_TOOL[kind]} {shown}`, "
                       f"then download or re-create it")


def _garbage(kind: str, shown: str, unit: str, n: int, at: int, data: bytes) -> CorruptData:
    return CorruptData(f"{shown}: corrupt {kind} data: the bytes at byte {at}, after {unit} {n}, start no {kind} "
                       f"{unit} ({data[:8]!r}); the file is refused, nothing of it is read: check it with "
                       f"`{_CHECK_TOOL[kind]} {shown}`, then download or re-create it")


def _bad_start(kind: str, shown: str, n: int, pos: int, data: bytes, cut: bool) -> DatasetError:
    """Why the bytes at ``pos``, after unit ``n`` (0: at the start of the file), begin no member/frame;
    ``cut``: they are the start of one cut short by the end of the file."""
    unit = "member" if kind == "gzip" else "frame"
    if cut:
        return _truncated(shown, f"the file ends inside {kind} {unit} {n + 1} (which starts at byte {pos}), in its header")
    if n == 0:
        return _not_kind(kind, shown, data, _GZIP_MAGIC if kind == "gzip" else _ZSTD_MAGIC)
    return _garbage(kind, shown, unit, n, pos, data)


def _not_kind(kind: str, shown: str, data: bytes, magic: bytes) -> CorruptData:
    return CorruptData(f"{shown}: not {kind} data (it starts with {data[:8]!r}, not {kind}'s magic bytes {magic.hex(' ')}); "
                       f"name a file that is not compressed without the compression suffix")


def _truncated(shown: str, detail: str) -> TruncatedData:
    return TruncatedData(f"{shown}: truncated compressed data: {detail}", detail)


def _fill(raw: BinaryIO, data: bytes, n: int) -> bytes:
    """``data`` plus what the file gives until it holds ``n`` bytes (fewer at the end of the file)."""
    while len(data) < n:
        more = raw.read(_IN)
        if not more:
            break
        data += more
    return data


def _gzip_chunks(raw: BinaryIO, shown: str) -> Iterator[bytes | UnitEnd]:
    pos, member, data = 0, 0, b""  # pos: the file offset of data[0]
    while True:
        data = _fill(raw, data, 2)
        if member:  # gzip allows zero bytes of padding after a member (the gzip module skips them too)
            while data.startswith(b"\x00"):
                kept = data.lstrip(b"\x00")
                pos, data = pos + len(data) - len(kept), _fill(raw, kept, 2)
        if not data:
            return
        if not data.startswith(_GZIP_MAGIC):
            raise _bad_start("gzip", shown, member, pos, data, _GZIP_MAGIC.startswith(data))
        member, start = member + 1, pos
        d = zlib.decompressobj(31)  # one gzip member; zlib checks its CRC-32 and length at the end
        while True:
            try:
                out = d.decompress(data, _OUT)
            except zlib.error as e:
                raise _corrupt("gzip", shown, "member", member, start, _zlib_what(e)) from None
            if out:
                yield out
            if d.eof:
                rest = d.unused_data
                pos, data = pos + len(data) - len(rest), rest
                yield UnitEnd(True)
                break
            tail = d.unconsumed_tail
            pos += len(data) - len(tail)
            if tail or len(out) == _OUT:  # input left, or output the limit held back: go on with what is here
                data = tail
                continue
            data = raw.read(_IN)
            if not data:
                raise _truncated(shown, f"the file ends inside gzip member {member} (which starts at byte {start}), "
                                           f"before the CRC-32 at its end")


def _zlib_what(e: zlib.error) -> str:
    msg = str(e).removeprefix("Error -3 while decompressing data: ")
    if msg == "incorrect data check":
        return "its CRC-32 check failed (the data decompress, but not to what the checksum at the member's end says)"
    if msg == "incorrect length check":
        return "its length check failed (it decompresses to another length than its end says)"
    return f"invalid deflate data ({msg})"


def _zstd_chunks(raw: BinaryIO, shown: str) -> Iterator[bytes | UnitEnd]:
    import zstandard  # imported here: only .zst files need it

    dctx = zstandard.ZstdDecompressor()
    pos, frame, data = 0, 0, b""  # pos: the file offset of data[0]
    feed = 1 << 10  # compressed bytes given to the decoder in the next step
    while True:
        data = _fill(raw, data, 5)
        if not data:
            return
        skippable = len(data) >= 4 and _skippable(data)
        if not (data.startswith(_ZSTD_MAGIC) or skippable):
            raise _bad_start("zstd", shown, frame, pos, data, _ZSTD_MAGIC.startswith(data) or _skippable(data))
        frame, start = frame + 1, pos
        checked = not skippable and len(data) > 4 and bool(data[4] & 0x04)  # Content_Checksum_flag
        obj = dctx.decompressobj()
        while True:
            if not data:
                data = raw.read(_IN)
                if not data:
                    cut = ", before the content checksum at its end" if checked else ""
                    raise _truncated(shown, f"the file ends inside zstd frame {frame} (which starts at byte {start}){cut}")
            piece, data = data[:feed], data[feed:]
            try:
                out = obj.decompress(piece)
            except zstandard.ZstdError as e:
                raise _corrupt("zstd", shown, "frame", frame, start, _zstd_what(e)) from None
            # feed less when the data compress well, more when not: about _OUT bytes out per step
            feed = max(64, min(_IN, int(_OUT / max(len(out) / len(piece), 1.0))))
            if out:
                yield out
            if obj.eof:
                rest = obj.unused_data
                pos, data = pos + len(piece) - len(rest), rest + data
                if not skippable:
                    yield UnitEnd(checked)
                break
            pos += len(piece)


def _zstd_what(e: Exception) -> str:
    msg = str(e).removeprefix("zstd decompressor error: ")
    if "checksum" in msg.lower():
        return "its content checksum check failed (the data decompress, but not to what the checksum at the frame's end says)"
    return f"invalid zstd data ({msg})"
