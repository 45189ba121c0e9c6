"""Validation's verdicts in the run's store: records in, ``validations`` rows out.

The table (its columns, ``input_ids`` packing) and every query on it belong to
:mod:`engine.storage.validations` (:data:`engine.storage.schema.VALIDATIONS_DDL`); this module turns
stored results into :class:`~engine.tokens.reconstruct.Record` and verdicts into rows. A row is
replaced when the record is validated again (``datagen validate`` after a tokenizer fix).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

from engine.client.conformance import decode_flags
from engine.storage import validations
from engine.storage.handle import Handle, NoStoreError
from engine.storage.handle import get_meta as _get_meta
from engine.storage.handle import set_meta as _set_meta
from engine.storage.validations import pack_ids, unpack_ids
from engine.tokens.reconstruct import Reconstruction, Record
from engine.tokens.validate import Verdict

__all__ = ["NoStoreError", "connect", "get_meta", "iter_records", "make_row", "pack_ids", "set_meta", "unpack_ids",
           "unvalidated_count", "upsert"]


def connect(run_dir: Path) -> Handle:
    """Open the run's store read-write and make sure ``validations`` exists
    (:func:`engine.storage.validations.open_validations`).

    Raises:
        NoStoreError: no store in ``run_dir``.
    """
    return validations.open_validations(run_dir)


def make_row(r: Record, rec: Reconstruction, v: Verdict, fingerprint: str, now: float | None = None) -> tuple:
    """The ``validations`` row of one record (column order of :data:`engine.storage.validations.COLUMNS`)."""
    return (r.prompt_id, r.dataset, r.key, r.provider, r.finish_reason, int(v.ok), json.dumps(v.reasons),
            json.dumps(v.notes), v.prompt_len, v.completion_len, r.completion_tokens, v.billing_diff, v.prompt_diff,
            fingerprint, pack_ids(rec.prompt_ids + rec.completion_ids), now if now is not None else time.time())


def upsert(conn: Handle, rows: list[tuple]) -> None:
    """Insert or replace ``rows`` in one transaction."""
    validations.upsert(conn, rows)


def set_meta(conn: Handle, key: str, value: Any) -> None:
    """``meta[key] = json(value)`` (committed)."""
    _set_meta(conn, key, json.dumps(value, sort_keys=True))


def get_meta(conn: Handle, key: str) -> Any:
    """``json(meta[key])`` or None."""
    value = _get_meta(conn, key)
    return None if value is None else json.loads(value)


def iter_records(conn: Handle, *, unvalidated_only: bool = False, batch: int = 256) -> Iterator[Record]:
    """Stored results as :class:`Record`, in prompt-id order (optionally only those not validated).
    Tokens datagen counted or estimated itself (``usage_source``) read as no usage: they are no
    billed figure to check the rebuilt lengths against."""
    for (pid, ds, key, msgs, tools, reasoning, content, tcs, fin, prov, pt, ct, rt, wf, tids) in validations.record_rows(
            conn, unvalidated_only=unvalidated_only, batch=batch):
        yield Record(prompt_id=pid, dataset=ds, key=key, messages=json.loads(msgs), tools=json.loads(tools),
                     reasoning=reasoning, content=content, tool_calls=json.loads(tcs), finish_reason=fin,
                     provider=prov, prompt_tokens=pt, completion_tokens=ct, reasoning_tokens=rt,
                     wire_flags=decode_flags(wf), token_ids=json.loads(tids) if tids else None)


def unvalidated_count(conn: Handle) -> int:
    """Results without a validation row."""
    return validations.unvalidated_count(conn)
