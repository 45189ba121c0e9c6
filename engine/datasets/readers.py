"""Readers: dataset files -> parsed rows, streamed one at a time, each with its ``"path:line"`` source.

A reader knows file formats only (JSON lines, a JSON array, a single JSON document, Parquet); what a
row *means* is :mod:`engine.datasets.adapters`' business. :func:`open_records` checks the file up
front and returns an iterator of ``(source, value)`` pairs, where ``value`` is whatever the row parsed
to (usually a dict), or a :class:`~engine.prompts.Reject` for a row that could not be parsed at all.

Sources: ``"{path}:{n}"`` with ``n`` the 1-based line number (JSONL), element index + 1 (JSON array)
or row index + 1 (Parquet). ``path`` is written as the caller passed it (or as ``shown`` says).
JSON files may be gzip/zstd-compressed (``a.jsonl.gz``, ``a.json.zst``): they are decompressed as they
are read (:mod:`engine.datasets.sources`); a JSON array is decoded element by element from the stream
(:mod:`engine.datasets.jsonarray`).

Parquet rows come without null-valued object keys at any depth (Arrow's struct union adds them;
:mod:`engine.datasets.arrow_nulls`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.datasets.arrow_nulls import drop_nulls
from engine.datasets.jsonarray import iter_array
from engine.datasets.sources import DatasetError, open_binary, split_suffix, stream_broken, stream_errors
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
_PARQUET_BATCH_ROWS = 1024


def open_records(path: str | Path, shown: str | None = None) -> Iterator[Record | Reject]:
    """Check ``path`` and return an iterator over its rows, in file order.

    The file type is chosen by extension, after a compression suffix (``.gz``, ``.zst``: the file is
    decompressed as it is read, :mod:`engine.datasets.sources`): ``.jsonl``/``.ndjson`` -> JSON lines;
    ``.json``/``.traj`` -> a JSON array if the first non-space character is ``[``, else JSON lines (or,
    when its first line is not a JSON value by itself, one pretty-printed JSON object, the ``.traj``
    layout); ``.parquet`` -> Parquet. Any other extension is sniffed the same way (``PAR1`` magic,
    ``[``, ``{``). A UTF-8 byte-order mark at the start is ignored (in JSON lines, at the start of any
    line: ``cat a.jsonl b.jsonl`` of two files that each begin with one).

    Args:
        path: the file.
        shown: how sources name the file (default ``str(path)``).

    Returns:
        an iterator yielding ``(source, value)`` per parsed row, or a ``Reject`` per row that could
        not be parsed: ``"not UTF-8 ..."``, ``"invalid JSON: ..."``, ``"truncated last line: ..."``,
        ``"truncated JSON array at element N: ..."`` (after all complete elements),
        ``"invalid JSON array at element N: ..."``, ``"compressed data corrupt or truncated ..."``
        (after all rows before the break). Blank JSONL lines are skipped.

    Raises:
        DatasetError: now, if the file is missing, not a regular file, unreadable, not of its
            compression suffix's kind or of an unsupported type; later, from the iterator, if a Parquet
            file fails mid-read.
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
    try:
        head = _read_head(p)
    except OSError as e:
        if compression is None or isinstance(e, FileNotFoundError | PermissionError):
            raise DatasetError(f"{shown}: cannot read file ({e.strerror or e}); expected {_EXPECTED}") from e
        raise DatasetError(f"{shown}: not {compression} data ({e}); expected {_EXPECTED}") from e
    except EOFError as e:
        raise DatasetError(f"{shown}: truncated {compression} data, nothing decompresses ({e})") from e
    except stream_errors() as e:
        raise DatasetError(f"{shown}: not {compression} data ({e}); expected {_EXPECTED}") from e
    if ext in _PARQUET_EXT or (ext not in _JSONL_EXT | _JSON_EXT and head.startswith(b"PAR1")):
        if compression is not None:
            raise DatasetError(f"{shown}: a {compression}-compressed Parquet file; Parquet compresses its own "
                               f"pages, so give the .parquet file itself")
        return _iter_parquet(p, shown)
    if ext in _JSONL_EXT:
        return _iter_jsonl(p, shown)
    first = head.removeprefix(_BOM).lstrip(b" \t\r\n")[:1]
    if first == b"[":
        return _iter_json_array(p, shown)
    if first == b"{":
        return _iter_json_objects(p, shown)
    if not first and ext in _JSON_EXT and len(head) < _SNIFF_BYTES:
        return iter(())  # an empty (or all-whitespace) .json file has no rows
    what = "empty" if not first else f"starts with {first!r}"
    raise DatasetError(f"{shown}: not a dataset file ({what}); expected {_EXPECTED}")


def _read_head(p: Path) -> bytes:
    """The first :data:`_SNIFF_BYTES` bytes (decompressed). A compressed stream that breaks after
    giving data (a truncated file) gives what came before: the rows' iterator reports the break."""
    head = b""
    with open_binary(p) as fh:
        while len(head) < _SNIFF_BYTES:
            try:
                chunk = fh.read1(_SNIFF_BYTES - len(head))  # type: ignore[attr-defined]
            except stream_errors():
                if head:
                    break
                raise
            if not chunk:
                break
            head += chunk
    return head


def _iter_jsonl(p: Path, shown: str) -> Iterator[Record | Reject]:
    """Yield JSON lines one by one; each line is decoded on its own so a bad line costs one row."""
    n = 0
    with open_binary(p) as fh:
        try:
            for n, raw in enumerate(fh, 1):
                yield from _jsonl_row(raw, f"{shown}:{n}")
        except stream_errors() as e:  # a corrupt or truncated compressed file: the rows before it stay
            yield Reject(f"{shown}:{n + 1}", stream_broken(shown, e))


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


def _iter_json_objects(p: Path, shown: str) -> Iterator[Record | Reject]:
    """A ``.json`` file starting with ``{``: JSON lines, or one pretty-printed object (``.traj``)."""
    first_line = b""
    try:
        with open_binary(p) as fh:
            for raw in fh:
                if raw.strip(b" \t\r\n\xef\xbb\xbf"):
                    first_line = raw.removeprefix(_BOM)
                    break
    except stream_errors():
        pass  # read as JSON lines below, which reports the break after the rows before it
    try:
        json.loads(first_line)
    except (ValueError, RecursionError):
        whole = _load_single_document(p, shown)
        if whole is not None:
            yield f"{shown}:1", whole
            return
    yield from _iter_jsonl(p, shown)


def _load_single_document(p: Path, shown: str) -> Any:
    """Parse the whole file as one JSON object (one row, so held whole); ``None`` if it is not one."""
    try:
        with open_binary(p) as fh:
            obj = json.loads(fh.read().removeprefix(_BOM).decode("utf-8"))
    except (ValueError, RecursionError) + stream_errors():
        return None
    return obj if isinstance(obj, dict) else None


def _iter_json_array(p: Path, shown: str) -> Iterator[Record | Reject]:
    """Decode a top-level JSON array element by element, streamed (:mod:`engine.datasets.jsonarray`):
    a truncated file still gives all its complete elements, followed by one ``Reject`` for the element
    where it broke; an element holding an undecodable byte becomes a ``"not UTF-8"`` reject."""
    with open_binary(p) as fh:
        n = 0
        try:
            for n, item in enumerate(iter_array(fh, shown), 1):
                yield item
        except stream_errors() as e:  # a corrupt or truncated compressed file: the elements before it stay
            yield Reject(f"{shown}:{n + 1}", stream_broken(shown, e))


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

