"""Writes to a run's store from another shell (``datagen ctl``): the ``commands`` queue a live engine
polls, and with no engine running the persistent commands applied to the store directly (inside one
:func:`engine.storage.handle.transaction`), honoured at the next start.
"""

from __future__ import annotations

import json

from engine.storage.handle import Handle, set_meta
from engine.storage.schema import migrate


def failed_filter(dataset: str | None, error_class: str | None) -> tuple[str, list[str]]:
    """SQL ``WHERE`` clause and its arguments selecting the failed prompts of ``dataset`` that failed
    with ``error_class`` (None: any), for ``retry-failed`` (live and offline). Prompts failed as
    ``removed`` (their row left the dataset file, :meth:`engine.storage.store.Store.drop_stale`) are
    never retried: their messages are no longer what any row says."""
    where, args = "state='failed' AND COALESCE(error_class, '') != 'removed'", []
    if dataset is not None:
        where += " AND dataset=?"
        args.append(dataset)
    if error_class is not None:
        where += " AND error_class=?"
        args.append(error_class)
    return where, args


def retry_failed(h: Handle, dataset: str | None, error_class: str | None) -> int:
    """Return failed prompts (of ``dataset`` / with ``error_class``; None: any) to pending, their
    failure's reason cleared (the attempts keep every error); returns how many."""
    where, args = failed_filter(dataset, error_class)
    return h._db.execute(f"UPDATE prompts SET state='pending', error_class=NULL, error=NULL WHERE {where}", args).rowcount


def set_dataset_state(h: Handle, name: str, state: str, reason: str, now: float) -> None:
    """Persist a dataset's control state (``active`` | ``paused`` | ``skipped``) and reason."""
    h._db.execute("UPDATE datasets SET state=?, state_reason=?, updated_at=? WHERE name=?", (state, reason, now, name))


def set_excluded_providers(h: Handle, names: list[str]) -> None:
    """``meta['excluded_providers']`` = ``names`` (JSON)."""
    set_meta(h, "excluded_providers", json.dumps(names))


def add_event(h: Handle, ts: float, level: str, kind: str, dataset: str | None, message: str) -> None:
    """Record a run event (the log and the dashboard show it)."""
    h._db.execute("INSERT INTO events(ts, level, kind, dataset, message) VALUES(?,?,?,?,?)",
                  (ts, level, kind, dataset, message))


def add_missing_columns(h: Handle) -> None:
    """Bring a store an older version wrote up to the current columns before ``ctl`` writes to it
    (:func:`engine.storage.schema.migrate`; nothing to do once an engine of this version opened it)."""
    migrate(h._db)


def record_command(h: Handle, ts: float, verb: str, dataset: str | None, arg: str | None, done_at: float,
                   result: str, ok: bool) -> None:
    """Record a command handled with no engine running (done at ``done_at`` with ``result``; ``ok``: applied)."""
    h._db.execute("INSERT INTO commands(ts, verb, dataset, arg, done_at, result, ok) VALUES(?,?,?,?,?,?,?)",
                  (ts, verb, dataset, arg, done_at, result, int(ok)))


def queue_command(h: Handle, ts: float, verb: str, dataset: str | None, arg: str | None) -> int:
    """Queue a command for the live engine; returns its id."""
    cid = h._db.execute("INSERT INTO commands(ts, verb, dataset, arg) VALUES(?,?,?,?)", (ts, verb, dataset, arg)).lastrowid
    assert cid is not None
    return cid


def command_result(h: Handle, cid: int) -> tuple[str, bool] | None:
    """``(result, ok)`` the engine recorded for command ``cid``, None while it is not handled."""
    row = h._db.execute("SELECT done_at, result, ok FROM commands WHERE id=?", (cid,)).fetchone()
    return (row[1], bool(row[2])) if row and row[0] is not None else None
