"""Whether a run's store can be read back: SQLite's own check before a command uses it, and the kind
of a SQLite error (a damaged file, or something else).

A store whose pages are damaged (a half-copied file, bytes overwritten, a disk fault) must never be
written to: SQLite may go on committing into it for a while, and the results bought into it cannot be
read back. :func:`check` runs ``PRAGMA integrity_check`` (``thorough``: ``datagen run`` and
``validate``, which write) or ``PRAGMA quick_check`` (the commands that read: ``status``, ``ctl``,
``export``, ``report``) and raises :class:`DamagedStoreError`, whose one-line message names the file
and what to do (restore a backup, or ``datagen salvage RUN_DIR``, :mod:`engine.storage.salvage`).

Cost, measured on a store of 80,000 results (1.75 GB: prompts, results, attempts, validations),
SQLite 3.40: ``quick_check`` 0.7 s and ``integrity_check`` 1.1 s with the file in the page cache,
7.4-7.7 s each from a cold cache (both read every page). A store not created yet (no file, or an
empty one: a run killed while creating it) is not checked.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from engine.storage.schema import StoreError

#: SQLite's primary result codes of a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB.
DAMAGE_CODES = (11, 26)


class DamagedStoreError(StoreError):
    """The store's file is damaged (SQLite reports it corrupt or not a database); ``path``: the file,
    ``detail``: SQLite's words (one line)."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path = Path(path)
        self.detail = " ".join(detail.split())
        super().__init__(damaged_message(self.path, self.detail))


def damaged_message(path: Path, detail: str) -> str:
    """The one line that refuses a damaged store: the file, SQLite's words, what to do."""
    run_dir = Path(path).parent
    return (f"{path} is damaged ({detail}): nothing is read from or written to it. Restore it from a backup, "
            f"or run `datagen salvage {run_dir}` to copy what is readable into a new store (the damaged file "
            f"is kept; results it cannot read are stored again from the journals or bought again at the next run)")


def is_damage(e: BaseException) -> bool:
    """Whether ``e`` is SQLite saying the file is damaged (``database disk image is malformed``,
    ``file is not a database``), as opposed to a busy, locked, full or read-only store."""
    if not isinstance(e, sqlite3.DatabaseError):
        return False
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in DAMAGE_CODES:
        return True
    msg = str(e).lower()
    return "malformed" in msg or "not a database" in msg or "corrupt" in msg


def problems(conn: sqlite3.Connection, *, thorough: bool) -> list[str]:
    """SQLite's own check of an open connection's database: ``integrity_check`` when ``thorough``,
    else ``quick_check`` (no index-to-table comparison); ``[]`` when it says ``ok``, else the problems it lists (it stops
    at 10).

    Raises:
        sqlite3.DatabaseError: the check itself could not read the file (damage raises here too).
    """
    rows = conn.execute(f"PRAGMA {'integrity_check' if thorough else 'quick_check'}(10)").fetchall()
    lines = [ln.strip() for r in rows if r and r[0] != "ok" for ln in str(r[0]).splitlines()]
    return [ln for ln in lines if ln and ln != "*** in database main ***"]


def summary(found: list[str]) -> str:
    """One line for :func:`problems`' findings: the first, and how many more."""
    first = " ".join(found[0].split())
    more = f"{len(found) - 1}{'+' if len(found) >= 10 else ''}"  # the check stops at 10
    return first + (f" (and {more} more problem(s))" if len(found) > 1 else "")


def check(path: Path, *, thorough: bool = False) -> None:
    """Check the store file ``path`` before a command uses it (see the module docstring); nothing to
    do when it does not exist yet or is empty.

    Raises:
        DamagedStoreError: SQLite finds the file damaged (unreadable, or its check lists problems).
        StoreError: the file cannot be opened or read for another reason (permissions, locked), in SQLite's words.
    """
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return
    except (FileNotFoundError, NotADirectoryError):  # no store (or RUN_DIR is a file): the command says so
        return
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as e:
        raise StoreError(f"{path}: cannot open the store ({e})") from None
    try:
        conn.execute("PRAGMA busy_timeout=10000")
        found = problems(conn, thorough=thorough)
    except sqlite3.DatabaseError as e:
        if is_damage(e):
            raise DamagedStoreError(path, str(e)) from None
        raise StoreError(f"{path}: cannot read the store ({e})") from None
    finally:
        conn.close()
    if found:
        raise DamagedStoreError(path, f"SQLite's {'integrity_check' if thorough else 'quick_check'}: {summary(found)}")


__all__ = ["DAMAGE_CODES", "DamagedStoreError", "check", "damaged_message", "is_damage", "problems", "summary"]
