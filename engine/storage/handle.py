"""Synchronous access to a run's store from outside the engine's loop: ``datagen status``, the report,
exports, ``ctl`` with no engine running, validation and chained extraction.

:func:`connect_ro` / :func:`connect_rw` return a :class:`Handle`, opaque outside :mod:`engine.storage`:
callers pass it to this package's read and write functions (:mod:`engine.storage.read`,
:mod:`engine.storage.dollars`, :mod:`engine.storage.offline`, :mod:`engine.storage.validations`)
and get plain Python values back; they close it (or use it in a ``with`` block). Only this package
imports ``sqlite3`` (the ``storage-owns-sqlite`` import contract in ``pyproject.toml``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Iterator

from engine.storage.health import DamagedStoreError, is_damage
from engine.storage.schema import StoreError, db_path


class NoStoreError(StoreError):
    """The run directory has no readable store (``store.sqlite``)."""


class Handle:
    """An open run store (synchronous; read-only from :func:`connect_ro`, read-write from
    :func:`connect_rw`). Opaque: only :mod:`engine.storage` reads or writes through it."""

    __slots__ = ("_db", "path")

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_ro(run_dir: Path) -> Handle:
    """Open the run's store read-only (``mode=ro``: a live run may go on writing; WAL readers never
    block it).

    Raises:
        NoStoreError: no store in ``run_dir``.
    """
    path = db_path(Path(run_dir))
    if not path.exists():
        raise NoStoreError(f"{run_dir}: no run store here (expected {path})")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    conn.execute("PRAGMA busy_timeout=10000")
    return Handle(conn, path)


def connect_rw(run_dir: Path, *, timeout_s: float = 10.0, any_thread: bool = False,
               missing: str | None = None) -> Handle:
    """Open the run's store read-write in autocommit mode (each write commits at once unless inside
    :func:`transaction`), waiting up to ``timeout_s`` for a lock; ``any_thread``: usable from a
    thread other than the opener's (one at a time).

    Raises:
        NoStoreError: no store in ``run_dir`` (``missing``: the message, default as :func:`connect_ro`'s).
    """
    path = db_path(Path(run_dir))
    if not path.exists():
        raise NoStoreError(missing or f"{run_dir}: no run store here (expected {path})")
    conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None, check_same_thread=not any_thread)
    conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
    return Handle(conn, path)


@contextlib.contextmanager
def transaction(h: Handle) -> Iterator[None]:
    """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``; rolled back if the block raises)
    on a handle from :func:`connect_rw`."""
    h._db.execute("BEGIN IMMEDIATE")
    try:
        yield
        h._db.execute("COMMIT")
    except BaseException:
        h._db.execute("ROLLBACK")
        raise


def not_ready(h: Handle) -> str | None:
    """Why the store cannot be read yet (its tables are not all created: a run is starting, or one
    was killed while creating it), as SQLite says it; None when it can.

    Raises:
        engine.storage.health.DamagedStoreError: SQLite finds the file damaged (not a store being created).
    """
    try:
        h._db.execute("SELECT 1 FROM meta, datasets, prompts, results, attempts, runtime LIMIT 0")
    except sqlite3.DatabaseError as e:
        if is_damage(e):
            raise DamagedStoreError(h.path, str(e)) from None
        return str(e)
    return None


def get_meta(h: Handle, key: str) -> str | None:
    """``meta[key]`` as stored (text), or None."""
    row = h._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return None if row is None else row[0]


def set_meta(h: Handle, key: str, value: str) -> None:
    """``meta[key] = value`` (text; committed at once outside :func:`transaction`)."""
    h._db.execute("INSERT INTO meta VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))


def columns(h: Handle, table: str) -> set[str]:
    """The column names of ``table`` (a store older than a column lacks it until opened for writing)."""
    return {r[1] for r in h._db.execute(f"PRAGMA table_info({table})")}
