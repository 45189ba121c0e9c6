"""Public prompt datasets -> prompts: read a file row by row and turn each row into a ``Prompt``.

Public API::

    FORMATS                                   # accepted format names, "auto" first
    iter_prompts(path, format="auto", fields=None, notes=None) -> Iterator[Prompt | Reject]   # a file, directory, glob or shards
    detect_format(row) -> str | None
    DatasetError                              # whole-file problems

File formats live in :mod:`engine.datasets.readers` (compression and shard sets in :mod:`engine.datasets.sources`,
Hugging Face Hub datasets in :mod:`engine.datasets.hub`), row formats in :mod:`engine.datasets.adapters` (glaive's
text format in :mod:`engine.datasets.glaive`), the prompt rule in :mod:`engine.datasets.rule`; this module
ties them together (:func:`row_to_prompt`: rename fields, pick the adapter, normalise the role order (one rule for every
format, :mod:`engine.datasets.roles`), apply the one prompt rule and move earlier turns' reasoning out of their
content (:mod:`engine.datasets.reasoning`; both in ``docs/prompt-construction.md``), build the Prompt).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.datasets.adapters import (
    ADAPTERS,
    EXPECTED_KEYS,
    FIELD_KEYS,
    AdapterError,
    MissingField,
    detect_format,
    wrong_signature_type,
)
from engine.datasets.kinds import kind_of
from engine.datasets.readers import DatasetError, Record, open_records
from engine.datasets.rule import cut_prompt, normalise_conversation
from engine.datasets.sources import Shard, local_shards
from engine.prompts import Prompt, Reject

__all__ = ["FORMATS", "DatasetError", "Shard", "detect_format", "iter_prompts", "open_shards", "row_to_prompt"]

#: Every format name ``iter_prompts`` accepts: ``"auto"`` (detect per row), then one per adapter.
FORMATS: tuple[str, ...] = ("auto", *sorted(ADAPTERS))


def iter_prompts(
    path: str | Path | Sequence[Shard], format: str = "auto", fields: dict[str, str] | None = None,
    notes: list[str] | None = None,
) -> Iterator[Prompt | Reject]:
    """Stream the prompts of one dataset, one item per row, in file order (shard after shard).

    Args:
        path: a ``.jsonl``/``.ndjson``, ``.json`` (array, JSON lines, or one ``.traj`` object) or
            ``.parquet`` file, the JSON ones optionally ``.gz``/``.zst``-compressed; or a directory or
            glob of such files (read in sorted order, :func:`engine.datasets.sources.local_shards`); or
            the shards themselves (a Hub dataset's files, :mod:`engine.datasets.hub`). Everything is
            streamed; a JSON array is decoded element by element (a truncated array still yields its
            complete elements, then one ``Reject``). Sources name the shard file: ``"file:N"``.
        format: one of :data:`FORMATS`; ``"auto"`` picks the adapter per row with
            :func:`detect_format`, so mixed files work.
        fields: optional renames, canonical name -> source column, canonical names from
            ``{"messages", "conversations", "system", "prompt", "instruction", "input", "tools"}``;
            e.g. ``{"prompt": "question"}`` reads the ``text`` prompt from column ``question``.
        notes: a list file-level problems are appended to as they are met, for the caller to show
            first (:func:`engine.datasets.readers.open_records`: a truncated compressed file, a broken
            JSON array, zstd frames without a checksum).

    Returns:
        an iterator yielding, per non-blank row, a ``Prompt`` (messages ending with a user or tool
        turn, in SpecForge's role order; ``source`` is ``"path:line"``; ``notes`` say what the role
        normalisation changed; ``became`` what the prompt rule made of the row) or a
        ``Reject(source, reason)``. Bad rows never raise.

    Raises:
        DatasetError: at call time for an unknown format name, a bad ``fields`` mapping, a
            directory without data files or a glob matching none, or a (first) file that is missing,
            unreadable, not JSON lines / JSON / Parquet, or compressed and corrupt (a gzip CRC or zstd
            checksum that fails: no row of it is yielded); during iteration if a later shard is, or
            a Parquet file fails mid-read.
    """
    shards = list(path) if isinstance(path, Sequence) and not isinstance(path, str) else local_shards(path)
    named = path if isinstance(path, (str, Path)) else (shards[0].shown if shards else "(no files)")
    if format not in FORMATS:
        raise DatasetError(f"{named}: unknown format {format!r}; expected one of: {', '.join(FORMATS)}")
    _check_fields(named, fields)
    return _prompts(open_shards(shards, notes), format, dict(fields) if fields else None)


def open_shards(shards: Sequence[Shard], notes: list[str] | None = None) -> Iterator[Record | Reject]:
    """The rows of every shard in order; the first shard is opened (and checked) now, the others
    when reached (each raises :class:`DatasetError` then, as :func:`engine.datasets.readers.open_records`,
    which appends file-level problems to ``notes``)."""
    if not shards:
        return iter(())
    first = open_records(shards[0].path, shards[0].shown, notes)

    def rows() -> Iterator[Record | Reject]:
        yield from first
        for s in shards[1:]:
            yield from open_records(s.path, s.shown, notes)

    return rows()


def _check_fields(path: str | Path, fields: Mapping[str, str] | None) -> None:
    if fields is None:
        return
    if not isinstance(fields, Mapping):
        raise DatasetError(f"{path}: fields must be a mapping of canonical name -> column, got {type(fields).__name__}")
    for key, column in fields.items():
        if key not in FIELD_KEYS:
            raise DatasetError(
                f"{path}: unknown field mapping key {key!r}; expected keys from: {', '.join(sorted(FIELD_KEYS))}"
            )
        if not isinstance(column, str) or not column:
            raise DatasetError(f"{path}: field mapping {key!r} -> {column!r}: the column must be a non-empty string")


def _prompts(
    records: Iterator[Record | Reject], format: str, fields: dict[str, str] | None
) -> Iterator[Prompt | Reject]:
    for record in records:
        if isinstance(record, Reject):
            yield record
        else:
            source, row = record
            yield row_to_prompt(row, source, format, fields)


def rename_fields(row: dict[str, Any], fields: Mapping[str, str] | None) -> dict[str, Any]:
    """Return ``row`` with each canonical name in ``fields`` taken from its mapped source column.

    A mapped canonical name is absent from the result when its source column is absent.
    """
    if not fields:
        return row
    view = dict(row)
    for canonical, column in fields.items():
        if canonical != column:
            view.pop(canonical, None)
            if column in row:
                view[canonical] = row[column]
    return view


def row_to_prompt(row: Any, source: str, format: str, fields: Mapping[str, str] | None = None) -> Prompt | Reject:
    """Turn one parsed row into a ``Prompt`` or a ``Reject``; never raises for a bad row.

    Args:
        row: the parsed row (anything; a non-dict is rejected).
        source: ``"path:line"`` for the result.
        format: a key of :data:`ADAPTERS` or ``"auto"`` (detect per row).
        fields: canonical name -> source column renames (keys from :data:`FIELD_KEYS`).
    """
    if not isinstance(row, dict):
        return Reject(source, f"row is {kind_of(row)}, expected a JSON object")
    view = rename_fields(row, fields)
    name = detect_format(view) if format == "auto" else format
    if name is None:
        keys = ", ".join(repr(k) for k in list(row)[:12]) + (", ..." if len(row) > 12 else "")
        wrong = wrong_signature_type(view)
        if wrong is not None:
            return Reject(source, f"unrecognised row format: {wrong}")
        return Reject(source, f"unrecognised row format: keys [{keys}]; expected one of: {EXPECTED_KEYS}")
    try:
        conv, notes = normalise_conversation(ADAPTERS[name](view))
        messages, became = cut_prompt(conv)
        return Prompt.make(messages, conv.tools, source, notes, became)
    except MissingField as e:
        column = (fields or {}).get(e.name, e.name)
        mapped = f" (mapped to {e.name!r})" if column != e.name else ""
        return Reject(source, f"{name}: missing field {column!r}{mapped}")
    except AdapterError as e:
        return Reject(source, f"{name}: {e}")
    except UnicodeEncodeError:
        return Reject(source, f"{name}: text holds a lone surrogate escape (e.g. \\ud800), not encodable as UTF-8")
    except (TypeError, ValueError) as e:
        return Reject(source, f"{name}: value not JSON-serialisable: {e}")
