"""``datagen ctl``: control a run from another shell, through the store's ``commands`` table.

Each command is a :class:`~engine.run.commands.RunCommand`, applied by
:func:`engine.run.commands.apply` (the one command path the dashboard takes too). A live engine polls
the table every second and applies commands in order through its
:class:`~engine.run.controller.Controller`, recording each result and whether it was applied; ``ctl``
waits for that result. When no engine is running, the command is applied to the store
(:class:`OfflineTarget`): the persistent ones (pause/resume/skip a dataset, exclude/include a
provider) are saved and honoured at the next start; the others (a run-wide pause/resume, abort,
concurrency) act only on a live run, so they are not applied (``ok=False``) rather than reported as
done.

Provider names are checked before anything is queued: ``exclude-provider`` takes a provider this
run has seen (results and attempts in the store), one named in ``[provider.routing]`` (``order``,
``only``, ``ignore``) or one already excluded; spelling is matched case-insensitively.
``include-provider`` takes an excluded one.

``retry-failed [DATASET] [--reason CLASS]`` returns failed prompts to pending (all, one dataset's,
or those that failed with one error class): applied by the live engine, which sends them again, or
with no engine running written to the store at once, so the next ``datagen run`` sends them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

from engine.report.status import StatusError, collect_status
from engine.run.commands import VERBS, CommandResult, NotApplied, RunCommand, apply_sync
from engine.storage import offline, read, verdicts
from engine.storage.handle import Handle, connect_rw, transaction
from engine.storage.schema import db_path

CtlResult = CommandResult
"""What a ``ctl`` command did (:class:`~engine.run.commands.CommandResult`): ``text`` the line shown,
``ok`` True when it was applied by the live engine or saved for the next start, False when it was
refused (bad argument), not applied (no engine running, for a live-only verb) or not confirmed in
time. ``datagen ctl`` exits 0 / 1 accordingly."""


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


def known_providers(conn: Handle) -> tuple[list[str], list[str]]:
    """``(known, excluded)`` provider names of the run in ``conn`` (see the module docstring)."""
    seen = read.seen_providers(conn)
    excluded = read.excluded_providers(conn)
    routing = read.runtime_live(conn).get("routing_providers") or []
    return sorted(seen | set(routing) | set(excluded), key=str.lower), list(excluded)


def _live_classes(conn: Handle) -> dict[str, dict]:
    live = read.runtime_live(conn)
    return {c["name"]: c for c in live.get("classes", []) if isinstance(c, dict) and "name" in c}


def retry_failed_offline(conn: Handle, dataset: str | None, reason: str | None) -> int:
    """Return failed prompts (of ``dataset`` / with error class ``reason``; None: any) to pending in
    the store of ``conn`` (the caller holds the transaction); returns how many."""
    return offline.retry_failed(conn, dataset, reason)


class OfflineTarget:
    """The commands applied to the store of ``conn`` with no engine running (the caller holds the
    transaction): a :class:`~engine.run.commands.CommandTarget` for :func:`engine.run.commands.apply`.
    Dataset states and excluded providers are saved for the next start, failed prompts returned to
    pending; a run-wide pause or resume, an abort and a concurrency raise
    :class:`~engine.run.commands.NotApplied` (nothing saves them)."""

    SAVED = "saved, the engine is not running; applies at the next start"

    def __init__(self, conn: Handle) -> None:
        self.conn = conn
        self.now = time.time()

    def _control(self, verb: str, dataset: str | None) -> str:
        names = read.dataset_names(self.conn)
        if dataset is not None and dataset not in names:
            raise ValueError(f"unknown dataset {dataset!r}; expected one of: {', '.join(names)}")
        if not dataset:
            what = "a run-wide pause" if verb == "pause" else "a run-wide resume"
            raise NotApplied(f"not applied: the engine is not running and {what} is not saved (a run starts "
                             f"unpaused); name a DATASET to {verb} it at the next start")
        state = {"pause": "paused", "resume": "active", "skip": "skipped"}[verb]
        reason = {"pause": "paused by user", "resume": "", "skip": "skipped by user"}[verb]
        offline.set_dataset_state(self.conn, dataset, state, reason, self.now)
        done = {"pause": "paused", "resume": "resumed", "skip": "skipped"}[verb]
        return f"{dataset} {done}: {self.SAVED}"

    def pause(self, dataset: str | None = None) -> str:
        return self._control("pause", dataset)

    def resume(self, dataset: str | None = None) -> str:
        return self._control("resume", dataset)

    def skip(self, dataset: str, abort: bool = False) -> str:
        return self._control("skip", dataset)  # nothing is in flight to abort

    def abort(self, dataset: str | None = None) -> str:
        raise NotApplied("not applied: the engine is not running, so nothing is in flight")

    def set_concurrency(self, cls: str, n: int) -> str:
        raise NotApplied(f"not applied: the engine is not running and concurrency is not saved; set "
                         f"[classes.{cls}] concurrency in the config for the next start")

    def exclude_provider(self, name: str) -> str:
        if not name:
            raise ValueError("provider name is empty")
        _, excl = known_providers(self.conn)
        if name not in excl:
            excl.append(name)
        offline.set_excluded_providers(self.conn, excl)
        return f"provider {name} excluded: {self.SAVED}"

    def include_provider(self, name: str) -> str:
        _, excl = known_providers(self.conn)
        if name not in excl:
            raise ValueError(f"provider {name!r} is not excluded")
        excl.remove(name)
        offline.set_excluded_providers(self.conn, excl)
        return f"provider {name} included again: {self.SAVED}"

    def clear_verdict(self, name: str) -> str:
        n, was_excluded = verdicts.clear_provider(self.conn, name, self.now)
        if not n:
            raise ValueError(no_verdict_to_clear(name, verdicts.drifting_names(self.conn)))
        also = ""
        if was_excluded:
            _, excl = known_providers(self.conn)
            if name in excl:
                excl.remove(name)
                offline.set_excluded_providers(self.conn, excl)
                also = " and included again"
        offline.add_event(self.conn, self.now, "info", "fidelity", None, f"provider {name}: drifting verdict cleared by user")
        return f"provider {name}: drifting verdict cleared{also}: its records count again"

    def retry_failed(self, dataset: str | None = None, reason: str | None = None) -> str:
        n = retry_failed_offline(self.conn, dataset, reason)
        what = f"{n} failed prompt(s){' (' + reason + ')' if reason else ''}{' of ' + dataset if dataset else ''}"
        if not n:
            return f"no failed prompts{' of ' + dataset if dataset else ''}{' with reason ' + reason if reason else ''}"
        offline.add_event(self.conn, self.now, "info", "retry_failed", dataset,
                          f"{what} returned to pending by retry-failed")
        held = [(d, st) for d, st in read.dataset_states(self.conn)
                if st in ("paused", "skipped") and (dataset is None or d == dataset)]
        note = "".join(f"; {d} is {st}: `datagen ctl RUN_DIR resume {d}` too" for d, st in held)
        return (f"{what} returned to pending: saved, the engine is not running; the next `datagen run` "
                f"sends them{note}")


def no_verdict_to_clear(name: str, drifting: list[str]) -> str:
    """The refusal of ``clear-verdict NAME`` when ``name`` has no drifting verdict (names the ones that do)."""
    return (f"provider {name!r} has no drifting verdict to clear; drifting: {', '.join(drifting)}" if drifting
            else f"provider {name!r} has no drifting verdict to clear: no provider is drifting")


DATASET_STATE_VERBS = ("pause", "resume", "skip")
"""The verbs that change a dataset's state (or pause/resume the run): refused while the run is stopping."""


def _check(conn: Handle, verb: str, dataset: str | None, arg: str | None, force: bool,
           alive: bool) -> tuple[str | None, CommandResult | None]:
    """Validate provider names, concurrency and retry-failed before queueing: ``(arg to send,
    refusal or None)``."""
    if verb == "retry-failed":
        names = read.dataset_names(conn)
        if dataset is not None and dataset not in names:
            return arg, CommandResult.refused(f"unknown dataset {dataset!r}; expected one of: {', '.join(names)}")
        if arg is not None:
            from engine.client.types import ErrorClass

            known = sorted({c.value for c in ErrorClass} | read.failed_error_classes(conn))
            if arg not in known:
                return arg, CommandResult.refused(f"unknown --reason {arg!r}; expected an error class: "
                                                  f"{', '.join(known)}")
        return arg, None
    if verb == "exclude-provider":
        known, _ = known_providers(conn)
        if force:
            return arg, None
        if not known:
            return arg, CommandResult.refused(f"no provider is known to this run yet (none seen, none named in "
                                              f"[provider.routing]), so {arg!r} cannot be checked; pass --force "
                                              f"to exclude it anyway")
        try:
            return resolve_provider(arg or "", known), None
        except ValueError as e:
            return arg, CommandResult.refused(f"{e} (--force excludes a name this run has not seen)")
    if verb == "include-provider":
        _, excl = known_providers(conn)
        try:
            if not excl:
                raise ValueError(f"provider {arg!r} is not excluded: no provider is excluded")
            return resolve_provider(arg or "", excl, what="excluded provider"), None
        except ValueError as e:
            return arg, CommandResult.refused(f"{e}")
    if verb == "clear-verdict":
        drifting = verdicts.drifting_names(conn)
        try:
            return resolve_provider(arg or "", drifting, what="drifting provider"), None
        except ValueError:
            return arg, CommandResult.refused(no_verdict_to_clear(arg or "", drifting))
    if verb == "concurrency":
        try:
            n = int(arg or "")
        except ValueError:
            return arg, CommandResult.refused(f"concurrency N must be a whole number, got {arg!r}")
        classes = _live_classes(conn) if alive else {}
        c = classes.get(dataset or "")
        if classes and c is None:
            return arg, CommandResult.refused(f"unknown class {dataset!r}; expected one of: {', '.join(classes)}")
        if c is not None and c.get("max"):
            from engine.run.limiter import check_concurrency

            try:
                check_concurrency(dataset or "", n, int(c.get("configured") or 0))
            except ValueError as e:
                return arg, CommandResult.refused(f"{e}")
        return str(n), None
    return arg, None


def send(run_dir: Path, verb: str | RunCommand, dataset: str | None = None, arg: str | None = None, *,
         wait_s: float = 10.0, force: bool = False) -> CommandResult:
    """Apply a command: queued for the live engine (waiting up to ``wait_s`` for its result), or with
    no engine running applied to the store (:class:`OfflineTarget`).

    Args:
        run_dir: the run directory.
        verb: the :class:`~engine.run.commands.RunCommand` (what ``datagen ctl`` builds), or one of
            :data:`VERBS` with its row's operands: dataset: DATASET (or CLASS for ``concurrency``);
            arg: N for ``concurrency``, NAME for the provider verbs, ``"abort"`` for ``skip --abort``,
            the error class (``--reason``) for ``retry-failed``.
        wait_s: seconds to wait for the live engine to apply it.
        force: ``exclude-provider`` of a name this run has not seen.

    Returns:
        the result; refused (``error: the run is stopping: ...``) for pause, resume and skip while a
        live engine is stopping (its controller refuses them as well, should the state change after
        this check).

    Raises:
        StatusError: no run store in ``run_dir``.
        ValueError: unknown verb, or operands missing (:meth:`~engine.run.commands.RunCommand.from_row`).
    """
    if isinstance(verb, RunCommand):
        verb, dataset, arg = verb.to_row()
    if verb not in VERBS:
        raise ValueError(f"unknown command {verb!r}; expected one of {', '.join(VERBS)}")
    path = db_path(Path(run_dir))
    if not path.exists():
        raise StatusError(f"{run_dir}: no run store here (expected {path})")
    run = collect_status(Path(run_dir))["run"]
    # an engine whose run has ended reads no more commands (its dashboard may stay open): apply them offline
    alive = run["alive"] and run["state"] not in ("completed", "stopped")
    if alive and run["state"] == "stopping" and verb in DATASET_STATE_VERBS:  # its engine refuses them too
        target = dataset or "of the run"
        return CommandResult.refused(f"the run is stopping: {verb} {target} refused (dataset states no longer change "
                                     f"while it ends; once it has exited, `datagen ctl` saves one for the next start)")
    conn = connect_rw(Path(run_dir))
    try:
        arg, refused = _check(conn, verb, dataset, arg, force, alive)
        if refused is not None:
            return refused
        cmd = RunCommand.from_row(verb, dataset, arg)
        offline.add_missing_columns(conn)  # a store an older version wrote: its commands table gains ``ok``
        if not alive:
            with transaction(conn):
                result = apply_sync(cmd, OfflineTarget(conn))
                offline.record_command(conn, time.time(), *cmd.to_row(), time.time(), result.text, result.ok)
            return result
        cid = offline.queue_command(conn, time.time(), *cmd.to_row())
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            done = offline.command_result(conn, cid)
            if done is not None:
                text, ok = done
                return CommandResult(ok, text)
            time.sleep(0.1)
        return CommandResult(False, f"not confirmed: queued (id {cid}) but the engine has not applied it within "
                                    f"{wait_s:.0f}s; it applies when the engine next reads its commands")
    finally:
        conn.close()
