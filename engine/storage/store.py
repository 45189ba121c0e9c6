"""The run's SQLite store: schema, ingest and dispatch queries (aiosqlite, WAL).

One file per run, ``RUN_DIR/store.sqlite``. Tables:

- ``meta``: schema version, run name, resolved special ids later on.
- ``datasets``: per dataset its position, ingest fingerprint, counts and persisted state
  (``paused`` / ``skipped`` survive a restart); ``revision``: the commit sha an ``hf://`` dataset was
  last ingested at (NULL for a local path); ``ingest_error``: why its last ingest failed (NULL when
  it did not; cleared when the next one starts).
- ``prompts``: one row per unique (dataset, key) with the messages and tools as JSON, the request
  class and ``state`` in ``pending | done | failed``. A prompt stays ``pending`` until its result
  or failure is committed, so a crash only ever re-requests prompts whose result was not stored.
  ``special_text``: the special-token texts typed in its messages (``special_text_in_prompt``,
  :mod:`engine.tokens.promptcheck`), NULL when none or not checked (no ``[tokenizer]``).
- ``results``: exactly one row per completed prompt (PRIMARY KEY prompt_id, UNIQUE dataset+key);
  ``usage_source`` says where its tokens and cost come from (:mod:`engine.money.usage`: ``reported`` |
  ``generation`` | ``counted`` | ``estimated``). Columns added since schema version 1 are added to
  older stores when they are opened for writing (:data:`ADDED_COLUMNS`, :func:`migrate_sql`).
- ``attempts``: one row per finished HTTP attempt (success or error class, status, message).
- ``rejects``: dataset rows that could not become prompts (file:line, reason).
- ``events``: run events (pauses, guards, fatal errors) for the log and the dashboard.
- ``commands``: control commands from other shells (``datagen ctl``), polled by the engine.
- ``runtime``: one row the live engine refreshes at every commit (pid, heartbeat, in-flight per
  dataset), so ``datagen status`` from another shell sees in-flight counts consistent with the
  committed rows.

Writes of the hot path go through :class:`engine.storage.writer.StoreWriter` (batched commits).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import aiosqlite

from engine.errors import DatagenError

SCHEMA_VERSION = 1
DB_NAME = "store.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS datasets(
  name TEXT PRIMARY KEY, position INTEGER NOT NULL, path TEXT NOT NULL, fingerprint TEXT,
  prompts INTEGER NOT NULL DEFAULT 0, rejected INTEGER NOT NULL DEFAULT 0,
  state TEXT NOT NULL DEFAULT 'active', state_reason TEXT NOT NULL DEFAULT '',
  token_budget INTEGER, updated_at REAL NOT NULL DEFAULT 0, revision TEXT, ingest_error TEXT);
CREATE TABLE IF NOT EXISTS prompts(
  id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, key TEXT NOT NULL, source TEXT NOT NULL,
  class TEXT NOT NULL, est_prompt_tokens INTEGER NOT NULL, messages TEXT NOT NULL, tools TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
  error_class TEXT, error TEXT, special_text TEXT, UNIQUE(dataset, key));
CREATE INDEX IF NOT EXISTS prompts_dispatch ON prompts(dataset, class, state, id);
CREATE TABLE IF NOT EXISTS results(
  prompt_id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, key TEXT NOT NULL,
  reasoning TEXT NOT NULL, content TEXT NOT NULL, tool_calls TEXT NOT NULL,
  finish_reason TEXT NOT NULL, native_finish_reason TEXT, provider TEXT NOT NULL, model TEXT NOT NULL,
  generation_id TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
  reasoning_tokens INTEGER NOT NULL, cost_usd REAL, latency_s REAL NOT NULL, ttft_s REAL,
  attempts INTEGER NOT NULL, created_at REAL NOT NULL, usage_source TEXT NOT NULL DEFAULT 'reported',
  wire_flags TEXT NOT NULL DEFAULT '', token_ids TEXT, UNIQUE(dataset, key));
CREATE INDEX IF NOT EXISTS results_recent ON results(dataset, created_at, completion_tokens, prompt_id);
CREATE INDEX IF NOT EXISTS results_usage ON results(dataset, prompt_tokens, completion_tokens, reasoning_tokens, cost_usd);
CREATE TABLE IF NOT EXISTS attempts(
  id INTEGER PRIMARY KEY, prompt_id INTEGER NOT NULL, dataset TEXT NOT NULL, n INTEGER NOT NULL,
  started_at REAL NOT NULL, ended_at REAL NOT NULL, outcome TEXT NOT NULL, error_class TEXT,
  status INTEGER, message TEXT, provider TEXT, generation_id TEXT,
  tokens_received INTEGER NOT NULL DEFAULT 0, cost_usd REAL);
CREATE INDEX IF NOT EXISTS attempts_dataset ON attempts(dataset, outcome, error_class);
CREATE TABLE IF NOT EXISTS rejects(
  id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, source TEXT NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, level TEXT NOT NULL, kind TEXT NOT NULL,
  dataset TEXT, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commands(
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, verb TEXT NOT NULL, dataset TEXT, arg TEXT,
  done_at REAL, result TEXT);
CREATE TABLE IF NOT EXISTS runtime(
  id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER, started_at REAL, heartbeat_at REAL,
  state TEXT, state_reason TEXT, elapsed_s REAL, live TEXT);
"""

#: Columns added to schema version 1 after its release: ``(table, column, SQL type and default)``.
#: Older stores get them (``ALTER TABLE ... ADD COLUMN``) when opened for writing; existing rows take
#: the default (results stored before ``usage_source`` existed count as ``reported``).
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("results", "usage_source", "TEXT NOT NULL DEFAULT 'reported'"),
    ("prompts", "special_text", "TEXT"),
    ("datasets", "revision", "TEXT"),
    ("datasets", "ingest_error", "TEXT"),
    ("results", "wire_flags", "TEXT NOT NULL DEFAULT ''"),
    ("results", "token_ids", "TEXT"),
)


def migrate_sql(columns: dict[str, set[str]]) -> list[str]:
    """The ``ALTER TABLE`` statements that bring a store with ``columns`` (``{table: column names}``,
    from ``PRAGMA table_info``) up to :data:`ADDED_COLUMNS` (empty when nothing is missing)."""
    return [f"ALTER TABLE {t} ADD COLUMN {c} {decl}" for t, c, decl in ADDED_COLUMNS
            if t in columns and c not in columns[t]]


def table_columns(conn: sqlite3.Connection, tables: Iterable[str] | None = None) -> dict[str, set[str]]:
    """``{table: column names}`` of an open (synchronous) connection, for ``tables`` (default: the
    tables of :data:`ADDED_COLUMNS`)."""
    names = set(tables) if tables is not None else {t for t, _, _ in ADDED_COLUMNS}
    return {t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")} for t in names}


def migrate(conn: sqlite3.Connection) -> None:
    """Add the missing :data:`ADDED_COLUMNS` to a store open read-write (synchronous connection)."""
    for stmt in migrate_sql(table_columns(conn)):
        conn.execute(stmt)



def failed_filter(dataset: str | None, error_class: str | None) -> tuple[str, list[str]]:
    """SQL ``WHERE`` clause and its arguments selecting the failed prompts of ``dataset`` that failed
    with ``error_class`` (None: any), for ``retry-failed`` (live and offline). Prompts failed as
    ``removed`` (their row left the dataset file, :meth:`Store.drop_stale`) are never retried: their
    messages are no longer what any row says."""
    where, args = "state='failed' AND COALESCE(error_class, '') != 'removed'", []
    if dataset is not None:
        where += " AND dataset=?"
        args.append(dataset)
    if error_class is not None:
        where += " AND error_class=?"
        args.append(error_class)
    return where, args

class StoreError(DatagenError):
    """The store cannot be opened or used (wrong schema version, not a run directory...)."""


@dataclass(frozen=True, slots=True)
class PendingPrompt:
    """A prompt fetched for dispatch.

    Attributes:
        id: row id (dispatch order within a dataset and class).
        dataset: dataset name.
        key: stable prompt key.
        cls: request class name.
        messages: OpenAI-shape messages.
        tools: OpenAI-shape tools (may be empty).
        attempts: attempts already made in earlier runs.
        est_prompt_tokens: estimated prompt length (tokens; characters / 4 + 4 per message).
    """

    id: int
    dataset: str
    key: str
    cls: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    attempts: int
    est_prompt_tokens: int = 0


def db_path(run_dir: Path) -> Path:
    """Path of the store inside ``run_dir``."""
    return Path(run_dir) / DB_NAME


def make_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` owner-only (0700); tighten it if it already exists and is ours."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.chmod(run_dir, 0o700)
    except PermissionError:
        pass


class Store:
    """Async access to one run's store. Use :meth:`open`; all methods run on the aiosqlite thread."""

    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path

    @classmethod
    async def open(cls, run_dir: Path) -> "Store":
        """Open (creating if needed) the store of ``run_dir``.

        Raises:
            StoreError: the database has another schema version or is not a SQLite file.
        """
        make_run_dir(run_dir)
        path = db_path(run_dir)
        new = not path.exists()
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
            raise StoreError(f"{path}: not a usable store: {e}") from None
        except BaseException:
            await conn.close()
            raise
        return cls(conn, path)

    async def close(self) -> None:
        """Checkpoint the WAL and close."""
        try:
            await self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            await self.conn.close()

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

    # ---- ingest -----------------------------------------------------------------------------
    async def ingest_batch(self, dataset: str, rows: Iterable[tuple[str, str, str, int, str, str, str | None]]) -> int:
        """Insert prompts ``(key, source, class, est_prompt_tokens, messages_json, tools_json, special_text)``
        (``special_text``: None, or the special-token texts found in the messages; a 6-tuple without
        it stores None).

        Existing (dataset, key) rows are left untouched (their state and results are kept).
        Returns the number of rows inserted.
        """
        rows = list(rows)
        if not rows:
            return 0
        before = self.conn.total_changes
        await self.conn.execute("BEGIN")
        await self.conn.executemany(
            "INSERT OR IGNORE INTO prompts(dataset, key, source, class, est_prompt_tokens, messages, tools, special_text) "
            "VALUES(?,?,?,?,?,?,?,?)",
            [(dataset, *r) if len(r) == 7 else (dataset, *r, None) for r in rows],
        )
        await self.conn.execute("COMMIT")
        return self.conn.total_changes - before

    async def replace_rejects(self, dataset: str, rejects: list[tuple[str, str]]) -> None:
        """Replace the dataset's reject list with ``(source, reason)`` rows."""
        await self.conn.execute("BEGIN")
        await self.conn.execute("DELETE FROM rejects WHERE dataset=?", (dataset,))
        await self.conn.executemany("INSERT INTO rejects(dataset, source, reason) VALUES(?,?,?)", [(dataset, s, r) for s, r in rejects])
        await self.conn.execute("COMMIT")

    async def drop_stale(self, dataset: str, keys: set[str]) -> tuple[int, int, int]:
        """After a re-read: the dataset's stored prompts whose key is not in ``keys`` (their row was
        edited, deleted, or is now rejected). Pending ones never sent are deleted (nothing was paid
        for them); pending ones with attempts become ``failed`` with error class ``removed`` (their
        billed attempts stay counted); done and failed ones are kept with their results.

        Returns:
            ``(deleted, marked_failed, kept_with_results)``.
        """
        cur = await self.conn.execute("SELECT id, key, state, attempts FROM prompts WHERE dataset=?", (dataset,))
        stale = [(i, st, a) for i, k, st, a in await cur.fetchall() if k not in keys]
        drop = [(i,) for i, st, a in stale if st == "pending" and not a]
        mark = [(i,) for i, st, a in stale if st == "pending" and a]
        if drop or mark:
            await self.conn.execute("BEGIN")
            await self.conn.executemany("DELETE FROM prompts WHERE id=?", drop)
            await self.conn.executemany(
                "UPDATE prompts SET state='failed', error_class='removed', error='its row is no longer in the "
                "dataset file (edited, deleted or now rejected); not sent again' WHERE id=?", mark)
            await self.conn.execute("COMMIT")
        return len(drop), len(mark), len(stale) - len(drop) - len(mark)

    async def finish_ingest(self, dataset: str, fingerprint: str, rejected: int, revision: str | None = None) -> int:
        """Record a completed ingest (``revision``: the commit sha of an ``hf://`` dataset, None for a
        local path); returns the dataset's prompt count."""
        cur = await self.conn.execute("SELECT COUNT(*) FROM prompts WHERE dataset=?", (dataset,))
        (n,) = await cur.fetchone()
        await self.conn.execute(
            "UPDATE datasets SET fingerprint=?, prompts=?, rejected=?, revision=? WHERE name=?",
            (fingerprint, n, rejected, revision, dataset),
        )
        return n

    async def reclassify(self, dataset: str, classify) -> None:
        """Recompute every prompt's class with ``classify(est_prompt_tokens) -> class``."""
        cur = await self.conn.execute("SELECT DISTINCT est_prompt_tokens, class FROM prompts WHERE dataset=?", (dataset,))
        changes = [(classify(t), dataset, t) for t, c in await cur.fetchall() if classify(t) != c]
        if changes:
            await self.conn.executemany("UPDATE prompts SET class=? WHERE dataset=? AND est_prompt_tokens=?", changes)

    async def prior_elapsed_s(self) -> float:
        """Run seconds accumulated by earlier processes of this run (0.0 for a new run)."""
        cur = await self.conn.execute("SELECT elapsed_s FROM runtime WHERE id=1")
        row = await cur.fetchone()
        return float(row[0] or 0.0) if row else 0.0

    # ---- dispatch ---------------------------------------------------------------------------
    async def fetch_pending(self, dataset: str, cls: str, after_id: int, limit: int) -> list[PendingPrompt]:
        """Return up to ``limit`` pending prompts of (dataset, class) with id > ``after_id``, by id."""
        cur = await self.conn.execute(
            "SELECT id, key, messages, tools, attempts, est_prompt_tokens FROM prompts "
            "WHERE dataset=? AND class=? AND state='pending' AND id>? ORDER BY id LIMIT ?",
            (dataset, cls, after_id, limit),
        )
        return [
            PendingPrompt(id=i, dataset=dataset, key=k, cls=cls, messages=json.loads(m), tools=json.loads(t),
                          attempts=a, est_prompt_tokens=e)
            for i, k, m, t, a, e in await cur.fetchall()
        ]

    async def prompt_states(self, refs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str, int]]:
        """``{(dataset, key): (prompt id, state, est_prompt_tokens)}`` of the prompts among ``refs``
        that exist (a stream worker's journal names its completions by dataset and key)."""
        by_ds: dict[str, list[str]] = {}
        for ds, key in refs:
            by_ds.setdefault(ds, []).append(key)
        out: dict[tuple[str, str], tuple[int, str, int]] = {}
        for ds, keys in by_ds.items():
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                cur = await self.conn.execute(
                    f"SELECT key, id, state, est_prompt_tokens FROM prompts WHERE dataset=? AND key IN "
                    f"({','.join('?' * len(part))})", (ds, *part))
                for key, pid, state, est in await cur.fetchall():
                    out[(ds, key)] = (pid, state, est)
        return out

    async def attempted_generations(self, generation_ids: Iterable[str]) -> set[str]:
        """The generation ids among ``generation_ids`` that already have an attempt row (its spend is
        counted there)."""
        ids = [g for g in set(generation_ids) if g]
        out: set[str] = set()
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            cur = await self.conn.execute(
                f"SELECT DISTINCT generation_id FROM attempts WHERE generation_id IN ({','.join('?' * len(part))})", part)
            out.update(g for (g,) in await cur.fetchall())
        return out

    async def recent_completion_tokens(self, dataset: str, limit: int = 2000) -> dict[str, list[int]]:
        """The last ``limit`` completion lengths (tokens) of a dataset per class, oldest first."""
        cur = await self.conn.execute(
            "SELECT p.class, r.completion_tokens FROM results r JOIN prompts p ON p.id = r.prompt_id "
            "WHERE r.dataset=? ORDER BY r.created_at DESC LIMIT ?", (dataset, limit))
        out: dict[str, list[int]] = {}
        for cls, n in await cur.fetchall():
            out.setdefault(cls, []).append(n)
        return {c: v[::-1] for c, v in out.items()}

    async def aborted_bills(self, limit: int = 2000) -> list[tuple[str, str, str, int, int, float]]:
        """The latest ``limit`` aborted attempts whose bill is known (a generation id and a cost, set by
        the ``/generation`` true-up): ``(dataset, class, provider, est_prompt_tokens, tokens_received,
        cost_usd)`` (tokens, USD), newest first."""
        cur = await self.conn.execute(
            "SELECT a.dataset, p.class, COALESCE(a.provider, ''), p.est_prompt_tokens, a.tokens_received, a.cost_usd "
            "FROM attempts a JOIN prompts p ON p.id = a.prompt_id WHERE a.outcome = 'aborted' "
            "AND a.cost_usd IS NOT NULL AND a.generation_id IS NOT NULL ORDER BY a.id DESC LIMIT ?", (limit,))
        return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]

    async def latest_results(self) -> dict[str, dict[str, Any]]:
        """The most recent stored result of each dataset that has one: ``{dataset: {key, reasoning,
        content, tool_names, finish_reason, provider, completion_tokens, prompt_tail}}`` (tool names
        from the stored OpenAI tool calls; ``prompt_tail``: the last prompt message's text)."""
        cur = await self.conn.execute(
            "SELECT r.dataset, r.key, r.reasoning, r.content, r.tool_calls, r.finish_reason, r.provider, "
            "r.completion_tokens, p.messages FROM results r JOIN prompts p ON p.id = r.prompt_id "
            "WHERE r.prompt_id IN (SELECT (SELECT prompt_id FROM results x WHERE x.dataset = d.name "
            "ORDER BY x.created_at DESC, x.prompt_id DESC LIMIT 1) FROM datasets d)")
        out: dict[str, dict[str, Any]] = {}
        for ds, key, reasoning, content, tools, finish, provider, ctok, messages in await cur.fetchall():
            try:
                names = [str((t.get("function") or {}).get("name", "?")) for t in json.loads(tools or "[]")]
                msgs = json.loads(messages or "[]")
            except (ValueError, AttributeError):
                names, msgs = [], []
            last = msgs[-1].get("content") if msgs and isinstance(msgs[-1], dict) else ""
            out[ds] = {"key": key, "reasoning": reasoning, "content": content, "tool_names": names,
                       "finish_reason": finish, "provider": provider, "completion_tokens": ctok,
                       "prompt_tail": last if isinstance(last, str) else ""}
        return out

    async def lost_costs(self) -> dict[str, float]:
        """USD billed for attempts that produced no result (failures, aborts), per dataset."""
        cur = await self.conn.execute(
            "SELECT dataset, SUM(cost_usd) FROM attempts WHERE outcome!='ok' AND cost_usd IS NOT NULL GROUP BY dataset")
        return {d: c or 0.0 for d, c in await cur.fetchall()}

    async def state_counts(self) -> dict[tuple[str, str, str], int]:
        """Return ``{(dataset, class, state): count}`` over all prompts."""
        cur = await self.conn.execute("SELECT dataset, class, state, COUNT(*) FROM prompts GROUP BY 1, 2, 3")
        return {(d, c, s): n for d, c, s, n in await cur.fetchall()}

    async def usage_totals(self) -> dict[str, tuple[int, int, int, float, int]]:
        """Return ``{dataset: (prompt_tokens, completion_tokens, reasoning_tokens, cost_usd, results)}``."""
        cur = await self.conn.execute(
            "SELECT dataset, SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens), "
            "SUM(COALESCE(cost_usd, 0)), COUNT(*) FROM results GROUP BY dataset"
        )
        return {d: (p or 0, c or 0, r or 0, cost or 0.0, n) for d, p, c, r, cost, n in await cur.fetchall()}

    async def usage_sources(self) -> dict[str, dict[str, int]]:
        """Return ``{dataset: {usage_source: results}}`` (see :mod:`engine.money.usage`)."""
        cur = await self.conn.execute("SELECT dataset, usage_source, COUNT(*) FROM results GROUP BY 1, 2")
        out: dict[str, dict[str, int]] = {}
        for d, s, n in await cur.fetchall():
            out.setdefault(d, {})[s] = n
        return out

    async def error_counts(self) -> dict[str, dict[str, int]]:
        """Return ``{dataset: {error_class: failed attempts}}``."""
        cur = await self.conn.execute(
            "SELECT dataset, error_class, COUNT(*) FROM attempts WHERE outcome='error' GROUP BY 1, 2"
        )
        out: dict[str, dict[str, int]] = {}
        for d, c, n in await cur.fetchall():
            out.setdefault(d, {})[c] = n
        return out

    async def pending_commands(self) -> list[tuple[int, str, str | None, str | None]]:
        """Return control commands not yet applied: ``(id, verb, dataset, arg)`` in order."""
        cur = await self.conn.execute("SELECT id, verb, dataset, arg FROM commands WHERE done_at IS NULL ORDER BY id")
        return list(await cur.fetchall())

    async def mark_command(self, cid: int, now: float, result: str) -> None:
        """Record that command ``cid`` was applied with ``result``."""
        await self.conn.execute("UPDATE commands SET done_at=?, result=? WHERE id=?", (now, result, cid))

    # ---- retry-failed -----------------------------------------------------------------------
    async def failed_counts(self, dataset: str | None = None) -> dict[str, int]:
        """Failed prompts of ``dataset`` (None: all) by error class, most first: ``{class: n}``."""
        cur = await self.conn.execute(
            "SELECT COALESCE(error_class, 'other'), COUNT(*) FROM prompts WHERE state='failed' "
            + ("AND dataset=? " if dataset is not None else "") + "GROUP BY 1 ORDER BY 2 DESC, 1",
            (dataset,) if dataset is not None else ())
        return {c: n for c, n in await cur.fetchall()}

    async def retry_failed(self, dataset: str | None = None, error_class: str | None = None) -> list[PendingPrompt]:
        """Return failed prompts to ``pending`` and return them, by id (``datagen ctl retry-failed``).

        Args:
            dataset: only this dataset's prompts (None: every dataset).
            error_class: only prompts that failed with this error class (``bad_request``,
                ``server``...; None: any).

        Their attempt counters are kept (``max_attempts`` applies per dispatch, not per prompt);
        the reason of the failure is cleared (the attempts table keeps every attempt's error).
        """
        where, args = failed_filter(dataset, error_class)
        cur = await self.conn.execute(
            f"SELECT id, dataset, key, class, messages, tools, attempts, est_prompt_tokens FROM prompts "
            f"WHERE {where} ORDER BY id", args)
        rows = await cur.fetchall()
        # One statement per row, each conditional on the row still being failed: safe beside the
        # writer's batched transactions on the same connection.
        await self.conn.executemany(
            "UPDATE prompts SET state='pending', error_class=NULL, error=NULL WHERE id=? AND state='failed'",
            [(r[0],) for r in rows])
        return [PendingPrompt(id=i, dataset=d, key=k, cls=c, messages=json.loads(m), tools=json.loads(t),
                              attempts=a, est_prompt_tokens=e) for i, d, k, c, m, t, a, e in rows]
