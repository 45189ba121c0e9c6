"""The ``validations`` table (:data:`engine.storage.schema.VALIDATIONS_DDL`): validation's verdicts,
one row per validated result, and the reads of validated records (the validate report, the training
exports, chained extraction's readiness).

Rows are written and read as plain tuples; :mod:`engine.tokens.vstore` turns them into and from
records and verdicts. ``input_ids`` is stored as :func:`pack_ids` bytes.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import zlib
from array import array
from pathlib import Path
from typing import Iterator

from engine.storage.handle import Handle, NoStoreError, connect_rw, transaction
from engine.storage.schema import VALIDATIONS_DDL, StoreError, db_path, migrate

#: The columns of a ``validations`` row, in the order :func:`upsert` takes them.
COLUMNS = ("prompt_id, dataset, key, provider, finish_reason, ok, reasons, notes, prompt_len, completion_len, "
           "billed_completion, billing_diff, prompt_diff, tokenizer, input_ids, created_at")
_UPSERT = f"INSERT OR REPLACE INTO validations({COLUMNS}) VALUES({','.join('?' * 16)})"

assert array("i").itemsize == 4, "int32 arrays are needed for the input_ids blobs"
_SWAP = sys.byteorder != "little"


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


def open_validations(run_dir: Path) -> Handle:
    """Open the run's store read-write (usable from one other thread at a time) and make sure
    ``validations`` exists; a store written by an older datagen gains the columns read here.

    Raises:
        NoStoreError: no store in ``run_dir``.
    """
    h = connect_rw(run_dir, timeout_s=30.0, any_thread=True,
                   missing=f"{run_dir}: no store.sqlite (not a run directory)")
    h._db.executescript(VALIDATIONS_DDL)
    migrate(h._db)
    return h


def upsert(h: Handle, rows: list[tuple]) -> None:
    """Insert or replace ``rows`` (columns of :data:`COLUMNS`) in one transaction."""
    if not rows:
        return
    with transaction(h):
        h._db.executemany(_UPSERT, rows)


# Tokens we counted or estimated ourselves (usage_source, engine.money.usage; 'implausible': the provider's
# were not believed) are no billed figure to check
# the rebuilt lengths against: such records read as "no usage".
_BILLED = "CASE WHEN r.usage_source IN ('counted', 'estimated', 'implausible') THEN 0 ELSE r.{} END"
_RECORD = ("SELECT r.prompt_id, r.dataset, r.key, p.messages, p.tools, r.reasoning, r.content, r.tool_calls, "
           f"r.finish_reason, r.provider, {_BILLED.format('prompt_tokens')}, {_BILLED.format('completion_tokens')}, "
           f"{_BILLED.format('reasoning_tokens')}, r.wire_flags, r.token_ids FROM results r JOIN prompts p "
           "ON p.id = r.prompt_id")


def record_rows(h: Handle, *, unvalidated_only: bool = False, batch: int = 256) -> Iterator[tuple]:
    """Stored results to validate, in prompt-id order (optionally only those without a verdict):
    ``(prompt_id, dataset, key, messages, tools, reasoning, content, tool_calls, finish_reason, provider,
    billed prompt_tokens, billed completion_tokens, billed reasoning_tokens, wire_flags, token_ids)``
    (JSON columns as stored text; billed tokens 0 when datagen counted or estimated them)."""
    where = " WHERE r.prompt_id NOT IN (SELECT prompt_id FROM validations)" if unvalidated_only else ""
    last = -1
    while True:
        sep = " AND" if where else " WHERE"
        rows = h._db.execute(f"{_RECORD}{where}{sep} r.prompt_id > ? ORDER BY r.prompt_id LIMIT ?", (last, batch)).fetchall()
        if not rows:
            return
        yield from rows
        last = rows[-1][0]


def last_result_id(h: Handle) -> int:
    """The highest prompt id with a stored result (-1: none)."""
    (n,) = h._db.execute("SELECT COALESCE(MAX(prompt_id), -1) FROM results").fetchone()
    return int(n)


def has_validations(h: Handle) -> bool:
    """Whether the store has a ``validations`` table (nothing was validated in it otherwise)."""
    return h._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='validations'").fetchone() is not None


def unvalidated_count(h: Handle, dataset: str | None = None) -> int:
    """Results (of ``dataset``; None: all) without a validation row."""
    (n,) = h._db.execute(
        "SELECT COUNT(*) FROM results WHERE " + ("dataset=? AND " if dataset is not None else "")
        + "prompt_id NOT IN (SELECT prompt_id FROM validations)", () if dataset is None else (dataset,)).fetchone()
    return n


def validated_count(h: Handle, *, include_invalid: bool) -> int:
    """Validation rows (only the valid ones unless ``include_invalid``)."""
    (n,) = h._db.execute("SELECT COUNT(*) FROM validations" + ("" if include_invalid else " WHERE ok=1")).fetchone()
    return n


def verdict_rows(h: Handle) -> Iterator[tuple]:
    """Every verdict in prompt-id order: ``(prompt_id, dataset, key, provider, ok, reasons, notes, prompt_len,
    completion_len, billed_completion, billing_diff, prompt_diff)`` (``reasons`` / ``notes`` as JSON text)."""
    for row in h._db.execute(  # not `yield from` (see engine.storage.read.raw_rows)
            "SELECT prompt_id, dataset, key, provider, ok, reasons, notes, prompt_len, completion_len, "
            "billed_completion, billing_diff, prompt_diff FROM validations ORDER BY prompt_id"):
        yield row


#: ``meta`` key under which ``datagen run`` stores its settings at every start (the request classes'
#: ``max_tokens`` among them; :func:`engine.report.settings.run_settings` writes it).
SETTINGS_KEY = "run_settings"


def class_max_tokens(h: Handle) -> dict[str, int]:
    """Each request class's ``max_tokens`` as the run's latest start stored it (``meta[SETTINGS_KEY]``);
    ``{}`` when the run stored none (older run directories) or it cannot be read."""
    row = h._db.execute("SELECT value FROM meta WHERE key=?", (SETTINGS_KEY,)).fetchone()
    try:
        classes = json.loads(row[0]).get("classes", {}) if row is not None else {}
        return {str(n): int(c["max_tokens"]) for n, c in classes.items() if c.get("max_tokens")}
    except (ValueError, TypeError, AttributeError, KeyError):
        return {}


def cut_classes(h: Handle) -> dict[int, str]:
    """Prompt id -> request class of each validated record cut by ``finish_reason`` ``length``."""
    return {int(pid): cls for pid, cls in h._db.execute(
        "SELECT v.prompt_id, p.class FROM validations v JOIN prompts p ON p.id = v.prompt_id "
        "WHERE v.finish_reason = 'length'")}


def invalid_reasons(h: Handle, dataset: str | None = None) -> list[tuple[str | None, list[str]]]:
    """``(provider, failed checks)`` of each invalid record (of ``dataset``; None: all)."""
    rows = h._db.execute("SELECT provider, reasons FROM validations WHERE "
                         + ("dataset=? AND " if dataset is not None else "") + "ok=0",
                         () if dataset is None else (dataset,))
    return [(p, json.loads(rs)) for p, rs in rows]


def failed_models(h: Handle, reason: str) -> dict[str, int]:
    """``{model the response named: records}`` of the invalid records that failed ``reason``
    (``model_mismatch``: which models were served instead of the one asked for)."""
    out: dict[str, int] = {}
    for model, rs in h._db.execute("SELECT r.model, v.reasons FROM validations v JOIN results r "
                                   "ON r.prompt_id = v.prompt_id WHERE v.ok=0"):
        if reason in json.loads(rs):
            out[model] = out.get(model, 0) + 1
    return out


def billing_diffs(h: Handle) -> list[tuple[int, list[str]]]:
    """``(billing_diff, failed checks)`` of each record with a billing difference (tokens)."""
    return [(int(d), json.loads(rs)) for d, rs in h._db.execute(
        "SELECT billing_diff, reasons FROM validations WHERE billing_diff IS NOT NULL")]


def flagged_special_text(h: Handle) -> dict[str, int]:
    """Validated records per dataset whose prompt was flagged ``special_text_in_prompt`` at ingest
    (:mod:`engine.tokens.promptcheck`); ``{}`` for a store without the column."""
    if not any(r[1] == "special_text" for r in h._db.execute("PRAGMA table_info(prompts)")):
        return {}
    return {d: n for d, n in h._db.execute(
        "SELECT v.dataset, COUNT(*) FROM validations v JOIN prompts p ON p.id = v.prompt_id "
        "WHERE p.special_text IS NOT NULL GROUP BY v.dataset")}


def export_rows(h: Handle, dataset: str, include_invalid: bool) -> Iterator[tuple]:
    """``dataset``'s validated records (only the valid ones unless ``include_invalid``) in prompt-id
    order, 256 a query: ``(prompt_id, key, ok, prompt_len, completion_len, input_ids blob, provider,
    finish_reason, messages, tools, reasoning, content, tool_calls, model, endpoint, system_fingerprint,
    temperature, top_p, reasons, wire_flags)`` (JSON columns as stored text; the store migrated by
    :func:`open_validations`)."""
    sql = ("SELECT v.prompt_id, v.key, v.ok, v.prompt_len, v.completion_len, v.input_ids, v.provider, v.finish_reason, "
           "p.messages, p.tools, r.reasoning, r.content, r.tool_calls, r.model, r.endpoint, r.system_fingerprint, "
           "r.temperature, r.top_p, v.reasons, r.wire_flags FROM validations v "
           "JOIN results r ON r.prompt_id = v.prompt_id JOIN prompts p ON p.id = v.prompt_id "
           "WHERE v.dataset=?" + ("" if include_invalid else " AND v.ok=1") + " AND v.prompt_id > ? "
           "ORDER BY v.prompt_id LIMIT 256")
    last = -1
    while True:
        batch = h._db.execute(sql, (dataset, last)).fetchall()
        if not batch:
            return
        yield from batch
        last = batch[-1][0]


def readiness_counts(run_dir: Path, names: list[str]) -> dict[str, tuple[int, int, int, int]]:
    """``{dataset: (committed results, unvalidated, validated, invalid)}`` from the run's store,
    read-only (the generation's writer and validator keep writing; WAL readers never block them).

    Raises:
        StoreError: no store, or one without a ``validations`` table yet (SQLite's words).
    """
    try:
        conn = sqlite3.connect(f"file:{db_path(Path(run_dir))}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as e:
        raise StoreError(str(e)) from e
    try:
        out = {}
        for n in names:
            (committed,) = conn.execute("SELECT COUNT(*) FROM results WHERE dataset=?", (n,)).fetchone()
            validated, invalid = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(ok=0), 0) FROM validations WHERE dataset=?", (n,)).fetchone()
            (unvalidated,) = conn.execute(
                "SELECT COUNT(*) FROM results r WHERE r.dataset=? AND NOT EXISTS "
                "(SELECT 1 FROM validations v WHERE v.prompt_id = r.prompt_id)", (n,)).fetchone()
            out[n] = (committed, unvalidated, validated, invalid)
        return out
    except sqlite3.Error as e:
        raise StoreError(str(e)) from e
    finally:
        conn.close()


__all__ = ["COLUMNS", "NoStoreError", "billing_diffs", "export_rows", "flagged_special_text", "has_validations",
           "invalid_reasons", "open_validations", "pack_ids", "readiness_counts", "record_rows", "unpack_ids",
           "unvalidated_count", "upsert", "validated_count", "verdict_rows"]


def provider_counts(h: Handle, include_invalid: bool = False) -> dict[str, int]:
    """``{provider: validated records}`` (valid ones only unless ``include_invalid``): what a training
    export would write per provider."""
    sql = "SELECT provider, COUNT(*) FROM validations" + ("" if include_invalid else " WHERE ok=1") + " GROUP BY provider"
    return {p: n for p, n in h._db.execute(sql)}
