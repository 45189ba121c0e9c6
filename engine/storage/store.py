"""The run's SQLite store, as the engine's loop uses it (aiosqlite, WAL): :class:`Store`.

One file per run, ``RUN_DIR/store.sqlite``; its tables, their columns and how an older store gains
the newer ones are in :mod:`engine.storage.schema`. :class:`Store` opens (creating and migrating) it
and holds the meta, dataset and runtime rows; its other methods come by concept: ingest
(:class:`~engine.storage.ingest.IngestQueries`), dispatch, commands and ``retry-failed``
(:class:`~engine.storage.dispatch.DispatchQueries`), what a restart loads back
(:class:`~engine.storage.resume.ResumeQueries`). Writes of the hot path go through
:class:`engine.storage.writer.StoreWriter` (batched commits). Other processes and commands read and
write through :mod:`engine.storage.handle` (synchronous).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiosqlite

from engine.storage.dispatch import DispatchQueries, PendingPrompt
from engine.storage.health import DamagedStoreError, check, is_damage
from engine.storage.ingest import IngestQueries
from engine.storage.offline import failed_filter
from engine.storage.resume import ResumeQueries
from engine.storage.schema import (
    ADDED_COLUMNS,
    DB_NAME,
    SCHEMA,
    SCHEMA_VERSION,
    StoreError,
    db_path,
    make_run_dir,
    migrate,
    migrate_sql,
    table_columns,
)

__all__ = ["ADDED_COLUMNS", "DB_NAME", "SCHEMA", "SCHEMA_VERSION", "PendingPrompt", "Store", "StoreError", "db_path",
           "failed_filter", "make_run_dir", "migrate", "migrate_sql", "table_columns"]


class Store(IngestQueries, DispatchQueries, ResumeQueries):
    """Async access to one run's store. Use :meth:`open`; all methods run on the aiosqlite thread."""

    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path

    @classmethod
    async def open(cls, run_dir: Path) -> "Store":
        """Open (creating if needed) the store of ``run_dir``. An existing store passes SQLite's
        ``integrity_check`` first (:func:`engine.storage.health.check`): nothing is written into a
        damaged one.

        Raises:
            DamagedStoreError: the file is damaged (SQLite's check, or an error of its own reading it).
            StoreError: the database has another schema version, or cannot be opened.
        """
        make_run_dir(run_dir)
        path = db_path(run_dir)
        new = not path.exists()
        if not new:
            await asyncio.to_thread(check, path, thorough=True)
        if new:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        pending = aiosqlite.connect(path, isolation_level=None)
        # The connection's worker thread must never keep the interpreter alive after the loop is gone
        # (an app torn down mid-run); SQLite's WAL keeps every commit atomic whatever happens.
        thread = getattr(pending, "_thread", None)
        if thread is not None and not thread.is_alive():
            thread.daemon = True
        conn = await pending
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=NORMAL")
            await conn.execute("PRAGMA busy_timeout=10000")
            await conn.executescript(SCHEMA)
            cols: dict[str, set[str]] = {}
            for t in {t for t, _, _ in ADDED_COLUMNS}:
                cols[t] = {r[1] for r in await (await conn.execute(f"PRAGMA table_info({t})")).fetchall()}
            for stmt in migrate_sql(cols):
                await conn.execute(stmt)
            cur = await conn.execute("SELECT value FROM meta WHERE key='schema_version'")
            row = await cur.fetchone()
            if row is None:
                await conn.execute("INSERT INTO meta VALUES('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreError(f"{path}: schema version {row[0]}, this datagen expects {SCHEMA_VERSION}")
            for extra in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):  # owner-only, WAL files too
                if extra.exists():
                    os.chmod(extra, 0o600)
        except sqlite3.DatabaseError as e:
            await conn.close()
            if is_damage(e):
                raise DamagedStoreError(path, str(e)) from None
            raise StoreError(f"{path}: not a usable store: {e}") from None
        except BaseException:
            await conn.close()
            raise
        return cls(conn, path)

    async def close(self) -> None:
        """Checkpoint the WAL and close; a damaged file is closed as it is (its ``-wal`` kept for
        ``datagen salvage``)."""
        try:
            await self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.DatabaseError as e:
            if not is_damage(e):
                raise
        finally:
            await self.conn.close()

    async def checkpoint(self) -> bool:
        """Copy the WAL into the database file without waiting for readers (``PASSIVE``); True when
        every committed transaction is now in the database file, fsynced (``synchronous=NORMAL``
        syncs it after a complete checkpoint), so a lost ``-wal`` file can no longer lose it. False
        when a reader holds an older snapshot, or the writer's transaction is open on this connection
        (SQLite refuses the checkpoint then: ``database table is locked``); the next one catches up."""
        try:
            cur = await self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            row = await cur.fetchone()
        except sqlite3.OperationalError:
            return False
        return row is not None and not row[0] and row[1] == row[2]  # (busy, frames in the WAL, copied)

    # ---- meta -------------------------------------------------------------------------------
    async def get_meta(self, key: str) -> str | None:
        """Return ``meta[key]`` or None."""
        cur = await self.conn.execute("SELECT value FROM meta WHERE key=?", (key,))
        row = await cur.fetchone()
        return None if row is None else row[0]

    async def set_meta(self, key: str, value: str) -> None:
        """Set ``meta[key]`` (committed at once)."""
        await self.conn.execute("INSERT INTO meta VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    # ---- datasets ---------------------------------------------------------------------------
    async def datasets(self) -> dict[str, dict[str, Any]]:
        """Return every dataset row as a dict, keyed by name."""
        self.conn.row_factory = aiosqlite.Row
        try:
            cur = await self.conn.execute("SELECT * FROM datasets ORDER BY position")
            return {r["name"]: dict(r) for r in await cur.fetchall()}
        finally:
            self.conn.row_factory = None

    async def register_dataset(self, name: str, position: int, path: str, token_budget: int | None) -> None:
        """Insert a dataset row or update its position/path/budget (state is kept), before its ingest:
        an earlier ingest's failure (``ingest_error``) is cleared."""
        await self.conn.execute(
            "INSERT INTO datasets(name, position, path, token_budget) VALUES(?,?,?,?) "
            "ON CONFLICT(name) DO UPDATE SET position=excluded.position, path=excluded.path, "
            "token_budget=excluded.token_budget, ingest_error=NULL",
            (name, position, path, token_budget),
        )

    async def fail_ingest(self, dataset: str, reason: str) -> None:
        """Record that the dataset's ingest failed (``reason``: the error), committed now: ``datagen
        status`` shows the dataset stopped with ``ingest failed: REASON`` until its next ingest starts."""
        await self.conn.execute("UPDATE datasets SET ingest_error=? WHERE name=?", (reason, dataset))

    async def record_stopped(self, reason: str) -> None:
        """Record, with no engine running, that the run stopped before its first request (e.g. a failed
        ingest): the ``runtime`` row's state ``stopped`` with ``reason``, no pid, its elapsed time and
        last live figures kept. The next start overwrites it."""
        await self.conn.execute(
            "INSERT INTO runtime(id, pid, heartbeat_at, state, state_reason, elapsed_s) VALUES(1, NULL, ?, 'stopped', ?, 0) "
            "ON CONFLICT(id) DO UPDATE SET pid=NULL, heartbeat_at=excluded.heartbeat_at, state='stopped', "
            "state_reason=excluded.state_reason", (time.time(), reason))

    async def set_dataset_state(self, name: str, state: str, reason: str, now: float) -> None:
        """Persist a dataset's control state (``active`` | ``paused`` | ``skipped``) and reason."""
        await self.conn.execute(
            "UPDATE datasets SET state=?, state_reason=?, updated_at=? WHERE name=?", (state, reason, now, name)
        )
