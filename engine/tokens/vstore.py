"""The ``validations`` table: one row per validated result, in the run's ``store.sqlite``.

Created here with ``CREATE TABLE IF NOT EXISTS`` (older run directories gain it on first use):

``validations(prompt_id PRIMARY KEY, dataset, key, provider, finish_reason, ok, reasons JSON,
notes JSON, prompt_len, completion_len, billed_completion, billing_diff, prompt_diff, tokenizer,
input_ids BLOB, created_at)``

- ``reasons`` / ``notes``: JSON lists (see :mod:`engine.tokens.validate`).
- ``billing_diff`` = completion_len - billed completion tokens (NULL when none were billed);
  ``prompt_diff`` likewise for the prompt.
- ``tokenizer``: the fingerprint of the tokenizer + settings that produced the row.
- ``input_ids``: prompt ids + completion ids as little-endian int32, zlib-compressed (level 1);
  the loss mask is ``prompt_len`` zeros then ``completion_len`` ones, so it is not stored.

A row is replaced when the record is validated again (``datagen validate`` after a tokenizer fix).
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import zlib
from array import array
from pathlib import Path
from typing import Any, Iterator

from engine.errors import DatagenError
from engine.storage.store import migrate
from engine.client.conformance import decode_flags
from engine.tokens.reconstruct import Reconstruction, Record
from engine.tokens.validate import Verdict

DDL = """
CREATE TABLE IF NOT EXISTS validations(
  prompt_id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, key TEXT NOT NULL, provider TEXT NOT NULL,
  finish_reason TEXT NOT NULL, ok INTEGER NOT NULL, reasons TEXT NOT NULL, notes TEXT NOT NULL,
  prompt_len INTEGER NOT NULL, completion_len INTEGER NOT NULL, billed_completion INTEGER NOT NULL,
  billing_diff INTEGER, prompt_diff INTEGER, tokenizer TEXT NOT NULL, input_ids BLOB NOT NULL,
  created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS validations_dataset ON validations(dataset, ok);
"""

_COLS = ("prompt_id, dataset, key, provider, finish_reason, ok, reasons, notes, prompt_len, completion_len, "
         "billed_completion, billing_diff, prompt_diff, tokenizer, input_ids, created_at")
_UPSERT = f"INSERT OR REPLACE INTO validations({_COLS}) VALUES({','.join('?' * 16)})"

assert array("i").itemsize == 4, "int32 arrays are needed for the input_ids blobs"
_SWAP = sys.byteorder != "little"


class NoStoreError(DatagenError):
    """``RUN_DIR`` has no ``store.sqlite``."""


def pack_ids(ids: list[int]) -> bytes:
    """``ids`` -> zlib(little-endian int32 bytes)."""
    a = array("i", ids)
    if _SWAP:
        a.byteswap()
    return zlib.compress(a.tobytes(), 1)


def unpack_ids(blob: bytes) -> list[int]:
    """Inverse of :func:`pack_ids`."""
    a = array("i")
    a.frombytes(zlib.decompress(blob))
    if _SWAP:
        a.byteswap()
    return a.tolist()


def connect(run_dir: Path) -> sqlite3.Connection:
    """Open the run's store read-write and make sure ``validations`` exists.

    Raises:
        NoStoreError: no store in ``run_dir``.
    """
    path = Path(run_dir) / "store.sqlite"
    if not path.exists():
        raise NoStoreError(f"{run_dir}: no store.sqlite (not a run directory)")
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=30000")
    conn.executescript(DDL)
    migrate(conn)  # a store written by an older datagen gains the columns read here
    return conn


def make_row(r: Record, rec: Reconstruction, v: Verdict, fingerprint: str, now: float | None = None) -> tuple:
    """The ``validations`` row of one record (column order of :data:`_COLS`)."""
    return (r.prompt_id, r.dataset, r.key, r.provider, r.finish_reason, int(v.ok), json.dumps(v.reasons),
            json.dumps(v.notes), v.prompt_len, v.completion_len, r.completion_tokens, v.billing_diff, v.prompt_diff,
            fingerprint, pack_ids(rec.prompt_ids + rec.completion_ids), now if now is not None else time.time())


def upsert(conn: sqlite3.Connection, rows: list[tuple]) -> None:
    """Insert or replace ``rows`` in one transaction."""
    if not rows:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(_UPSERT, rows)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def set_meta(conn: sqlite3.Connection, key: str, value: Any) -> None:
    """``meta[key] = json(value)`` (committed)."""
    conn.execute("INSERT INTO meta VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                 (key, json.dumps(value, sort_keys=True)))


def get_meta(conn: sqlite3.Connection, key: str) -> Any:
    """``json(meta[key])`` or None."""
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return None if row is None else json.loads(row[0])


# Tokens we counted or estimated ourselves (usage_source, engine.money.usage) are no billed figure to check
# the rebuilt lengths against: such records read as "no usage".
_BILLED = "CASE WHEN r.usage_source IN ('counted', 'estimated') THEN 0 ELSE r.{} END"
_SELECT = ("SELECT r.prompt_id, r.dataset, r.key, p.messages, p.tools, r.reasoning, r.content, r.tool_calls, "
           f"r.finish_reason, r.provider, {_BILLED.format('prompt_tokens')}, {_BILLED.format('completion_tokens')}, "
           f"{_BILLED.format('reasoning_tokens')}, r.wire_flags, r.token_ids FROM results r JOIN prompts p "
           "ON p.id = r.prompt_id")


def iter_records(conn: sqlite3.Connection, *, unvalidated_only: bool = False, batch: int = 256) -> Iterator[Record]:
    """Stored results as :class:`Record`, in prompt-id order (optionally only those not validated)."""
    where = " WHERE r.prompt_id NOT IN (SELECT prompt_id FROM validations)" if unvalidated_only else ""
    last = -1
    while True:
        sep = " AND" if where else " WHERE"
        rows = conn.execute(f"{_SELECT}{where}{sep} r.prompt_id > ? ORDER BY r.prompt_id LIMIT ?", (last, batch)).fetchall()
        if not rows:
            return
        for (pid, ds, key, msgs, tools, reasoning, content, tcs, fin, prov, pt, ct, rt, wf, tids) in rows:
            yield Record(prompt_id=pid, dataset=ds, key=key, messages=json.loads(msgs), tools=json.loads(tools),
                         reasoning=reasoning, content=content, tool_calls=json.loads(tcs), finish_reason=fin,
                         provider=prov, prompt_tokens=pt, completion_tokens=ct, reasoning_tokens=rt,
                         wire_flags=decode_flags(wf), token_ids=json.loads(tids) if tids else None)
        last = rows[-1][0]


def unvalidated_count(conn: sqlite3.Connection) -> int:
    """Results without a validation row."""
    (n,) = conn.execute("SELECT COUNT(*) FROM results WHERE prompt_id NOT IN (SELECT prompt_id FROM validations)").fetchone()
    return n
