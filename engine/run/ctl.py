"""``datagen ctl``: control a run from another shell, through the store's ``commands`` table.

A live engine polls the table every second and applies commands in order through its
:class:`~engine.run.controller.Controller`, recording each result; ``ctl`` waits for that result. When
no engine is running, the persistent commands (pause/resume/skip a dataset, exclude/include a
provider) are applied to the store directly and honoured at the next start; the others (a run-wide
pause/resume, abort, concurrency) act only on a live run, so they are refused (``ok=False``) rather
than reported as done.

Provider names are checked before anything is queued: ``exclude-provider`` takes a provider this
run has seen (results and attempts in the store), one named in ``[provider.routing]`` (``order``,
``only``, ``ignore``) or one already excluded; spelling is matched case-insensitively.
``include-provider`` takes an excluded one.

``retry-failed [DATASET] [--reason CLASS]`` returns failed prompts to pending (all, one dataset's,
or those that failed with one error class): applied by the live engine, which sends them again, or
with no engine running written to the store at once, so the next ``datagen run`` sends them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from engine.report.status import StatusError, collect_status
from engine.storage.store import db_path, failed_filter

VERBS = ("pause", "resume", "skip", "abort", "concurrency", "exclude-provider", "include-provider", "retry-failed")
"""Every ``ctl`` verb."""


@dataclass(frozen=True)
class CtlResult:
    """What a ``ctl`` command did.

    Attributes:
        text: the result line shown to the user.
        ok: True when it was applied by the live engine or saved for the next start; False when it
            was refused (bad argument), not applied (no engine running, for a live-only verb) or
            not confirmed in time. ``datagen ctl`` exits 0 / 1 accordingly.
    """

    text: str
    ok: bool


def resolve_provider(name: str, known: Iterable[str], what: str = "provider") -> str:
    """Return the spelling of ``name`` among ``known`` (exact, else the one case-insensitive match).

    Raises:
        ValueError: ``name`` is empty or not among ``known``; the message lists the known names.
    """
    known = sorted(set(known), key=str.lower)
    if not name:
        raise ValueError(f"{what} name is empty")
    if name in known:
        return name
    folded = [k for k in known if k.lower() == name.lower()]
    if len(folded) == 1:
        return folded[0]
    listing = ", ".join(known) if known else "(none)"
    raise ValueError(f"unknown {what} {name!r}; known: {listing}")


def known_providers(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
    """``(known, excluded)`` provider names of the run in ``conn`` (see the module docstring)."""
    seen = {p for (p,) in conn.execute(
        "SELECT DISTINCT provider FROM results UNION SELECT DISTINCT provider FROM attempts") if p}
    row = conn.execute("SELECT value FROM meta WHERE key='excluded_providers'").fetchone()
    excluded = json.loads(row[0]) if row else []
    rt = conn.execute("SELECT live FROM runtime").fetchone()
    live = json.loads(rt[0]) if rt and rt[0] else {}
    routing = live.get("routing_providers") or []
    return sorted(seen | set(routing) | set(excluded), key=str.lower), list(excluded)


def _live_classes(conn: sqlite3.Connection) -> dict[str, dict]:
    rt = conn.execute("SELECT live FROM runtime").fetchone()
    live = json.loads(rt[0]) if rt and rt[0] else {}
    return {c["name"]: c for c in live.get("classes", []) if isinstance(c, dict) and "name" in c}


def _set_excluded(conn: sqlite3.Connection, excl: list[str]) -> None:
    conn.execute("INSERT INTO meta VALUES('excluded_providers', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                 (json.dumps(excl),))


def retry_failed_offline(conn: sqlite3.Connection, dataset: str | None, reason: str | None) -> int:
    """Return failed prompts (of ``dataset`` / with error class ``reason``; None: any) to pending in
    the store of ``conn`` (the caller holds the transaction); returns how many."""
    where, args = failed_filter(dataset, reason)
    return conn.execute(f"UPDATE prompts SET state='pending', error_class=NULL, error=NULL WHERE {where}",
                        args).rowcount


def _apply_offline(conn: sqlite3.Connection, verb: str, dataset: str | None, arg: str | None) -> CtlResult:
    now = time.time()
    names = [n for (n,) in conn.execute("SELECT name FROM datasets ORDER BY position")]
    if verb == "retry-failed":
        n = retry_failed_offline(conn, dataset, arg)
        what = f"{n} failed prompt(s){' (' + arg + ')' if arg else ''}{' of ' + dataset if dataset else ''}"
        if not n:
            return CtlResult(f"no failed prompts{' of ' + dataset if dataset else ''}"
                             f"{' with reason ' + arg if arg else ''}", True)
        conn.execute("INSERT INTO events(ts, level, kind, dataset, message) VALUES(?,?,?,?,?)",
                     (now, "info", "retry_failed", dataset, f"{what} returned to pending by retry-failed"))
        held = [(d, st) for d, st in conn.execute("SELECT name, state FROM datasets ORDER BY position")
                if st in ("paused", "skipped") and (dataset is None or d == dataset)]
        note = "".join(f"; {d} is {st}: `datagen ctl RUN_DIR resume {d}` too" for d, st in held)
        return CtlResult(f"{what} returned to pending: saved, the engine is not running; the next `datagen run` "
                         f"sends them{note}", True)
    if dataset is not None and verb in ("pause", "resume", "skip") and dataset not in names:
        return CtlResult(f"error: unknown dataset {dataset!r}; expected one of: {', '.join(names)}", False)
    if verb in ("pause", "resume", "skip") and dataset:
        state = {"pause": "paused", "resume": "active", "skip": "skipped"}[verb]
        reason = {"pause": "paused by user", "resume": "", "skip": "skipped by user"}[verb]
        conn.execute("UPDATE datasets SET state=?, state_reason=?, updated_at=? WHERE name=?", (state, reason, now, dataset))
        done = {"pause": "paused", "resume": "resumed", "skip": "skipped"}[verb]
        return CtlResult(f"{dataset} {done}: saved, the engine is not running; applies at the next start", True)
    if verb in ("exclude-provider", "include-provider") and arg:
        _, excl = known_providers(conn)
        if verb == "exclude-provider":
            if arg not in excl:
                excl.append(arg)
            _set_excluded(conn, excl)
            return CtlResult(f"provider {arg} excluded: saved, the engine is not running; applies at the next start",
                             True)
        excl.remove(arg)
        _set_excluded(conn, excl)
        return CtlResult(f"provider {arg} included again: saved, the engine is not running; applies at the next "
                         f"start", True)
    if verb == "abort":
        return CtlResult("not applied: the engine is not running, so nothing is in flight", False)
    if verb == "concurrency":
        return CtlResult(f"not applied: the engine is not running and concurrency is not saved; set "
                         f"[classes.{dataset}] concurrency in the config for the next start", False)
    what = "a run-wide pause" if verb == "pause" else "a run-wide resume"
    return CtlResult(f"not applied: the engine is not running and {what} is not saved (a run starts unpaused); "
                     f"name a DATASET to {verb} it at the next start", False)


def _check(conn: sqlite3.Connection, verb: str, dataset: str | None, arg: str | None, force: bool,
           alive: bool) -> tuple[str | None, CtlResult | None]:
    """Validate provider names, concurrency and retry-failed before queueing: ``(arg to send,
    refusal or None)``."""
    if verb == "retry-failed":
        names = [n for (n,) in conn.execute("SELECT name FROM datasets ORDER BY position")]
        if dataset is not None and dataset not in names:
            return arg, CtlResult(f"error: unknown dataset {dataset!r}; expected one of: {', '.join(names)}", False)
        if arg is not None:
            from engine.client.types import ErrorClass

            known = sorted({c.value for c in ErrorClass} | {c for (c,) in conn.execute(
                "SELECT DISTINCT error_class FROM prompts WHERE state='failed' AND error_class IS NOT NULL")})
            if arg not in known:
                return arg, CtlResult(f"error: unknown --reason {arg!r}; expected an error class: {', '.join(known)}",
                                      False)
        return arg, None
    if verb == "exclude-provider":
        known, _ = known_providers(conn)
        if force:
            return arg, None
        if not known:
            return arg, CtlResult(f"error: no provider is known to this run yet (none seen, none named in "
                                  f"[provider.routing]), so {arg!r} cannot be checked; pass --force to exclude it "
                                  f"anyway", False)
        try:
            return resolve_provider(arg or "", known), None
        except ValueError as e:
            return arg, CtlResult(f"error: {e} (--force excludes a name this run has not seen)", False)
    if verb == "include-provider":
        _, excl = known_providers(conn)
        try:
            if not excl:
                raise ValueError(f"provider {arg!r} is not excluded: no provider is excluded")
            return resolve_provider(arg or "", excl, what="excluded provider"), None
        except ValueError as e:
            return arg, CtlResult(f"error: {e}", False)
    if verb == "concurrency":
        try:
            n = int(arg or "")
        except ValueError:
            return arg, CtlResult(f"error: concurrency N must be a whole number, got {arg!r}", False)
        classes = _live_classes(conn) if alive else {}
        c = classes.get(dataset or "")
        if classes and c is None:
            return arg, CtlResult(f"error: unknown class {dataset!r}; expected one of: {', '.join(classes)}", False)
        if c is not None and c.get("max"):
            from engine.run.limiter import check_concurrency

            try:
                check_concurrency(dataset or "", n, int(c.get("configured") or 0))
            except ValueError as e:
                return arg, CtlResult(f"error: {e}", False)
        return str(n), None
    return arg, None


def send(run_dir: Path, verb: str, dataset: str | None = None, arg: str | None = None, *,
         wait_s: float = 10.0, force: bool = False) -> CtlResult:
    """Queue a command and return its result (waiting up to ``wait_s`` for a live engine).

    Args:
        run_dir: the run directory.
        verb: one of :data:`VERBS`; dataset: DATASET (or CLASS for ``concurrency``); arg: N for
            ``concurrency``, NAME for the provider verbs, ``"abort"`` for ``skip --abort``, the error
            class (``--reason``) for ``retry-failed``.
        wait_s: seconds to wait for the live engine to apply it.
        force: ``exclude-provider`` of a name this run has not seen.

    Raises:
        StatusError: no run store in ``run_dir``.
        ValueError: unknown verb.
    """
    if verb not in VERBS:
        raise ValueError(f"unknown command {verb!r}; expected one of {', '.join(VERBS)}")
    path = db_path(Path(run_dir))
    if not path.exists():
        raise StatusError(f"{run_dir}: no run store here (expected {path})")
    run = collect_status(Path(run_dir))["run"]
    # an engine whose run has ended reads no more commands (its dashboard may stay open): apply them offline
    alive = run["alive"] and run["state"] not in ("completed", "stopped")
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=10000")
        arg, refused = _check(conn, verb, dataset, arg, force, alive)
        if refused is not None:
            return refused
        if not alive:
            conn.execute("BEGIN IMMEDIATE")
            result = _apply_offline(conn, verb, dataset, arg)
            conn.execute("INSERT INTO commands(ts, verb, dataset, arg, done_at, result) VALUES(?,?,?,?,?,?)",
                         (time.time(), verb, dataset, arg, time.time(), result.text))
            conn.execute("COMMIT")
            return result
        cid = conn.execute("INSERT INTO commands(ts, verb, dataset, arg) VALUES(?,?,?,?)",
                           (time.time(), verb, dataset, arg)).lastrowid
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            row = conn.execute("SELECT done_at, result FROM commands WHERE id=?", (cid,)).fetchone()
            if row and row[0] is not None:
                return CtlResult(row[1], not row[1].startswith("error"))
            time.sleep(0.1)
        return CtlResult(f"not confirmed: queued (id {cid}) but the engine has not applied it within {wait_s:.0f}s; "
                         f"it applies when the engine next reads its commands", False)
    finally:
        conn.close()
