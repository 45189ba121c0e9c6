"""``datagen ctl``: control a run from another shell, through the store's ``commands`` table.

A live engine polls the table every second and applies commands in order through its
:class:`~engine.controller.Controller`, recording each result; ``ctl`` waits for that result. When
no engine is running, the persistent commands (pause/resume/skip a dataset, exclude a provider)
are applied to the store directly, so the next start honours them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from engine.status import StatusError, collect_status
from engine.store import db_path

VERBS = ("pause", "resume", "skip", "abort", "concurrency", "exclude-provider")


def _apply_offline(conn: sqlite3.Connection, verb: str, dataset: str | None, arg: str | None) -> str:
    now = time.time()
    names = [n for (n,) in conn.execute("SELECT name FROM datasets ORDER BY position")]
    if dataset is not None and verb in ("pause", "resume", "skip") and dataset not in names:
        return f"error: unknown dataset {dataset!r}; expected one of: {', '.join(names)}"
    if verb in ("pause", "resume", "skip") and dataset:
        state = {"pause": "paused", "resume": "active", "skip": "skipped"}[verb]
        reason = {"pause": "paused by user", "resume": "", "skip": "skipped by user"}[verb]
        conn.execute("UPDATE datasets SET state=?, state_reason=?, updated_at=? WHERE name=?", (state, reason, now, dataset))
        return f"{dataset} {state} (engine not running: applies at the next start)"
    if verb == "exclude-provider" and arg:
        row = conn.execute("SELECT value FROM meta WHERE key='excluded_providers'").fetchone()
        excl = json.loads(row[0]) if row else []
        if arg not in excl:
            excl.append(arg)
        conn.execute("INSERT INTO meta VALUES('excluded_providers', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                     (json.dumps(excl),))
        return f"provider {arg} excluded (engine not running: applies at the next start)"
    if verb == "abort":
        return "nothing in flight (engine not running)"
    return f"not applied: the engine is not running ({verb} only acts on a live run)"


def send(run_dir: Path, verb: str, dataset: str | None = None, arg: str | None = None, *,
         wait_s: float = 10.0) -> str:
    """Queue a command and return its result (waiting up to ``wait_s`` for a live engine).

    Raises:
        StatusError: no run store in ``run_dir``.
        ValueError: unknown verb.
    """
    if verb not in VERBS:
        raise ValueError(f"unknown command {verb!r}; expected one of {', '.join(VERBS)}")
    path = db_path(Path(run_dir))
    if not path.exists():
        raise StatusError(f"{run_dir}: no run store here (expected {path})")
    alive = collect_status(Path(run_dir))["run"]["alive"]
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=10000")
        if not alive:
            conn.execute("BEGIN IMMEDIATE")
            result = _apply_offline(conn, verb, dataset, arg)
            conn.execute("INSERT INTO commands(ts, verb, dataset, arg, done_at, result) VALUES(?,?,?,?,?,?)",
                         (time.time(), verb, dataset, arg, time.time(), result))
            conn.execute("COMMIT")
            return result
        cid = conn.execute("INSERT INTO commands(ts, verb, dataset, arg) VALUES(?,?,?,?)",
                           (time.time(), verb, dataset, arg)).lastrowid
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            row = conn.execute("SELECT done_at, result FROM commands WHERE id=?", (cid,)).fetchone()
            if row and row[0] is not None:
                return row[1]
            time.sleep(0.1)
        return f"queued (id {cid}); the engine has not applied it within {wait_s:.0f}s"
    finally:
        conn.close()
