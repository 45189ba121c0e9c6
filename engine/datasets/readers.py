"""Readers: dataset files -> parsed rows, streamed one at a time, each with its ``"path:line"`` source.

A reader knows file formats only (JSON lines, a JSON array, a single JSON document, Parquet); what a
row *means* is :mod:`engine.datasets.adapters`' business. :func:`open_records` checks the file up
front and returns an iterator of ``(source, value)`` pairs, where ``value`` is whatever the row parsed
to (usually a dict), or a :class:`~engine.prompts.Reject` for a row that could not be parsed at all.

Sources: ``"{path}:{n}"`` with ``n`` the 1-based line number (JSONL), element index + 1 (JSON array)
or row index + 1 (Parquet). ``path`` is written as the caller passed it (or as ``shown`` says).
JSON files may be gzip/zstd-compressed (``a.jsonl.gz``, ``a.json.zst``): they are decompressed as they
are read, every gzip member and zstd frame checked first (:mod:`engine.datasets.compressed`); a JSON array is
decoded element by element from the stream (:mod:`engine.datasets.jsonarray`).

Parquet rows come without null-valued object keys at any depth (Arrow's struct union adds them;
:mod:`engine.datasets.arrow_nulls`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.datasets.arrow_nulls import drop_nulls
from engine.datasets.compressed import Integrity, Unverified, check_integrity, open_stream, unchecked_note
from engine.datasets.jsonarray import iter_array
from engine.datasets.sources import DatasetError, compressed_parquet_reason, split_suffix
from engine.prompts import Reject

__all__ = ["DatasetError", "Record", "open_records"]

#: A parsed row: its ``"path:line"`` source and the parsed JSON value (or Parquet row dict).
Record = tuple[str, Any]

_BOM = b"\xef\xbb\xbf"
_JSONL_EXT = frozenset({".jsonl", ".ndjson"})
_JSON_EXT = frozenset({".json", ".traj"})
_PARQUET_EXT = frozenset({".parquet"})
_EXPECTED = "a .jsonl/.ndjson (JSON lines), .json (JSON array or JSON lines) or .parquet file"
_SNIFF_BYTES = 1 << 16
_ARRAY_BREAKS = ("truncated JSON array", "invalid JSON array")  # the rejects that end an array file
_PARQUET_BATCH_ROWS = 1024


def open_records(path: str | Path, shown: str | None = None, notes: list[str] | None = None) -> Iterator[Record | Reject]:
    """Check ``path`` and return an iterator over its rows, in file order.

    The file type is chosen by extension, after a compression suffix (``.gz``, ``.zst``: the file is
    decompressed as it is read, :mod:`engine.datasets.compressed`): ``.jsonl``/``.ndjson`` -> JSON lines;
    ``.json``/``.traj`` -> a JSON array if the first non-space character is ``[``, else JSON lines (or,
    when its first line is not a JSON value by itself, one pretty-printed JSON object, the ``.traj``
    layout); ``.parquet`` -> Parquet. Any other extension is sniffed the same way (``PAR1`` magic,
    ``[``, ``{``). A UTF-8 byte-order mark at the start is ignored (in JSON lines, at the start of any
    line: ``cat a.jsonl b.jsonl`` of two files that each begin with one).

    A compressed file is first decompressed once whole, keeping nothing, to check every gzip member's
    CRC-32 and every zstd frame's content checksum (:func:`engine.datasets.compressed.check_integrity`):
    a failed check refuses the file now, before any row is read; the rows of a truncated file's last,
    unchecked member or frame are rejected as one row.

    Args:
        path: the file.
        shown: how sources name the file (default ``str(path)``).
        notes: where file-level problems are appended as ``"{shown}...: reason"`` lines, for a caller
            to show first: the reject that skips the rest of a file (a truncated compressed file, a
            broken JSON array) and zstd frames without a checksum.

    Returns:
        an iterator yielding ``(source, value)`` per parsed row, or a ``Reject`` per row that could
        not be parsed: ``"not UTF-8 ..."``, ``"invalid JSON: ..."``, ``"truncated last line: ..."``,
        ``"truncated JSON array at element N: ..."`` (after all complete elements),
        ``"invalid JSON array at element N: ..."``, ``"compressed data truncated (...)..."``
        (after all rows of the intact members/frames before the cut). Blank JSONL lines are skipped.

    Raises:
        DatasetError: now, if the file is missing, not a regular file, unreadable, not of its
            compression suffix's kind, corrupt (a failed check: nothing of it is read), truncated inside
            its first member/frame, or of an unsupported type; later, from the iterator, if a Parquet
            file fails mid-read, or a compressed file changed since it was checked.
    """
    p = Path(path)
    shown = str(path) if shown is None else shown
    try:
        exists, regular = p.exists(), p.is_file()
    except OSError as e:  # e.g. EACCES on a parent directory: exists() raises instead of saying False
        raise DatasetError(f"{shown}: cannot access ({e.strerror or e}); expected {_EXPECTED}") from e
    if not exists:
        raise DatasetError(f"{shown}: no such file; expected {_EXPECTED}")
    if not regular:
        raise DatasetError(f"{shown}: not a regular file; expected {_EXPECTED}")
    ext, compression = split_suffix(p)
    if ext in _PARQUET_EXT and compression is not None:
        raise DatasetError(compressed_parquet_reason(shown, compression))
    try:
        integrity = check_integrity(p, compression, shown) if compression is not None else None
        src = _Source(p, shown, compression, integrity, notes)
        head = _read_head(src)
    except OSError as e:
        raise DatasetError(f"{shown}: cannot read file ({e.strerror or e}); expected {_EXPECTED}") from e
    if integrity is not None and (note := unchecked_note(shown, integrity)) is not None:
        src.note(note)
    if ext in _PARQUET_EXT or (ext not in _JSONL_EXT | _JSON_EXT and head.startswith(b"PAR1")):
        if compression is not None:
            raise DatasetError(compressed_parquet_reason(shown, compression))
        return _iter_parquet(p, shown)
    if ext in _JSONL_EXT:
        return _iter_jsonl(src)
    first = head.removeprefix(_BOM).lstrip(b" \t\r\n")[:1]
    if first == b"[":
        return _iter_json_array(src)
    if first == b"{":
        return _iter_json_objects(src)
    if not first and ext in _JSON_EXT and len(head) < _SNIFF_BYTES:
        return iter(())  # an empty (or all-whitespace) .json file has no rows
    what = "empty" if not first else f"starts with {first!r}"
    raise DatasetError(f"{shown}: not a dataset file ({what}); expected {_EXPECTED}")


@dataclass(frozen=True, slots=True)
class _Source:
    """One file being read: how to open it (decompressed, up to its intact units) and where its
    file-level notes go."""

    path: Path
    shown: str
    compression: str | None
    integrity: Integrity | None
    notes: list[str] | None

    def open(self) -> io.BufferedReader:
        if self.compression is None:
            return open(self.path, "rb")
        return open_stream(self.path, self.compression, self.shown, self.integrity)

    def note(self, text: str) -> None:
        if self.notes is not None:
            self.notes.append(text)

    def rest_skipped(self, n: int, e: Unverified) -> Reject:
        """The reject of row ``n`` onward of a truncated compressed file (also noted)."""
        r = Reject(f"{self.shown}:{n}", f"compressed data truncated ({e.reason}; its rows cannot be verified); "
                                        f"rest of file skipped")
        self.note(str(r))
        return r


def _read_head(src: _Source) -> bytes:
    """The first :data:`_SNIFF_BYTES` bytes (decompressed; of a truncated compressed file, its
    intact members/frames only: the rows' iterator reports the rest)."""
    head = b""
    with src.open() as fh:
        while len(head) < _SNIFF_BYTES:
            try:
                chunk = fh.read1(_SNIFF_BYTES - len(head))
            except Unverified:
                break
            if not chunk:
                break
            head += chunk
    return head


def _iter_jsonl(src: _Source) -> Iterator[Record | Reject]:
    """Yield JSON lines one by one; each line is decoded on its own so a bad line costs one row."""
    n = 0
    with src.open() as fh:
        try:
            for n, raw in enumerate(fh, 1):
                yield from _jsonl_row(raw, f"{src.shown}:{n}")
        except Unverified as e:  # a truncated compressed file: the rows of its intact units stay
            yield src.rest_skipped(n + 1, e)


def _jsonl_row(raw: bytes, source: str) -> Iterator[Record | Reject]:
    """The row (or reject) of one JSON line; nothing for a blank line."""
    raw = raw.removeprefix(_BOM)  # at line 1, or mid-file where BOM-prefixed files were concatenated
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        yield Reject(source, f"not UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}")
        return
    if not text.strip():
        return
    try:
        yield source, json.loads(text.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        what = "invalid JSON" if raw.endswith(b"\n") else "truncated last line"
        # The row is one line: the column is the character offset + 1 within it.
        yield Reject(source, f"{what}: {e.msg} (column {e.pos + 1})")
    except RecursionError:
        yield Reject(source, "invalid JSON: nested too deeply")


def _iter_json_objects(src: _Source) -> Iterator[Record | Reject]:
    """A ``.json`` file starting with ``{``: JSON lines, or one pretty-printed object (``.traj``)."""
    first_line = b""
    try:
        with src.open() as fh:
            for raw in fh:
                if raw.strip(b" \t\r\n\xef\xbb\xbf"):
                    first_line = raw.removeprefix(_BOM)
                    break
    except Unverified:
        pass  # read as JSON lines below, which reports the cut after the rows before it
    try:
        json.loads(first_line)
    except (ValueError, RecursionError):
        whole = _load_single_document(src)
        if whole is not None:
            yield f"{src.shown}:1", whole
            return
    yield from _iter_jsonl(src)


def _load_single_document(src: _Source) -> Any:
    """Parse the whole file as one JSON object (one row, so held whole); ``None`` if it is not one."""
    try:
        with src.open() as fh:
            obj = json.loads(fh.read().removeprefix(_BOM).decode("utf-8"))
    except (ValueError, RecursionError, Unverified):
        return None
    return obj if isinstance(obj, dict) else None


def _iter_json_array(src: _Source) -> Iterator[Record | Reject]:
    """Decode a top-level JSON array element by element, streamed (:mod:`engine.datasets.jsonarray`):
    a truncated file still gives all its complete elements, followed by one ``Reject`` for the element
    where it broke (also noted); an element holding an undecodable byte becomes a ``"not UTF-8"`` reject."""
    with src.open() as fh:
        n = 0  # elements read, for the reject of a truncated file below
        try:
            for item in iter_array(fh, src.shown):
                n += 1
                if isinstance(item, Reject) and item.reason.startswith(_ARRAY_BREAKS):
                    src.note(str(item))
                yield item
        except Unverified as e:  # a truncated compressed file: the elements of its intact units stay
            yield src.rest_skipped(n + 1, e)


def _iter_parquet(p: Path, shown: str) -> Iterator[Record | Reject]:
    """Yield Parquet rows as dicts, reading ``_PARQUET_BATCH_ROWS`` rows at a time."""
    import pyarrow as pa  # imported here: pyarrow is slow to import and only Parquet needs it
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(p)
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{shown}: not a readable Parquet file ({e}); expected {_EXPECTED}") from e
    return _parquet_rows(pf, shown, pa.ArrowException)


def _parquet_rows(pf: Any, shown: str, arrow_error: type[Exception]) -> Iterator[Record]:
    """Yield each row as its JSON object: without the null fields of Arrow's struct union
    (:func:`engine.datasets.arrow_nulls.drop_nulls`; a field that was ``null`` in the source cannot be
    told from an absent one, and drops too)."""
    n = 0
    try:
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                n += 1
                yield f"{shown}:{n}", drop_nulls(row)
    except (arrow_error, OSError) as e:
        raise DatasetError(f"{shown}: Parquet read failed after row {n} ({e})") from e

